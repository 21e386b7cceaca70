package tracing

import (
	"bufio"
	"context"
	"strings"
	"testing"

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
			tr.Inject(trace.ContextWithSpanContext(context.Background(), tc.sc), h)
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
	tr.Inject(context.Background(), h)
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
	if off.Shutdown(context.Background()) != nil || off.ForceFlush(context.Background()) != nil {
		t.Error("a nil Tracer's Shutdown and ForceFlush must do nothing")
	}
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }
