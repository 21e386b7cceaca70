package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// recorder is a 127.0.0.1 forwarder in front of a sim replica that keeps every request body in
// arrival order and streams the replica's answer back as it comes.
type recorder struct {
	target string
	mu     sync.Mutex
	bodies []chatRequest
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	var body chatRequest
	if err := json.Unmarshal(b, &body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	rc.mu.Lock()
	rc.bodies = append(rc.bodies, body)
	rc.mu.Unlock()
	resp, err := http.Post(rc.target+r.URL.Path, "application/json", bytes.NewReader(b))
	if err != nil {
		http.Error(w, err.Error(), 502)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			w.(http.Flusher).Flush()
		}
		if rerr != nil {
			return
		}
	}
}

// TestAgenticAgainstSim sends a small agentic workload (every session forks a sub-agent) to one
// real sim replica and checks what an agent's requests must be: each request's messages start
// with the previous request's, followed by the reply with the workload's tool call and a tool
// message with its result; the replica reports the previous prompt as cached; a sub-agent
// starts with its parent's messages at the fork and the parent's next request waits for it.
func TestAgenticAgainstSim(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Speedup = 50
	cluster, err := sim.StartCluster(cfg, 1, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	rec := &recorder{target: cluster.URLs()[0]}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rec, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	p := workload.DefaultAgentic()
	p.Sessions, p.Rate, p.Requests, p.RequestsSigma = 2, 50, 6, 0
	p.PrefixTokens, p.FirstUserTokens, p.ContextTokens = 2000, 100, 6000
	p.Think, p.ThinkMin, p.ThinkMax = 5*time.Millisecond, time.Millisecond, 10*time.Millisecond
	p.OutputTokens, p.MaxOutput, p.SubAgentFraction, p.SubAgentRequests = 8, 16, 1, 3
	w, err := workload.Agentic(p)
	if err != nil {
		t.Fatal(err)
	}
	client := &Client{Base: "http://" + ln.Addr().String(), Model: cfg.Model, IgnoreEOS: true, HTTP: NewHTTPClient(8)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := Run(ctx, w, Options{Client: client, RequestTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Results) != w.Requests() {
		t.Fatalf("%d results, want %d", len(out.Results), w.Requests())
	}
	res := map[[2]int]Result{}
	for _, r := range out.Results {
		if !r.OK() {
			t.Fatalf("conversation %d turn %d: %s", r.Conversation, r.Turn, r.Err)
		}
		res[[2]int{r.Conversation, r.Turn}] = r
	}

	// Attribute each recorded body to its conversation and turn: a sub-agent's body holds its
	// task as a user message; a turn's index is the number of tool messages after the first
	// user message of the conversation.
	type at struct{ conv, turn, order int }
	where := map[[2]int]at{}
	for i, b := range rec.bodies {
		conv, from := -1, 0
		for _, c := range w.Conversations {
			task := c.Turns[0].Text()
			for j, m := range b.Messages {
				if m.Role == "user" && m.Content == task && (c.Fork != nil || conv < 0) {
					conv, from = c.ID, j
				}
			}
		}
		if conv < 0 {
			t.Fatalf("body %d belongs to no conversation", i)
		}
		turn := 0
		for _, m := range b.Messages[from:] {
			if m.Role == "tool" {
				turn++
			}
		}
		where[[2]int{conv, turn}] = at{conv, turn, i}
	}
	body := func(conv, turn int) chatRequest {
		a, ok := where[[2]int{conv, turn}]
		if !ok {
			t.Fatalf("no request recorded for conversation %d turn %d", conv, turn)
		}
		return rec.bodies[a.order]
	}
	forks := 0
	for _, c := range w.Conversations {
		for n := 1; n < len(c.Turns); n++ {
			prev, cur := body(c.ID, n-1), body(c.ID, n)
			k := len(prev.Messages)
			if !reflect.DeepEqual(cur.Tools, prev.Tools) || len(cur.Tools) == 0 || !reflect.DeepEqual(cur.Messages[:k], prev.Messages) {
				t.Fatalf("conversation %d: request %d does not start with request %d's tools and messages", c.ID, n, n-1)
			}
			call := c.Turns[n].ToolCall
			if len(cur.Messages) != k+2 {
				t.Fatalf("conversation %d request %d: %d messages, want %d (reply + tool result)", c.ID, n, len(cur.Messages), k+2)
			}
			reply, tool := cur.Messages[k], cur.Messages[k+1]
			if reply.Role != "assistant" || reply.Content == "" || !reflect.DeepEqual(reply.ToolCalls, []workload.ToolCall{*call}) {
				t.Fatalf("conversation %d request %d: assistant message %+v, want the reply with tool call %+v", c.ID, n, reply, call)
			}
			if tool.Role != "tool" || tool.ToolCallID != call.ID || tool.Content != c.Turns[n].ToolResultText() {
				t.Fatalf("conversation %d request %d: tool message %+v does not answer %s with the turn's result", c.ID, n, tool.ToolCallID, call.ID)
			}
			// The replica holds the previous prompt: all of it but the last partial block is cached.
			pr, r := res[[2]int{c.ID, n - 1}], res[[2]int{c.ID, n}]
			if r.CachedTokens < pr.PromptTokens-cfg.BlockSize {
				t.Fatalf("conversation %d request %d: %d cached tokens, want >= %d (previous prompt %d)", c.ID, n, r.CachedTokens, pr.PromptTokens-cfg.BlockSize, pr.PromptTokens)
			}
		}
		if c.Fork == nil {
			continue
		}
		forks++
		f := c.Fork
		parentAt := body(f.Parent, f.After)
		first := body(c.ID, 0)
		k := len(parentAt.Messages)
		if !reflect.DeepEqual(first.Messages[:k], parentAt.Messages) || !reflect.DeepEqual(first.Tools, parentAt.Tools) {
			t.Fatalf("sub-agent %d does not start with its parent's request %d", c.ID, f.After)
		}
		if first.Messages[k].Role != "user" || first.Messages[k].Content != c.Turns[0].Text() {
			t.Fatalf("sub-agent %d: message after the parent's history is %+v, want its task", c.ID, first.Messages[k].Role)
		}
		if got, want := res[[2]int{c.ID, 0}].CachedTokens, res[[2]int{f.Parent, f.After}].PromptTokens-2*cfg.BlockSize; got < want {
			t.Fatalf("sub-agent %d: %d cached tokens, want >= %d (the parent's prompt at the fork)", c.ID, got, want)
		}
		if last, next := where[[2]int{c.ID, len(c.Turns) - 1}].order, where[[2]int{f.Parent, f.After + 1}].order; next < last {
			t.Fatalf("parent %d sent turn %d before its sub-agent %d finished", f.Parent, f.After+1, c.ID)
		}
	}
	if forks == 0 {
		t.Fatal("no sub-agent was generated")
	}
}

// TestAddToolTurn: the tool call goes on the reply received, or on an empty assistant message
// when the previous request got no reply, and a tool message answers it.
func TestAddToolTurn(t *testing.T) {
	call := workload.ToolCall{ID: "toolu_1", Type: "function", Function: workload.FunctionCall{Name: "Read", Arguments: `{"file_path":"/a"}`}}
	turn := workload.Turn{ToolCall: &call, ToolResultFunc: func() string { return "file text" }}
	user := workload.Message{Role: "user", Content: "task"}
	tool := workload.Message{Role: "tool", ToolCallID: "toolu_1", Content: "file text"}
	for _, tc := range []struct {
		name    string
		history []workload.Message
		replied bool
		want    []workload.Message
	}{
		{"after a reply", []workload.Message{user, {Role: "assistant", Content: "reading"}}, true,
			[]workload.Message{user, {Role: "assistant", Content: "reading", ToolCalls: []workload.ToolCall{call}}, tool}},
		{"after a failed request", []workload.Message{user}, false,
			[]workload.Message{user, {Role: "assistant", ToolCalls: []workload.ToolCall{call}}, tool}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &convState{history: tc.history, replied: tc.replied}
			s.addToolTurn(&turn)
			if !reflect.DeepEqual(s.history, tc.want) || s.replied {
				t.Fatalf("history %+v, want %+v", s.history, tc.want)
			}
		})
	}
}
