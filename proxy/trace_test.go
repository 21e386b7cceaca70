package proxy

// The request's spans (trace.go) where the flow leaves its usual path: a refusal at admission,
// a panic before and after the attempt; and what the hooks cost per request, off, unsampled
// and sampled.

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
	"github.com/prefixlb/prefixlb/tracing"
)

// tracedTo traces every request of the proxy to rcv (a mutate of startProxy's); stopProxy
// exports the spans.
func tracedTo(rcv *testutil.OTLPReceiver) func(*Options) {
	return func(o *Options) { o.Tracing = &tracing.Options{Endpoint: rcv.URL, SampleRatio: 1} }
}

// spansNamed groups spans by name.
func spansNamed(spans []testutil.Span) map[string][]testutil.Span {
	m := map[string][]testutil.Span{}
	for _, s := range spans {
		m[s.Name] = append(m[s.Name], s)
	}
	return m
}

// A request refused at admission has its request span and an admit span that failed, with
// the status it got; a request whose serving panics ends its spans as errors ("panic"),
// before the attempt and during the relay.
func TestTraceEndsOnRefusalAndPanic(t *testing.T) {
	rep := newPanicReplica(t)
	t.Run("refused", func(t *testing.T) {
		rcv := testutil.StartOTLPReceiver(t)
		s, base := startProxy(t, "prefix", []string{rep.srv.URL}, tracedTo(rcv))
		req, _ := http.NewRequest("TRACE", base+"/v1/models", nil)
		resp, err := testutil.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		stopProxy(t, s)
		spans, _ := rcv.Spans(t)
		by := spansNamed(spans)
		if len(spans) != 2 || len(by[spanRequest]) != 1 || len(by[spanAdmit]) != 1 {
			t.Fatalf("spans %v, want a request and an admit span", by)
		}
		r, a := by[spanRequest][0], by[spanAdmit][0]
		if r.Int(string(attrStatus)) != http.StatusMethodNotAllowed || a.Parent != r.ID || a.Status != tracepb.Status_STATUS_CODE_ERROR ||
			a.Int(string(attrStatus)) != http.StatusMethodNotAllowed {
			t.Errorf("request %v, admit %v (%v)", r.Attrs, a.Attrs, a.Status)
		}
	})
	for _, stage := range []panicStage{stagePick, stageRelay} {
		t.Run(stage.String(), func(t *testing.T) {
			rcv := testutil.StartOTLPReceiver(t)
			armed := true
			s, base := startProxy(t, "prefix", []string{rep.srv.URL}, tracedTo(rcv), func(s *Server) {
				s.testPanic = func(at panicStage) {
					if at == stage && armed {
						armed = false // one request, on its own goroutine: no race
						panic(panicMarker)
					}
				}
			})
			resp, err := testutil.Client().Post(base+"/v1/chat/completions", "application/json", strings.NewReader(panicChatBody("trace")))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			stopProxy(t, s)
			spans, _ := rcv.Spans(t)
			by := spansNamed(spans)
			if len(by[spanRequest]) != 1 || by[spanRequest][0].Status != tracepb.Status_STATUS_CODE_ERROR || by[spanRequest][0].StatusMessage != "panic" {
				t.Fatalf("request span %v, want one, ended as a panic", by[spanRequest])
			}
			wantAttempts := 0
			if stage == stageRelay {
				wantAttempts = 1
			}
			if a := by[spanAttempt]; len(a) != wantAttempts || (wantAttempts == 1 && a[0].StatusMessage != "panic") {
				t.Errorf("attempt spans %v, want %d ended as a panic", a, wantAttempts)
			}
		})
	}
}

// No span carries what a request may hold of secrets or content: userinfo and a query in an
// absolute-form target, header values, prompt text. url.path is the path alone.
func TestTraceAttributesCarryNoSecrets(t *testing.T) {
	rep := newPanicReplica(t)
	rcv := testutil.StartOTLPReceiver(t)
	s, base := startProxy(t, "prefix", []string{rep.srv.URL}, tracedTo(rcv))
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := panicChatBody("octopus-violet")
	_, err = io.WriteString(c, "POST http://user:pa55word@backend.example/v1/chat/completions?api_key=sekrit HTTP/1.1\r\nHost: backend.example\r\n"+
		"Authorization: Bearer tok-xyzzy\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(testutil.Timeout))
	resp, err := io.ReadAll(c)
	c.Close()
	if err != nil || !strings.HasPrefix(string(resp), "HTTP/1.1 200") {
		t.Fatalf("response %q, %v", resp, err)
	}
	stopProxy(t, s)
	spans, _ := rcv.Spans(t)
	if len(spans) < 6 {
		t.Fatalf("%d spans, want the request's", len(spans))
	}
	for _, s := range spans {
		for k, v := range s.Attrs {
			for _, secret := range []string{"pa55word", "sekrit", "tok-xyzzy", "octopus", "backend.example"} {
				if strings.Contains(v.String(), secret) {
					t.Errorf("span %s attribute %s = %v carries %q", s.Name, k, v, secret)
				}
			}
		}
		if s.Name == spanRequest && s.Str(string(attrPath)) != "/v1/chat/completions" {
			t.Errorf("url.path %q, want the path alone", s.Str(string(attrPath)))
		}
	}
}

// hookRun is one request's pass through every tracing hook, as a served request makes it,
// on a request held in memory.
type hookRun struct {
	s   *Server
	ctx fasthttp.RequestCtx
	f   flow
	b   *backend.Backend
}

func newHookRun(t testing.TB, o *tracing.Options) *hookRun {
	t.Helper()
	tr, err := newTracer(o, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	b, err := backend.New("http://127.0.0.1:8000", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := &hookRun{s: &Server{tracer: tr}, b: b}
	h.ctx.Request.Header.SetMethod(fasthttp.MethodPost)
	h.ctx.Request.SetRequestURI("/v1/chat/completions")
	h.ctx.Request.SetBodyString(`{"model":"m","stream":true,"messages":[]}`)
	h.f.k = key.Key{API: key.APIChat, Routed: true, OK: true, Stream: true, Model: []byte("m"), PromptTokens: 4000, Chunks: make([]uint64, 60)}
	h.f.dec = router.Decision{Backend: b, Reason: router.ReasonMatch, MatchedChunks: 50, PrefillTokens: 800, PredictedTTFT: 20 * time.Millisecond}
	h.f.attempts, h.f.bytes, h.f.tokenSeen, h.f.firstByte = 1, 4096, true, 20*time.Millisecond
	return h
}

func (h *hookRun) run() {
	if h.s.tracer != nil {
		h.ctx.Request.Header.Del(tracing.HeaderTraceparent) // as a client sends it: without
	}
	var st serving
	st.tr = h.s.traceRequest(&h.ctx)
	st.tr.admitted(&h.f)
	h.f.tr.keyed(&h.f.k, time.Now())
	h.f.tr.picked(&h.f.dec, h.f.k.PromptTokens, time.Now())
	h.f.tr.attemptBegan(&h.ctx.Request.Header, h.b)
	h.f.tr.firstToken()
	h.f.tr.end(&h.f, fasthttp.StatusOK, resultOK)
}

// discardCollector is an OTLP/HTTP endpoint on 127.0.0.1 that reads and drops every export.
func discardCollector(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// Tracing off, and a request the sampler drops (99% of them at the default ratio), cost no
// allocation: no span, no context, the traceparent written in place.
func TestTraceHooksAllocs(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    *tracing.Options
	}{
		{"off", nil},
		{"unsampled", &tracing.Options{Endpoint: discardCollector(t), SampleRatio: 0}},
	} {
		h := newHookRun(t, tc.o)
		if got := testing.AllocsPerRun(200, h.run); got != 0 {
			t.Errorf("%s: %.1f allocations per request, want none", tc.name, got)
		}
	}
	// The unsampled request still sends a traceparent, unsampled.
	h := newHookRun(t, &tracing.Options{Endpoint: discardCollector(t), SampleRatio: 0})
	h.run()
	if tp := string(h.ctx.Request.Header.Peek(tracing.HeaderTraceparent)); len(tp) != 55 || !strings.HasSuffix(tp, "-00") {
		t.Errorf("traceparent %q, want an unsampled one", tp)
	}
}

// BenchmarkTraceHooks is one request's tracing hooks alone: off, on and not sampled (the 99%
// at the default ratio), and sampled (seven spans, exported in batches to a collector on
// 127.0.0.1 that drops them).
func BenchmarkTraceHooks(b *testing.B) {
	for _, tc := range []struct {
		name  string
		ratio float64
		on    bool
	}{{"off", 0, false}, {"unsampled", 0, true}, {"sampled", 1, true}} {
		b.Run(tc.name, func(b *testing.B) {
			var o *tracing.Options
			if tc.on {
				o = &tracing.Options{Endpoint: discardCollector(b), SampleRatio: tc.ratio}
			}
			h := newHookRun(b, o)
			b.ReportAllocs()
			for b.Loop() {
				h.run()
			}
		})
	}
}
