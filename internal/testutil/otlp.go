package testutil

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one span an OTLPReceiver decoded, its ids in hex.
type Span struct {
	Name, Trace, ID, Parent string
	Kind                    tracepb.Span_SpanKind
	Attrs                   map[string]*commonpb.AnyValue
	Status                  tracepb.Status_StatusCode
	StatusMessage           string
	Service                 string // its resource's service.name
	StartNs, EndNs          uint64
}

// Str and Int are the string and integer attributes k ("" and 0 when absent).
func (s Span) Str(k string) string { return s.Attrs[k].GetStringValue() }
func (s Span) Int(k string) int64  { return s.Attrs[k].GetIntValue() }

// OTLPReceiver is an OTLP/HTTP traces endpoint on 127.0.0.1 (URL; the exporter posts to
// URL/v1/traces): it decodes each ExportTraceServiceRequest (protobuf, gzip or not) and keeps
// its spans. It closes when the test ends.
type OTLPReceiver struct {
	URL     string
	mu      sync.Mutex
	spans   []Span
	exports int // requests that carried spans
	bad     []string
}

// StartOTLPReceiver starts an OTLPReceiver.
func StartOTLPReceiver(t testing.TB) *OTLPReceiver {
	t.Helper()
	r := &OTLPReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *OTLPReceiver) fail(w http.ResponseWriter, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	r.mu.Lock()
	r.bad = append(r.bad, msg)
	r.mu.Unlock()
	http.Error(w, msg, http.StatusBadRequest)
}

func (r *OTLPReceiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		r.fail(w, "unexpected export %s %s (%s)", req.Method, req.URL.Path, req.Header.Get("Content-Type"))
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			r.fail(w, "gzip: %v", err)
			return
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	var ex coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(data, &ex)
	}
	if err != nil {
		r.fail(w, "decoding an export: %v", err)
		return
	}
	var got []Span
	for _, rs := range ex.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				g := Span{Name: sp.GetName(), Trace: hex.EncodeToString(sp.GetTraceId()), ID: hex.EncodeToString(sp.GetSpanId()),
					Parent: hex.EncodeToString(sp.GetParentSpanId()), Kind: sp.GetKind(), Status: sp.GetStatus().GetCode(),
					StatusMessage: sp.GetStatus().GetMessage(), Attrs: map[string]*commonpb.AnyValue{}, Service: service,
					StartNs: sp.GetStartTimeUnixNano(), EndNs: sp.GetEndTimeUnixNano()}
				for _, kv := range sp.GetAttributes() {
					g.Attrs[kv.GetKey()] = kv.GetValue()
				}
				got = append(got, g)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	if len(got) > 0 {
		r.exports++
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Spans returns the spans received so far and the export requests that carried any, and
// fails the test for every export it could not decode.
func (r *OTLPReceiver) Spans(t testing.TB) ([]Span, int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bad {
		t.Error("OTLP receiver:", b)
	}
	return append([]Span(nil), r.spans...), r.exports
}
