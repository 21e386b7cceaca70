package proxy

// OpenTelemetry spans of a request (package tracing; docs/tracing.md). Each hook is one call
// from the request's flow. Tracing off (Server.tracer nil), a hook is one compare and the
// client's traceparent reaches the backend as it came, like any other field. A request the
// sampler drops has no span at all and allocates nothing (tracing.Tracer.Begin); its span
// context still goes to the backend in traceparent, sampled flag off, so that the backend
// drops the trace too.
//
// The spans of a sampled request, in the client's trace when it sent a traceparent:
//
//	prefixlb.request (server)   from the handler's start to the response's last byte
//	  prefixlb.admit            method and version checks, the body read within the budget
//	  prefixlb.key              the body parsed into the routing key
//	  prefixlb.pick             one routing decision (a retry decides again)
//	  prefixlb.attempt (client) one try on one backend, to the end of its response; the
//	                            backend gets its context in traceparent
//	    prefixlb.first_byte     from the attempt's start to the first token relayed
//	    prefixlb.stream         from the first token to the end of the response
//
// Attributes carry the routing (reason, matched chunks, cached tokens, predicted TTFT, the
// backend), sizes and statuses; never prompt text, header values or query strings.

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
	"github.com/prefixlb/prefixlb/tracing"
)

// Span names.
const (
	spanRequest   = "prefixlb.request"
	spanAdmit     = "prefixlb.admit"
	spanKey       = "prefixlb.key"
	spanPick      = "prefixlb.pick"
	spanAttempt   = "prefixlb.attempt"
	spanFirstByte = "prefixlb.first_byte"
	spanStream    = "prefixlb.stream"
)

// Attribute keys: OpenTelemetry's semantic conventions where one fits, prefixlb.* otherwise.
const (
	attrMethod        = attribute.Key("http.request.method")
	attrPath          = attribute.Key("url.path")
	attrStatus        = attribute.Key("http.response.status_code")
	attrServerAddress = attribute.Key("server.address")
	attrServerPort    = attribute.Key("server.port")
	attrErrorType     = attribute.Key("error.type")
	attrModel         = attribute.Key("gen_ai.request.model")
	attrBodyBytes     = attribute.Key("prefixlb.request.body_bytes")
	attrAPI           = attribute.Key("prefixlb.api")
	attrParsed        = attribute.Key("prefixlb.key.parsed")
	attrStream        = attribute.Key("prefixlb.stream")
	attrPromptTokens  = attribute.Key("prefixlb.prompt_tokens")
	attrChunks        = attribute.Key("prefixlb.key.chunks")
	attrPick          = attribute.Key("prefixlb.pick")
	attrReason        = attribute.Key("prefixlb.route.reason")
	attrMatchedChunks = attribute.Key("prefixlb.route.matched_chunks")
	attrMatchedTokens = attribute.Key("prefixlb.route.matched_tokens")
	attrPrefillTokens = attribute.Key("prefixlb.route.predicted_prefill_tokens")
	attrPredictedTTFT = attribute.Key("prefixlb.route.predicted_ttft_ms")
	attrBackend       = attribute.Key("prefixlb.backend")
	attrAttempt       = attribute.Key("prefixlb.attempt")
	attrSettled       = attribute.Key("prefixlb.settled")
	attrTTFT          = attribute.Key("prefixlb.ttft_ms")
	attrResponseBytes = attribute.Key("prefixlb.response.bytes")
	attrResult        = attribute.Key("prefixlb.result")
	attrAttempts      = attribute.Key("prefixlb.attempts")
	attrUsagePrompt   = attribute.Key("prefixlb.usage.prompt_tokens")
	attrUsageCached   = attribute.Key("prefixlb.usage.cached_tokens")
	attrLocal         = attribute.Key("prefixlb.answered_locally")
	attrAdmitted      = attribute.Key("prefixlb.admitted")
)

// traceFlushTimeout bounds the export of the spans still queued at shutdown: after the
// shutdown grace, so it is short (a pod's termination period is rarely much longer).
const traceFlushTimeout = 2 * time.Second

// newTracer builds the tracer of o; nil when o is nil (tracing off).
func newTracer(o *tracing.Options, log *zap.Logger) (*tracing.Tracer, error) {
	if o == nil {
		return nil, nil
	}
	oo := *o
	if oo.Log == nil {
		oo.Log = log
	}
	tr, err := tracing.New(context.Background(), oo)
	if err == nil {
		endpoint := oo.Endpoint
		if endpoint == "" {
			endpoint = "(OTEL_EXPORTER_OTLP_* environment, else the SDK's default)"
		}
		log.Info("tracing on: spans exported over OTLP/HTTP", zap.String("endpoint", endpoint), zap.Float64("sample_ratio", oo.SampleRatio))
	}
	return tr, err
}

// flushTraces exports the spans still queued and stops the tracer (Shutdown).
func (s *Server) flushTraces() {
	if s.tracer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := s.tracer.Shutdown(ctx); err != nil {
		s.log.Warn("tracing: spans not exported at shutdown", zap.Error(err))
	}
}

// requestTrace is one request's spans. The zero value is a request not traced; one not
// sampled has tr and sc only, for its traceparent. It is used by one goroutine at a time:
// the handler's, then the relay's.
type requestTrace struct {
	tr   *tracing.Tracer // nil: not traced
	rctx *fasthttp.RequestCtx
	sc   trace.SpanContext // the request's, sent to the backend when not sampled
	rec  bool              // sampled: span, ctx, and the phases' spans
	ctx  context.Context   // holds the request span
	span trace.Span        // the request span
	mark time.Time         // the end of the last phase: the start of the next one's span

	picks    int        // routing decisions so far
	attempts int        // attempts so far
	att      trace.Span // the attempt in progress (recording only)
	attCtx   context.Context
	attAt    time.Time // when the attempt began
	tokenAt  time.Time // when its first token was relayed (zero: not yet)
}

// traceRequest begins the trace of ctx's request, continuing the client's when it sent a
// traceparent, and starts its request span when it is sampled; zero when tracing is off.
func (s *Server) traceRequest(ctx *fasthttp.RequestCtx) requestTrace {
	if s.tracer == nil {
		return requestTrace{}
	}
	c, span, sc := s.tracer.Begin(&ctx.Request.Header, spanRequest)
	t := requestTrace{tr: s.tracer, rctx: ctx, sc: sc}
	if span == nil {
		return t
	}
	t.rec, t.ctx, t.span, t.mark = true, c, span, time.Now()
	// The path alone: a query string may carry a key, an absolute-form target userinfo.
	span.SetAttributes(attrMethod.String(string(ctx.Method())), attrPath.String(string(ctx.Path())))
	return t
}

// phase records a phase that ran from t.mark to now as a child span of the request span,
// and moves the mark to now. Recording traces only.
func (t *requestTrace) phase(name string, now time.Time, attrs ...attribute.KeyValue) trace.Span {
	_, span := t.tr.Start(t.ctx, name, trace.WithTimestamp(t.mark), trace.WithAttributes(attrs...))
	t.mark = now
	return span
}

// admitted hands the request's spans to its flow, admission done. Not traced, the flow's
// stay zero (end, endLocal and abandon leave them so).
func (t *requestTrace) admitted(f *flow) {
	if t.tr == nil {
		return
	}
	f.tr, *t = *t, requestTrace{}
	if f.tr.rec {
		f.tr.phase(spanAdmit, time.Now(), attrBodyBytes.Int(len(f.tr.rctx.Request.Body()))).End()
	}
}

// unserved ends the spans of a request that never got a flow (refused at admission, or a
// panic before it), with the status it was answered.
func (t *requestTrace) unserved() {
	if t.tr == nil {
		return
	}
	if t.rec {
		status := t.rctx.Response.StatusCode()
		adm := t.phase(spanAdmit, time.Now(), attrStatus.Int(status), attrAdmitted.Bool(false))
		adm.SetStatus(codes.Error, "refused")
		adm.End()
		t.span.SetAttributes(attrStatus.Int(status))
		if status >= fasthttp.StatusInternalServerError {
			t.span.SetStatus(codes.Error, "")
		}
		t.span.End()
	}
	*t = requestTrace{}
}

// keyed records the keying phase, ended at now: what the key holds, never the prompt.
func (t *requestTrace) keyed(k *key.Key, now time.Time) {
	if !t.rec {
		return
	}
	t.phase(spanKey, now, attrAPI.String(k.API.String()), attrModel.String(string(k.Model)), attrParsed.Bool(k.OK),
		attrStream.Bool(k.Stream), attrPromptTokens.Int(k.PromptTokens), attrChunks.Int(len(k.Chunks))).End()
}

// picked records one routing decision, made at now: the reason, the chunks and tokens the chosen backend
// is predicted to hold, the predicted prefill and TTFT there, and the backend.
func (t *requestTrace) picked(d *router.Decision, promptTokens int, now time.Time) {
	if !t.rec {
		return
	}
	t.picks++
	attrs := make([]attribute.KeyValue, 0, 7)
	attrs = append(attrs, attrPick.Int(t.picks), attrReason.String(d.Reason.String()), attrMatchedChunks.Int(d.MatchedChunks))
	if d.PrefillTokens > 0 {
		attrs = append(attrs, attrMatchedTokens.Int64(max(int64(promptTokens)-d.PrefillTokens, 0)), attrPrefillTokens.Int64(d.PrefillTokens))
	}
	if d.PredictedTTFT > 0 {
		attrs = append(attrs, attrPredictedTTFT.Float64(ms(d.PredictedTTFT)))
	}
	if d.Backend != nil {
		attrs = append(attrs, attrBackend.String(d.Backend.Name))
	}
	t.phase(spanPick, now, attrs...).End()
}

// attemptBegan starts the span of an attempt on b (sampled requests) and puts its context
// in h's traceparent and tracestate, replacing the client's: the backend's spans are the
// attempt's children. A request not sampled sends its own span context, unsampled.
func (t *requestTrace) attemptBegan(h *fasthttp.RequestHeader, b *backend.Backend) {
	if t.tr == nil {
		return
	}
	sc := t.sc
	if t.rec {
		t.attempts++
		attrs := []attribute.KeyValue{attrBackend.String(b.Name), attrAttempt.Int(t.attempts)}
		if host, port, err := net.SplitHostPort(b.Addr); err == nil {
			attrs = append(attrs, attrServerAddress.String(host))
			if p, err := strconv.Atoi(port); err == nil {
				attrs = append(attrs, attrServerPort.Int(p))
			}
		}
		t.attCtx, t.att = t.tr.Start(t.ctx, spanAttempt, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
		t.attAt, t.tokenAt = time.Now(), time.Time{}
		sc = t.att.SpanContext()
	}
	t.tr.Inject(sc, h)
}

// attemptFailed ends the attempt's span with err's class (and the backend's status when it
// answered one that is retried elsewhere).
func (t *requestTrace) attemptFailed(err error) {
	if t.att == nil {
		return
	}
	var rs retryStatus
	if errors.As(err, &rs) {
		t.att.SetAttributes(attrStatus.Int(int(rs)))
	}
	t.att.SetAttributes(attrErrorType.String(err.Error()))
	t.att.SetStatus(codes.Error, err.Error())
	t.att.End()
	t.att, t.attCtx = nil, nil
	t.mark = time.Now()
}

// firstToken records the wait for the attempt's first token: its first_byte span.
func (t *requestTrace) firstToken() {
	if t.att == nil {
		return
	}
	t.tokenAt = time.Now()
	_, span := t.tr.Start(t.attCtx, spanFirstByte, trace.WithTimestamp(t.attAt))
	span.End(trace.WithTimestamp(t.tokenAt))
}

// end ends the request's spans once f is finished: the attempt's (and its stream span) and
// the request span, with the status the client got and what became of the request.
func (t *requestTrace) end(f *flow, status int, res result) {
	if t.tr == nil {
		return
	}
	if t.rec {
		failed := res != resultOK && res != resultClientGone
		if t.att != nil {
			if !t.tokenAt.IsZero() {
				_, st := t.tr.Start(t.attCtx, spanStream, trace.WithTimestamp(t.tokenAt),
					trace.WithAttributes(attrResponseBytes.Int64(f.bytes), attrResult.String(res.String())))
				if failed {
					st.SetStatus(codes.Error, res.String())
				}
				st.End()
			}
			t.att.SetAttributes(attrStatus.Int(status), attrResponseBytes.Int64(f.bytes))
			if f.settles > 0 {
				t.att.SetAttributes(attrSettled.Int(f.settles))
			}
			if failed || status >= fasthttp.StatusInternalServerError {
				t.att.SetStatus(codes.Error, res.String())
			}
			t.att.End()
		}
		attrs := []attribute.KeyValue{attrStatus.Int(status), attrResult.String(res.String()), attrAttempts.Int(f.attempts),
			attrResponseBytes.Int64(f.bytes)}
		if f.tokenSeen {
			attrs = append(attrs, attrTTFT.Float64(ms(f.firstByte)))
		}
		if f.usagePrompt > 0 {
			attrs = append(attrs, attrUsagePrompt.Int(f.usagePrompt))
		}
		if f.usageCacheSeen {
			attrs = append(attrs, attrUsageCached.Int(f.usageCached))
		}
		t.span.SetAttributes(attrs...)
		if failed || status >= fasthttp.StatusInternalServerError {
			t.span.SetStatus(codes.Error, res.String())
		}
		t.span.End()
	}
	*t = requestTrace{}
}

// endLocal ends the spans of a request prefixlb answered itself (serveLocally).
func (t *requestTrace) endLocal() {
	if t.tr == nil {
		return
	}
	if t.rec {
		t.span.SetAttributes(attrStatus.Int(t.rctx.Response.StatusCode()), attrLocal.Bool(true))
		t.span.End()
	}
	*t = requestTrace{}
}

// abandoned ends the spans of a flow whose serving panicked (abandon), as errors.
func (t *requestTrace) abandoned() {
	if t.tr == nil {
		return
	}
	if t.att != nil {
		t.att.SetStatus(codes.Error, "panic")
		t.att.End()
	}
	if t.rec {
		t.span.SetStatus(codes.Error, "panic")
		t.span.End()
	}
	*t = requestTrace{}
}

// ms is d in milliseconds, fractional.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
