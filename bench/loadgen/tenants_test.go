package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/workload"
)

// tenantServer answers by the request's first user message: "hold-headers" sends nothing
// until the client leaves; "hold" sends the 200 headers, then nothing until the client leaves;
// "late" sends its first token at once and the rest after lateRest; "refuse-code" answers
// 429 with an OpenAI error whose code is queue_full; "refuse-type" 503 with only a type;
// "broken" 500; anything else streams one token. Every request's headers are kept, and gone
// is closed for each request whose client left.
type tenantServer struct {
	mu       sync.Mutex
	headers  []http.Header
	gone     chan string
	lateRest time.Duration
}

func (s *tenantServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Messages []struct{ Content string } `json:"messages"`
	}
	raw, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(raw, &body)
	what := ""
	for _, m := range body.Messages {
		what = m.Content
	}
	s.mu.Lock()
	s.headers = append(s.headers, r.Header.Clone())
	s.mu.Unlock()
	fl := w.(http.Flusher)
	token := func(text string) {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", text)
		fl.Flush()
	}
	end := func() {
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\ndata: [DONE]\n\n")
	}
	switch what {
	case "hold-headers":
		<-r.Context().Done()
		s.gone <- what
		return
	case "hold":
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fl.Flush()
		<-r.Context().Done()
		s.gone <- what
		return
	case "refuse-code":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(429)
		fmt.Fprint(w, `{"error":{"message":"queued too long","type":"rate_limit_error","param":null,"code":"queue_full"}}`)
		return
	case "refuse-type":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(503)
		fmt.Fprint(w, `{"error":{"message":"saturated","type":"overloaded","code":null}}`)
		return
	case "broken":
		http.Error(w, "boom", 500)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	token("a")
	if what == "late" {
		time.Sleep(s.lateRest) // the pause the test is about: the rest comes after the client's patience
	}
	token(" b")
	end()
}

func newTenantServer(t *testing.T) (*tenantServer, *Client) {
	s := &tenantServer{gone: make(chan string, 16), lateRest: time.Second}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, &Client{Base: ts.URL, Model: "m", HTTP: NewHTTPClient(4)}
}

func ask(c *Client, what string, patience time.Duration) Result {
	return c.Do(context.Background(), Request{API: workload.Chat, MaxTokens: 2, Patience: patience,
		Messages: []workload.Message{{Role: "user", Content: what}}}, time.Now())
}

func TestPatienceExpiresAndCancels(t *testing.T) {
	s, c := newTenantServer(t)
	for _, what := range []string{"hold-headers", "hold"} {
		r := ask(c, what, 50*time.Millisecond)
		if !r.Expired || r.Err != ExpiredReason || r.Class() != Expired || r.TTFT != 0 {
			t.Fatalf("%s: expired %v, err %q, class %v, TTFT %v", what, r.Expired, r.Err, r.Class(), r.TTFT)
		}
		if r.E2E < 50*time.Millisecond {
			t.Fatalf("%s: gave up after %v, before its patience", what, r.E2E)
		}
		select {
		case got := <-s.gone:
			if got != what {
				t.Fatalf("server saw %q leave, want %q", got, what)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the client gave up but the server never saw it leave", what)
		}
	}
}

func TestPatienceEndsAtFirstToken(t *testing.T) {
	_, c := newTenantServer(t)
	// The first token comes at once; the rest a second later, past the 300 ms patience: a
	// client that has its first token reads to the end.
	r := ask(c, "late", 300*time.Millisecond)
	if r.Class() != Completed || r.Expired || r.OutputTokens != 2 || r.E2E < time.Second {
		t.Fatalf("class %v, expired %v, err %q, output %d, E2E %v", r.Class(), r.Expired, r.Err, r.OutputTokens, r.E2E)
	}
	// Without patience nothing expires.
	if r := ask(c, "ok", 0); r.Class() != Completed || r.CachedTokens != 3 {
		t.Fatalf("no patience: class %v, err %q", r.Class(), r.Err)
	}
}

func TestRefusalsByReason(t *testing.T) {
	_, c := newTenantServer(t)
	for _, tc := range []struct {
		what   string
		class  Class
		status int
		code   string
	}{
		{"refuse-code", Refused, 429, "queue_full"},
		{"refuse-type", Refused, 503, "overloaded"},
		{"broken", Failed, 500, ""},
		{"ok", Completed, 200, ""},
	} {
		r := ask(c, tc.what, time.Minute)
		if r.Class() != tc.class || r.Status != tc.status || r.ErrorCode != tc.code || r.Expired {
			t.Errorf("%s: class %v status %d code %q expired %v, want %v %d %q", tc.what, r.Class(), r.Status, r.ErrorCode, r.Expired, tc.class, tc.status, tc.code)
		}
	}
}

// A workload's tenants mark their requests with their headers and give up after their
// patience divided by the speedup; every request is counted once, under its tenant.
func TestRunMarksTenants(t *testing.T) {
	s, c := newTenantServer(t)
	chat := &workload.Tenant{Name: "chat", APIKey: "k1", FairnessID: "f1", Objective: "o1", Priority: 2, Patience: time.Hour}
	batch := &workload.Tenant{Name: "batch", APIKey: "k2", FairnessID: "f2", Objective: "o2", Priority: 0, Patience: 400 * time.Millisecond}
	w := &workload.Workload{Name: "t", API: workload.Chat, Loop: workload.Open, Tenants: []*workload.Tenant{chat, batch},
		Conversations: []*workload.Conversation{
			{ID: 0, Tenant: chat, Turns: []workload.Turn{{User: "ok", MaxTokens: 2}, {User: "ok", MaxTokens: 2}}},
			{ID: 1, Tenant: batch, Turns: []workload.Turn{{User: "hold", MaxTokens: 2}}},
		}}
	out, err := Run(context.Background(), w, Options{Client: c, Speedup: 4})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]Class{}
	for _, r := range out.Results {
		got[r.Tenant] = append(got[r.Tenant], r.Class())
		if r.Tenant == "batch" && (r.E2E < 100*time.Millisecond || r.E2E > 30*time.Second) {
			t.Errorf("batch gave up after %v; its patience is 400 ms of model time, 100 ms at speedup 4", r.E2E)
		}
	}
	if fmt.Sprint(got["chat"]) != fmt.Sprint([]Class{Completed, Completed}) || fmt.Sprint(got["batch"]) != fmt.Sprint([]Class{Expired}) {
		t.Fatalf("classes by tenant %v", got)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var seen []string
	for _, h := range s.headers {
		seen = append(seen, strings.Join([]string{h.Get("Authorization"), h.Get(workload.HeaderFairnessID),
			h.Get(workload.HeaderObjective), h.Get(workload.HeaderFlow), h.Get(workload.HeaderPriority)}, ","))
	}
	want := map[string]int{"Bearer k1,f1,o1,f1,2": 2, "Bearer k2,f2,o2,f2,0": 1}
	counts := map[string]int{}
	for _, x := range seen {
		counts[x]++
	}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Fatalf("headers seen %v, want %v", counts, want)
	}
}
