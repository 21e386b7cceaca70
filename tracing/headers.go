package tracing

import (
	"bytes"
	"context"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// The W3C Trace Context fields (https://www.w3.org/TR/trace-context/).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Extract returns ctx with the remote span context of h's traceparent and tracestate (a
// client's trace, to be continued); ctx itself when h has no valid traceparent.
func (t *Tracer) Extract(ctx context.Context, h *fasthttp.RequestHeader) context.Context {
	return t.prop.Extract(ctx, (*headerCarrier)(h))
}

// Inject replaces h's traceparent and tracestate, in any spelling, with the span context of
// ctx (tracestate only when that has one), so that the backend's spans become children of
// that span. Without a valid span context in ctx, h's fields are left as they are.
func (t *Tracer) Inject(ctx context.Context, h *fasthttp.RequestHeader) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	delFolded(h, HeaderTracestate) // the propagator sets it only when the span has one
	t.prop.Inject(ctx, (*headerCarrier)(h))
}

// headerCarrier is a fasthttp request header as the propagator's TextMapCarrier. Field
// names are matched ignoring case: prefixlb's server keeps them as the client spelled them
// (fasthttp's DisableHeaderNamesNormalizing), and fasthttp then looks them up as spelled.
type headerCarrier fasthttp.RequestHeader

// Get returns the value of the first field named key, in any spelling ("": none).
func (c *headerCarrier) Get(key string) string {
	h := (*fasthttp.RequestHeader)(c)
	for k, v := range h.All() {
		if len(k) == len(key) && bytes.EqualFold(k, []byte(key)) {
			return string(v)
		}
	}
	return ""
}

// Set replaces every field named key, in any spelling, with one field key: value.
func (c *headerCarrier) Set(key, value string) {
	h := (*fasthttp.RequestHeader)(c)
	delFolded(h, key)
	h.Set(key, value)
}

// Keys lists the field names of h as spelled (the TraceContext propagator does not call it).
func (c *headerCarrier) Keys() []string {
	h := (*fasthttp.RequestHeader)(c)
	var keys []string
	for k := range h.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// maxFieldName bounds the names delFolded copies: the trace context fields' are short.
const maxFieldName = 32

// delFolded deletes every field named name ignoring case, one spelling per pass (deleting
// moves the bytes All points into, so each name is copied before it is deleted). Each pass
// deletes at least one field, and a pass that finds none ends it.
func delFolded(h *fasthttp.RequestHeader, name string) {
	var buf [maxFieldName]byte
	for range h.Len() + 1 {
		found := buf[:0]
		for k := range h.All() {
			if len(k) == len(name) && bytes.EqualFold(k, []byte(name)) {
				found = append(found, k...)
				break
			}
		}
		if len(found) == 0 {
			return
		}
		h.DelBytes(found)
	}
}
