package app

// Tracing end to end: a config with a tracing section, the proxy it starts, a local OTLP/HTTP
// receiver that decodes what the SDK exports, and backends that record the traceparent they
// get.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// seenRequest is what a backend saw of one chat request.
type seenRequest struct{ traceparent, tracestate, cookie string }

// traceBackends are n streaming chat backends on 127.0.0.1 sharing one record of the trace
// context each chat request carried. The first refuse chat requests (over all backends)
// are answered 503, which the proxy retries on another backend.
type traceBackends struct {
	urls   []string
	refuse int64
	n      atomic.Int64
	mu     sync.Mutex
	seen   []seenRequest
}

func startTraceBackends(t *testing.T, n int, refuse int64) *traceBackends {
	t.Helper()
	tb := &traceBackends{refuse: refuse}
	for range n {
		srv := httptest.NewServer(http.HandlerFunc(tb.serve))
		t.Cleanup(srv.Close)
		tb.urls = append(tb.urls, srv.URL)
	}
	return tb
}

func (tb *traceBackends) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		if r.URL.Path == "/v1/models" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		}
		return // /health and the rest: 200, empty
	}
	_, _ = io.Copy(io.Discard, r.Body)
	tb.mu.Lock()
	tb.seen = append(tb.seen, seenRequest{r.Header.Get("traceparent"), r.Header.Get("tracestate"), r.Header.Get("Cookie")})
	tb.mu.Unlock()
	if tb.n.Add(1) <= tb.refuse {
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, tok := range []string{"Hello", " there", "!"} {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", tok)
		fl.Flush()
	}
	_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n")
}

func (tb *traceBackends) requests() []seenRequest {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]seenRequest(nil), tb.seen...)
}

// tracedConfig is a prefix-mode config in front of urls with tracing t.
func tracedConfig(tr configs.Tracing, urls ...string) *configs.Config {
	cfg := &configs.Config{Mode: "prefix", Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Tracing: tr}
	for _, u := range urls {
		cfg.Backends = append(cfg.Backends, configs.Backend{URL: u, Models: []string{"m"}})
	}
	return cfg
}

// oddCookie is a Cookie value that fasthttp would write back differently once parsed.
const oddCookie = `b=2;a=1;  c; d="q"`

// promptMarker is in the prompt of the traced requests; no span may carry it.
const promptMarker = "zebra-quartz-prompt-marker"

// streamChat sends a streamed chat completion with the given trace context fields (a name
// spelled as given; "" leaves it out) and returns its status and the SSE body.
func streamChat(t *testing.T, base string, fields map[string]string) (int, string) {
	t.Helper()
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are a careful assistant who answers briefly and checks every fact twice."},{"role":"user","content":"` + promptMarker + ` tell me about caches"}]}`
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range fields {
		req.Header[k] = []string{v} // as spelled: the proxy must match any spelling
	}
	resp, err := testutil.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		sb.WriteString(sc.Text() + "\n")
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return resp.StatusCode, sb.String()
}

// stopServing stops sv, which exports the spans still queued.
func stopServing(t *testing.T, stop func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	if err := stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// parseTraceparent splits a version-00 traceparent into trace id, parent id and flags.
func parseTraceparent(t *testing.T, tp string) (trace, parent, flags string) {
	t.Helper()
	p := strings.Split(tp, "-")
	if len(p) != 4 || p[0] != "00" || len(p[1]) != 32 || len(p[2]) != 16 || len(p[3]) != 2 {
		t.Fatalf("traceparent %q is not version 00", tp)
	}
	return p[1], p[2], p[3]
}

// Tracing on at ratio 1: a streamed request whose first attempt is refused (503) and retried
// continues the client's trace through every phase, each attempt is a span of its own, the
// backend gets the traceparent of the attempt that reached it (and the client's tracestate),
// the pick carries the routing and no span carries prompt text; the spans reach the OTLP
// receiver when the proxy stops.
func TestTracingEndToEnd(t *testing.T) {
	rcv := testutil.StartOTLPReceiver(t)
	tb := startTraceBackends(t, 2, 1)
	cfg := tracedConfig(configs.Tracing{Enabled: true, Endpoint: rcv.URL, SampleRatio: new(1.0)}, tb.urls...)
	sv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	status, body := streamChat(t, sv.URL(), map[string]string{
		"TraceParent": "00-" + clientTrace + "-" + clientSpan + "-01", // any spelling
		"tracestate":  "vendor=abc",
		"Cookie":      oddCookie,
	})
	if status != http.StatusOK || !strings.Contains(body, `" there"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("status %d, body %q: want the whole stream", status, body)
	}
	stopServing(t, sv.Stop)

	spans, _ := rcv.Spans(t)
	byName := map[string][]testutil.Span{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
		if s.Trace != clientTrace {
			t.Errorf("span %s is in trace %s, want the client's %s", s.Name, s.Trace, clientTrace)
		}
		if s.Service != "prefixlb" {
			t.Errorf("span %s: service.Name %q, want prefixlb", s.Name, s.Service)
		}
		for k, v := range s.Attrs {
			if strings.Contains(v.String(), promptMarker) || strings.Contains(v.String(), "caches") {
				t.Errorf("span %s attribute %s carries prompt text: %v", s.Name, k, v)
			}
		}
	}
	one := func(name string) testutil.Span {
		t.Helper()
		if len(byName[name]) != 1 {
			t.Fatalf("%d spans %s, want 1 (got %d spans in all)", len(byName[name]), name, len(spans))
		}
		return byName[name][0]
	}
	req := one("prefixlb.request")
	if req.Parent != clientSpan || req.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("request span: parent %s kind %v, want the client's span %s, server", req.Parent, req.Kind, clientSpan)
	}
	if req.Int("http.response.status_code") != 200 || req.Str("prefixlb.result") != "ok" || req.Int("prefixlb.attempts") != 2 ||
		req.Str("http.request.method") != "POST" || req.Str("url.path") != "/v1/chat/completions" ||
		req.Int("prefixlb.usage.cached_tokens") != 16 || req.Attrs["prefixlb.ttft_ms"] == nil {
		t.Errorf("request span attributes: %v", req.Attrs)
	}
	for _, name := range []string{"prefixlb.admit", "prefixlb.key"} {
		if s := one(name); s.Parent != req.ID {
			t.Errorf("%s: parent %s, want the request span %s", name, s.Parent, req.ID)
		}
	}
	if k := one("prefixlb.key"); k.Int("prefixlb.prompt_tokens") <= 0 || k.Str("prefixlb.api") != "chat" || k.Str("gen_ai.request.model") != "m" ||
		!k.Attrs["prefixlb.stream"].GetBoolValue() {
		t.Errorf("key span attributes: %v", k.Attrs)
	}
	picks, attempts := byName["prefixlb.pick"], byName["prefixlb.attempt"]
	if len(picks) != 2 || len(attempts) != 2 {
		t.Fatalf("%d picks and %d attempts, want 2 each (the first attempt refused with 503)", len(picks), len(attempts))
	}
	backends := map[string]bool{}
	for _, u := range tb.urls {
		backends[u] = true
	}
	for _, p := range picks {
		if p.Parent != req.ID || p.Str("prefixlb.route.reason") == "" || p.Attrs["prefixlb.route.matched_chunks"] == nil ||
			!backends[p.Str("prefixlb.backend")] || p.Attrs["prefixlb.route.predicted_ttft_ms"] == nil {
			t.Errorf("pick span: parent %s (want %s), attributes %v", p.Parent, req.ID, p.Attrs)
		}
	}
	var refused, served testutil.Span
	for _, a := range attempts {
		if a.Parent != req.ID || a.Kind != tracepb.Span_SPAN_KIND_CLIENT || !backends[a.Str("prefixlb.backend")] {
			t.Errorf("attempt span: parent %s (want %s), kind %v, attributes %v", a.Parent, req.ID, a.Kind, a.Attrs)
		}
		if a.Int("prefixlb.attempt") == 1 {
			refused = a
		} else {
			served = a
		}
	}
	if refused.Int("http.response.status_code") != 503 || refused.Status != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("first attempt: status code %d, span status %v; want 503, error", refused.Int("http.response.status_code"), refused.Status)
	}
	if served.Int("http.response.status_code") != 200 || served.Status == tracepb.Status_STATUS_CODE_ERROR ||
		served.Str("prefixlb.backend") == refused.Str("prefixlb.backend") {
		t.Errorf("second attempt: %v, status %v; want 200 on the other backend", served.Attrs, served.Status)
	}
	for _, name := range []string{"prefixlb.first_byte", "prefixlb.stream"} {
		if s := one(name); s.Parent != served.ID {
			t.Errorf("%s: parent %s, want the served attempt %s", name, s.Parent, served.ID)
		}
	}
	if st := one("prefixlb.stream"); st.Int("prefixlb.response.bytes") <= 0 || st.Str("prefixlb.result") != "ok" {
		t.Errorf("stream span attributes: %v", st.Attrs)
	}

	seen := tb.requests()
	if len(seen) != 2 {
		t.Fatalf("backends saw %d chat requests, want 2", len(seen))
	}
	for i, want := range []testutil.Span{refused, served} {
		tr, parent, flags := parseTraceparent(t, seen[i].traceparent)
		if tr != clientTrace || parent != want.ID || flags != "01" {
			t.Errorf("attempt %d: backend got traceparent %q, want trace %s, parent the attempt span %s, sampled", i+1, seen[i].traceparent, clientTrace, want.ID)
		}
		if seen[i].tracestate != "vendor=abc" {
			t.Errorf("attempt %d: backend got tracestate %q, want the client's", i+1, seen[i].tracestate)
		}
		if seen[i].cookie != oddCookie {
			t.Errorf("attempt %d: backend got Cookie %q, want the client's as sent, %q", i+1, seen[i].cookie, oddCookie)
		}
	}
}

// Tracing off, or on with nothing sampled: no span is exported. Off, the client's trace
// context reaches the backend as it came; on at ratio 0, the backend gets the request's
// unsampled context (the client's trace id when it sent one, a new one otherwise).
func TestTracingUnsampledAndOff(t *testing.T) {
	const clientTrace = "0af7651916cd43dd8448eb211c80319c"
	clientTP := "00-" + clientTrace + "-b7ad6b7169203331-00"
	for _, tc := range []struct {
		name    string
		tracing configs.Tracing
		fields  map[string]string
		check   func(t *testing.T, got seenRequest)
	}{
		{"off, client context forwarded", configs.Tracing{}, map[string]string{"traceparent": "00-" + clientTrace + "-b7ad6b7169203331-01", "tracestate": "a=1"},
			func(t *testing.T, got seenRequest) {
				if got.traceparent != "00-"+clientTrace+"-b7ad6b7169203331-01" || got.tracestate != "a=1" {
					t.Errorf("backend got %+v, want the client's fields unchanged", got)
				}
			}},
		{"off, none sent, none added", configs.Tracing{}, nil,
			func(t *testing.T, got seenRequest) {
				if got.traceparent != "" || got.tracestate != "" {
					t.Errorf("backend got %+v, want no trace context", got)
				}
			}},
		{"ratio 0, client unsampled", configs.Tracing{Enabled: true, SampleRatio: new(0.0)}, map[string]string{"Traceparent": clientTP},
			func(t *testing.T, got seenRequest) {
				tr, parent, flags := parseTraceparent(t, got.traceparent)
				if tr != clientTrace || parent == "b7ad6b7169203331" || flags != "00" {
					t.Errorf("backend got traceparent %q, want the client's trace, prefixlb's span, unsampled", got.traceparent)
				}
			}},
		{"ratio 0, none sent", configs.Tracing{Enabled: true, SampleRatio: new(0.0)}, nil,
			func(t *testing.T, got seenRequest) {
				if _, _, flags := parseTraceparent(t, got.traceparent); flags != "00" {
					t.Errorf("backend got traceparent %q, want an unsampled one", got.traceparent)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := testutil.StartOTLPReceiver(t)
			tb := startTraceBackends(t, 1, 0)
			if tc.tracing.Enabled {
				tc.tracing.Endpoint = rcv.URL
			}
			sv, err := Start(context.Background(), tracedConfig(tc.tracing, tb.urls...), nil)
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if status, body := streamChat(t, sv.URL(), tc.fields); status != http.StatusOK || !strings.HasSuffix(body, "data: [DONE]\n\n") {
					t.Fatalf("status %d, body %q", status, body)
				}
			}
			stopServing(t, sv.Stop)
			if spans, exports := rcv.Spans(t); len(spans) != 0 || exports != 0 {
				t.Errorf("%d spans exported in %d requests, want none", len(spans), exports)
			}
			seen := tb.requests()
			if len(seen) != 3 {
				t.Fatalf("backend saw %d requests, want 3", len(seen))
			}
			for _, s := range seen {
				tc.check(t, s)
			}
		})
	}
}

// A reload that turns tracing on (or changes it) warns that it needs a restart, and the
// running settings stay: requests are still not traced, their trace context forwarded as
// sent. The backends of the reload apply.
func TestTracingReloadNeedsRestart(t *testing.T) {
	const msg = "config reload: tracing changes need a restart; the running tracing settings stay"
	rcv := testutil.StartOTLPReceiver(t)
	tb := startTraceBackends(t, 2, 0)
	f := newReloadFile(t)
	f.write(reloadConf(tb.urls[0]))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 10 * time.Millisecond})
	f.write(strings.Replace(reloadConf(tb.urls...), "backends:\n", "tracing:\n  enabled: true\n  sample_ratio: 1\n  endpoint: "+rcv.URL+"\nbackends:\n", 1))
	testutil.Eventually(t, testutil.Timeout, "the reload's backends applied", func() bool { return len(h.s.Backends()) == 2 })
	if n := len(logs.WithMessage(msg)); n != 1 {
		t.Errorf("%d tracing warnings, want 1", n)
	}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if status, _ := streamChat(t, h.base, map[string]string{"traceparent": tp}); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	if seen := tb.requests(); len(seen) != 1 || seen[0].traceparent != tp {
		t.Errorf("backends saw %+v, want the client's traceparent as sent (tracing still off)", seen)
	}
	if spans, _ := rcv.Spans(t); len(spans) != 0 {
		t.Errorf("%d spans exported by a tracing section a reload brought", len(spans))
	}
}
