package tracing

import (
	"bufio"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// serverHeader parses raw as prefixlb's server does: field names kept as spelled.
func serverHeader(t *testing.T, raw string) *fasthttp.RequestHeader {
	t.Helper()
	var h fasthttp.RequestHeader
	h.DisableNormalizing()
	if err := h.Read(bufioReader(raw)); err != nil {
		t.Fatal(err)
	}
	return &h
}

// fields lists h's fields named name in any spelling, as "Name: value".
func fields(h *fasthttp.RequestHeader, name string) []string {
	var out []string
	for k, v := range h.All() {
		if strings.EqualFold(string(k), name) {
			out = append(out, string(k)+": "+string(v))
		}
	}
	return out
}

const (
	tpA = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tpB = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
)

func TestExtractAnySpelling(t *testing.T) {
	tr := &Tracer{}
	for _, tc := range []struct {
		name, raw   string
		valid       bool
		trace, span string
		sampled     bool
		state       string
	}{
		{"lower", "traceparent: " + tpA + "\r\ntracestate: k=v\r\n", true, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true, "k=v"},
		{"mixed case", "TraceParent: " + tpB + "\r\nTRACESTATE: a=1,b=2\r\n", true, "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", false, "a=1,b=2"},
		{"two fields: the first", "traceparent: " + tpA + "\r\nTraceparent: " + tpB + "\r\n", true, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true, ""},
		{"none", "X-Other: 1\r\n", false, "", "", false, ""},
		{"malformed", "traceparent: 00-zz-yy-01\r\n", false, "", "", false, ""},
		{"zero trace id", "traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01\r\n", false, "", "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := serverHeader(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+tc.raw+"\r\n")
			sc := trace.SpanContextFromContext(tr.Extract(context.Background(), h))
			if sc.IsValid() != tc.valid {
				t.Fatalf("valid %v, want %v", sc.IsValid(), tc.valid)
			}
			if !tc.valid {
				return
			}
			if sc.TraceID().String() != tc.trace || sc.SpanID().String() != tc.span || sc.IsSampled() != tc.sampled ||
				!sc.IsRemote() || sc.TraceState().String() != tc.state {
				t.Errorf("got %s %s sampled %v remote %v state %q", sc.TraceID(), sc.SpanID(), sc.IsSampled(), sc.IsRemote(), sc.TraceState())
			}
		})
	}
}

// Inject leaves exactly one traceparent, prefixlb's, and a tracestate only when the span
// context has one, whatever the client sent and however it spelled it; other fields stay.
func TestInjectReplacesEverySpelling(t *testing.T) {
	tr := &Tracer{}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("1111111111111111")
	ts, _ := trace.ParseTraceState("p=lb")
	with := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	without := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})
	const want = "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-"
	for _, tc := range []struct {
		name, raw  string
		sc         trace.SpanContext
		flags      string
		tracestate []string
	}{
		{"none sent", "", with, "01", []string{"tracestate: p=lb"}},
		{"replaced", "traceparent: " + tpB + "\r\ntracestate: x=1\r\n", with, "01", []string{"tracestate: p=lb"}},
		{"every spelling", "TraceParent: " + tpB + "\r\nTRACEPARENT: " + tpA + "\r\nTraceState: x=1\r\ntracestate: y=2\r\n", without, "00", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := serverHeader(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Keep: 1\r\n"+tc.raw+"X-Keep-Too: 2\r\n\r\n")
			tr.Inject(tc.sc, h)
			if got := fields(h, HeaderTraceparent); len(got) != 1 || got[0] != want+tc.flags {
				t.Errorf("traceparent fields %q, want [%s%s]", got, want, tc.flags)
			}
			if got := fields(h, HeaderTracestate); strings.Join(got, "|") != strings.Join(tc.tracestate, "|") {
				t.Errorf("tracestate fields %q, want %q", got, tc.tracestate)
			}
			if len(fields(h, "X-Keep")) != 1 || len(fields(h, "X-Keep-Too")) != 1 {
				t.Errorf("other fields lost: %s", h.Header())
			}
		})
	}
	// No valid span context: the fields stay as they came.
	h := serverHeader(t, "POST / HTTP/1.1\r\nHost: x\r\nTraceParent: "+tpB+"\r\ntracestate: x=1\r\n\r\n")
	tr.Inject(trace.SpanContext{}, h)
	if got := append(fields(h, HeaderTraceparent), fields(h, HeaderTracestate)...); len(got) != 2 || got[0] != "TraceParent: "+tpB || got[1] != "tracestate: x=1" {
		t.Errorf("without a span context the fields changed: %q", got)
	}
}

func TestCheckEndpoint(t *testing.T) {
	for e, ok := range map[string]bool{
		"": true, "http://collector:4318": true, "https://otlp.example.com/v1/traces": true, "http://127.0.0.1:4318/": true,
		"collector:4318": false, "grpc://c:4317": false, "http://": false, "http://c:4318/?x=1": false, "http://u:p@c:4318": false,
		"http://c:4318/#f": false, "::bad": false,
	} {
		if err := CheckEndpoint(e); (err == nil) != ok {
			t.Errorf("CheckEndpoint(%q) = %v, want ok %v", e, err, ok)
		}
	}
}

func TestEndpointURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://c:4318":             "http://c:4318/v1/traces",
		"http://c:4318/":            "http://c:4318/v1/traces",
		"https://c/custom/traces":   "https://c/custom/traces",
		"http://c:4318/v1/traces":   "http://c:4318/v1/traces",
		"https://o.example.com:443": "https://o.example.com:443/v1/traces",
	} {
		if got := endpointURL(in); got != want {
			t.Errorf("endpointURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for _, o := range []Options{{SampleRatio: -0.1}, {SampleRatio: 1.5}, {SampleRatio: 0.5, Endpoint: "collector:4318"}} {
		if tr, err := New(context.Background(), o); err == nil {
			_ = tr.Shutdown(context.Background())
			t.Errorf("New(%+v) accepted", o)
		}
	}
	tr, err := New(context.Background(), Options{SampleRatio: 1, Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Errorf("shutdown with nothing to export: %v", err)
	}
	var off *Tracer
	if off.Shutdown(context.Background()) != nil {
		t.Error("a nil Tracer's Shutdown must do nothing")
	}
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

// Extracting and injecting leave every other field byte for byte: a Cookie field in
// particular, which fasthttp re-serializes once anything has it parse the cookies.
func TestPropagationLeavesOtherFields(t *testing.T) {
	tr := &Tracer{}
	const cookie = "Cookie: b=2;a=1;  c; d=\"q\"\r\n"
	h := serverHeader(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+cookie+"traceparent: "+tpA+"\r\nX-Other: 1\r\n\r\n")
	sc := trace.SpanContextFromContext(tr.Extract(context.Background(), h))
	tr.Inject(sc, h)
	if out := string(h.Header()); !strings.Contains(out, cookie) || !strings.Contains(out, "X-Other: 1\r\n") {
		t.Errorf("header after propagation:\n%s\nwant the Cookie field as received: %q", out, cookie)
	}
}

// newTracer is a Tracer at ratio exporting to a port nothing listens on (nothing is exported
// in these tests: their spans are never ended, or not sampled).
func newTracer(t *testing.T, ratio float64) *Tracer {
	t.Helper()
	tr, err := New(context.Background(), Options{SampleRatio: ratio, Endpoint: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = tr.Shutdown(ctx)
	})
	return tr
}

// Begin's decision: parent-based, the ratio for new traces; the span context it returns is
// what the backend is sent.
func TestBegin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ratio   float64
		tp      string // the client's traceparent ("": none)
		sampled bool
	}{
		{"ratio 1, new trace", 1, "", true},
		{"ratio 0, new trace", 0, "", false},
		{"ratio 0, parent sampled", 0, tpA, true},
		{"ratio 1, parent unsampled", 1, tpB, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracer(t, tc.ratio)
			raw := "POST / HTTP/1.1\r\nHost: x\r\n"
			if tc.tp != "" {
				raw += "traceparent: " + tc.tp + "\r\n"
			}
			ctx, span, sc := tr.Begin(serverHeader(t, raw+"\r\n"), "req")
			if (span != nil) != tc.sampled || (ctx != nil) != tc.sampled || sc.IsSampled() != tc.sampled || !sc.IsValid() {
				t.Fatalf("span %v ctx %v sc %v, want sampled %v", span, ctx, sc, tc.sampled)
			}
			if tc.tp != "" && sc.TraceID().String() != strings.Split(tc.tp, "-")[1] {
				t.Errorf("trace %s, want the client's", sc.TraceID())
			}
			if tc.tp != "" && sc.SpanID().String() == strings.Split(tc.tp, "-")[2] {
				t.Errorf("span id %s is the client's: the backend's parent must be prefixlb's", sc.SpanID())
			}
			if span != nil && (!span.IsRecording() || !span.SpanContext().Equal(sc)) {
				t.Errorf("span %v recording %v, want recording with sc", span.SpanContext(), span.IsRecording())
			}
		})
	}
	// At a ratio between, a new trace Begin samples is recorded under the trace id it was
	// sampled on: the SDK's Start, which asks the sampler again, decides the same.
	tr := newTracer(t, 0.5)
	sampled := 0
	for range 200 {
		_, span, sc := tr.Begin(serverHeader(t, "POST / HTTP/1.1\r\nHost: x\r\n\r\n"), "req")
		if span == nil {
			continue
		}
		sampled++
		if !span.IsRecording() || span.SpanContext().TraceID() != sc.TraceID() {
			t.Fatalf("sampled by Begin, but span recording %v trace %s", span.IsRecording(), span.SpanContext().TraceID())
		}
	}
	if sampled < 60 || sampled > 140 {
		t.Errorf("%d of 200 new traces sampled at ratio 0.5", sampled)
	}
}

// A request not sampled costs no allocation, from Begin to its traceparent.
func TestUnsampledAllocatesNothing(t *testing.T) {
	tr := newTracer(t, 0)
	h := serverHeader(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n")
	if n := testing.AllocsPerRun(100, func() {
		_, _, sc := tr.Begin(h, "req")
		tr.Inject(sc, h)
	}); n != 0 {
		t.Errorf("%.1f allocations per unsampled request, want 0", n)
	}
}
