package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// TestPrefixReceipts: in prefix mode every decision carries its receipt. A prompt sent three
// times (streamed) to two backends that report usage: x-prefixlb-route adds the predicted
// cached tokens (0 on the cold first request, most of the prompt after), the request log line
// has the predicted prefill tokens and TTFT, /debug/route shows each candidate's estimate, and
// /metrics has predicted ÷ measured TTFT per request and the predicted cached tokens beside
// the reported ones.
func TestPrefixReceipts(t *testing.T) {
	sse := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\n")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
	a, b := httptest.NewServer(http.HandlerFunc(sse)), httptest.NewServer(http.HandlerFunc(sse))
	defer a.Close()
	defer b.Close()
	log, rec := testutil.RecordingLogger()
	s, url := startProxy(t, "prefix", []string{a.URL, b.URL}, func(o *Options) { o.Log = log })
	c := testClient()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 240) + `"}]}`
	var cached []int
	for range 3 {
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		route := resp.Header.Get(HeaderRoute)
		_, v, ok := strings.Cut(route, ";cached=")
		v, us, hasTTFT := strings.Cut(v, ";predicted_ttft_us=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			t.Fatalf("x-prefixlb-route %q has no cached=N", route)
		}
		if p, err := strconv.Atoi(us); !hasTTFT || err != nil || p <= 0 {
			t.Fatalf("x-prefixlb-route %q has no predicted_ttft_us=U > 0 after cached=N", route)
		}
		cached = append(cached, n)
	}
	waitInFlightZero(t, s)
	if cached[0] != 0 || cached[1] < 200 || cached[2] != cached[1] {
		t.Errorf("predicted cached tokens %v: want 0 cold, then most of the ~300-token prompt", cached)
	}

	var lines int
	for _, e := range rec.WithMessage("request") {
		lines++
		f := e.Fields
		if d, ok := f["predicted_ttft"].(time.Duration); !ok || d <= 0 {
			t.Errorf("request line predicted_ttft = %v (%T), want > 0", f["predicted_ttft"], f["predicted_ttft"])
		}
		if n, ok := f["predicted_prefill_tokens"].(int64); !ok || n <= 0 {
			t.Errorf("request line predicted_prefill_tokens = %v, want > 0", f["predicted_prefill_tokens"])
		}
	}
	if lines != 3 {
		t.Errorf("%d request lines, want 3", lines)
	}

	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	rr, err := c.Post(admin.URL+"/debug/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var ri RouteInfo
	err = json.NewDecoder(rr.Body).Decode(&ri)
	rr.Body.Close()
	if err != nil || len(ri.Candidates) != 2 || ri.PredictedTTFTMs <= 0 || ri.PredictedPrefillTokens <= 0 {
		t.Fatalf("/debug/route: %+v (%v)", ri, err)
	}
	holders := 0
	for _, ce := range ri.Candidates {
		if ce.PredictedTTFTMs <= 0 || ce.BaseMs < 0 {
			t.Errorf("candidate %+v: no estimate", ce)
		}
		if ce.MatchedChunks > 0 && ce.HeldTokens > 0 {
			holders++
			if ce.Backend != ri.Backend {
				t.Errorf("the holder %s is not the pick %s", ce.Backend, ri.Backend)
			}
		}
	}
	if holders != 1 {
		t.Errorf("%d candidates hold the prompt, want 1: %+v", holders, ri.Candidates)
	}

	resp, err := c.Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := string(raw)
	if !strings.Contains(m, "prefixlb_ttft_predicted_over_measured_count 3\n") {
		t.Errorf("/metrics: want 3 predicted ÷ measured TTFT observations:\n%s", grepLines(m, "predicted_over"))
	}
	if !strings.Contains(m, `prefixlb_backend_predicted_cached_tokens_total{backend="`+ri.Backend+`"}`) {
		t.Errorf("/metrics lacks the holder's predicted cached tokens:\n%s", grepLines(m, "predicted_cached"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
