package tracing

import (
	"bytes"
	"context"
	"encoding/hex"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// The W3C Trace Context fields (https://www.w3.org/TR/trace-context/).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Fields are looked up in the header block as the client sent it (RequestHeader.RawHeaders)
// and matched ignoring case: prefixlb's server keeps names as spelled, and fasthttp then
// looks them up as spelled. RequestHeader.All and VisitAll are not used: they parse the
// Cookie field, after which fasthttp writes it re-serialized (quotes dropped, separators
// rewritten), and the backend would not get the request as sent.

// Extract returns ctx with the remote span context of h's traceparent and tracestate (a
// client's trace, to be continued); ctx itself when h has no valid traceparent.
func (t *Tracer) Extract(ctx context.Context, h *fasthttp.RequestHeader) context.Context {
	if rawField(h.RawHeaders(), HeaderTraceparent) == nil {
		return ctx // the common case, without the propagator's string copies
	}
	return t.prop.Extract(ctx, (*headerCarrier)(h))
}

// Inject replaces h's traceparent and tracestate, in any spelling, with sc (tracestate only
// when sc has one), so that the backend's spans become children of sc's span. An invalid sc
// leaves h as it is. It writes the traceparent without allocating.
func (t *Tracer) Inject(sc trace.SpanContext, h *fasthttp.RequestHeader) {
	if !sc.IsValid() {
		return
	}
	delFolded(h, HeaderTraceparent)
	delFolded(h, HeaderTracestate)
	h.SetBytesV(HeaderTraceparent, appendTraceparent(make([]byte, 0, traceparentLen), sc))
	if ts := sc.TraceState(); ts.Len() > 0 {
		h.Set(HeaderTracestate, ts.String())
	}
}

// traceparentLen is the length of a version-00 traceparent.
const traceparentLen = len("00-") + 32 + 1 + 16 + 1 + 2

// appendTraceparent appends sc as a version-00 traceparent value: version, trace id, parent
// id (sc's span) and the flags the specification defines (sampled, random).
func appendTraceparent(dst []byte, sc trace.SpanContext) []byte {
	tid, sid := sc.TraceID(), sc.SpanID()
	flags := sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom)
	dst = append(dst, "00-"...)
	dst = hex.AppendEncode(dst, tid[:])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, sid[:])
	dst = append(dst, '-')
	return hex.AppendEncode(dst, []byte{byte(flags)})
}

// headerCarrier is a fasthttp request header as the propagator's TextMapCarrier, for
// Extract: Get reads the fields as received.
type headerCarrier fasthttp.RequestHeader

// Get returns the value of the first field named key, in any spelling, as received ("": none).
func (c *headerCarrier) Get(key string) string {
	return string(rawField((*fasthttp.RequestHeader)(c).RawHeaders(), key))
}

// Set replaces every field named key, in any spelling, with one field key: value.
func (c *headerCarrier) Set(key, value string) {
	h := (*fasthttp.RequestHeader)(c)
	delFolded(h, key)
	h.Set(key, value)
}

// Keys lists the names of the fields as received.
func (c *headerCarrier) Keys() []string {
	var keys []string
	for raw := (*fasthttp.RequestHeader)(c).RawHeaders(); len(raw) > 0; {
		var name []byte
		name, _, raw = nextField(raw)
		if name != nil {
			keys = append(keys, string(name))
		}
	}
	return keys
}

// nextField splits the first line off a raw header block: the field's name and value,
// trimmed, or a nil name for a line that is no field (a continuation, a blank line).
func nextField(raw []byte) (name, value, rest []byte) {
	line := raw
	if i := bytes.IndexByte(raw, '\n'); i >= 0 {
		line, rest = raw[:i], raw[i+1:]
	}
	if len(line) == 0 || line[0] == ' ' || line[0] == '\t' {
		return nil, nil, rest
	}
	k, v, ok := bytes.Cut(line, []byte(":"))
	if !ok {
		return nil, nil, rest
	}
	return bytes.TrimSpace(k), bytes.TrimSpace(v), rest
}

// rawField is the value of the first field named name in any spelling in a raw header block
// (nil: none).
func rawField(raw []byte, name string) []byte {
	for len(raw) > 0 {
		var k, v []byte
		k, v, raw = nextField(raw)
		if len(k) == len(name) && bytes.EqualFold(k, []byte(name)) {
			return v
		}
	}
	return nil
}

// delFolded deletes every field named name in any spelling: the spellings the client used
// (from the fields as received; deleting one already gone does nothing) and name itself
// (a value set since, by Inject on an earlier attempt).
func delFolded(h *fasthttp.RequestHeader, name string) {
	h.Del(name)
	for raw := h.RawHeaders(); len(raw) > 0; {
		var k []byte
		k, _, raw = nextField(raw)
		if len(k) == len(name) && bytes.EqualFold(k, []byte(name)) && string(k) != name {
			h.DelBytes(k)
		}
	}
}
