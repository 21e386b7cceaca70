// Package tracing is prefixlb's OpenTelemetry tracing: a tracer provider of the official Go
// SDK that exports spans over OTLP/HTTP (protobuf) in batches, a parent-based sampler whose
// new traces are kept at a configured ratio, and W3C Trace Context (traceparent, tracestate)
// read from and written to fasthttp request headers, so that a client's trace is continued
// through prefixlb into the backend (vLLM and SGLang continue a traceparent they receive).
//
// OTLP/HTTP rather than OTLP/gRPC: every OpenTelemetry Collector (and Jaeger, Tempo) accepts
// it on port 4318, over net/http, without a gRPC connection to keep. (The grpc module is
// linked either way: the OTLP collector protos and the exporter's shared config import it.)
//
// The standard OTEL_* environment variables apply where the SDK reads them: with no
// endpoint configured, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
// (and OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE); OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES over the configured service name; OTEL_BSP_* for the batch
// processor. The sampler is the configuration's (OTEL_TRACES_SAMPLER is not read).
package tracing

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// Defaults of Options. Each names its reason.
const (
	// DefaultSampleRatio keeps 1% of new traces: enough to see every kind of request on a
	// busy replica, cheap enough to leave on (bench overhead's prefixlb-prefix-traced target
	// measures what it costs).
	DefaultSampleRatio = 0.01
	// DefaultServiceName is the service.name resource attribute of prefixlb's spans.
	DefaultServiceName = "prefixlb"
	// TracesPath is the OTLP/HTTP traces path, added to an endpoint URL that has no path.
	TracesPath = "/v1/traces"
	// InstrumentationName names prefixlb's tracer (the instrumentation scope of its spans).
	InstrumentationName = "github.com/prefixlb/prefixlb"
)

// Options configure a Tracer.
type Options struct {
	// Endpoint is the collector's OTLP/HTTP URL: http:// (plaintext) or https:// (TLS),
	// e.g. http://otel-collector:4318; without a path, TracesPath is added. "": the
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT environment variables,
	// else the SDK's default, https://localhost:4318/v1/traces.
	Endpoint string
	// SampleRatio is the share of new traces recorded, 0 to 1. A request that comes with a
	// traceparent follows its sampled flag whatever the ratio (parent-based sampling).
	SampleRatio float64
	// ServiceName is the service.name of the spans (OTEL_SERVICE_NAME wins over it).
	ServiceName string
	// Headers are added to every export request (e.g. an authorization for a hosted
	// collector); nil: OTEL_EXPORTER_OTLP_HEADERS, if set.
	Headers map[string]string
	// Log receives the exporter's errors (nil: dropped).
	Log *zap.Logger
}

// CheckEndpoint reports whether e is an acceptable Options.Endpoint: empty, or an absolute
// http or https URL with a host and no query or fragment.
func CheckEndpoint(e string) error {
	if e == "" {
		return nil
	}
	u, err := url.Parse(e)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL: %v", e, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: want an http:// or https:// URL (the collector's OTLP/HTTP port, usually 4318)", e)
	case u.Host == "":
		return fmt.Errorf("%q has no host", e)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return fmt.Errorf("%q: no user, query or fragment allowed", e)
	}
	return nil
}

// endpointURL is e with TracesPath when it has no path.
func endpointURL(e string) string {
	u, err := url.Parse(e)
	if err != nil || strings.Trim(u.Path, "/") != "" {
		return e
	}
	u.Path = TracesPath
	return u.String()
}

// Tracer starts prefixlb's spans and carries their context in and out of requests. A nil
// *Tracer is tracing off (Shutdown accepts it; callers test for nil before
// starting spans, so that tracing off costs one compare).
type Tracer struct {
	tp      *sdktrace.TracerProvider
	tr      trace.Tracer
	sampler sdktrace.Sampler
	prop    propagation.TraceContext
}

// New builds a Tracer from o: a tracer provider with a batching OTLP/HTTP exporter (which
// connects only when it first exports). The error names the bad option.
func New(ctx context.Context, o Options) (*Tracer, error) {
	if !(o.SampleRatio >= 0 && o.SampleRatio <= 1) {
		return nil, fmt.Errorf("tracing: sample ratio %g is outside 0..1", o.SampleRatio)
	}
	if err := CheckEndpoint(o.Endpoint); err != nil {
		return nil, fmt.Errorf("tracing: endpoint %w", err)
	}
	if o.ServiceName == "" {
		o.ServiceName = DefaultServiceName
	}
	var opts []otlptracehttp.Option
	if o.Endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(endpointURL(o.Endpoint)))
	}
	if len(o.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(o.Headers))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// service.name first, the environment after it: OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES win, as the specification has it.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", o.ServiceName)),
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	if o.Log != nil {
		setErrorLog(o.Log)
	}
	sampler := sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sampler),
		sdktrace.WithIDGenerator(idGenerator{}),
	)
	return &Tracer{tp: tp, tr: tp.Tracer(InstrumentationName), sampler: sampler}, nil
}

// setErrorLog sends the SDK's errors (an export that failed, a full queue) to log at warn.
// The handler is process-wide (otel.SetErrorHandler): the last Tracer built sets it.
func setErrorLog(log *zap.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: OpenTelemetry SDK error", zap.Error(err))
	}))
}

// Shutdown exports the spans still queued and stops the provider, within ctx. Nil-safe.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// Begin starts the trace of a request whose header is h, continuing the trace of its
// traceparent, if any. The sampler decides first, on the request's trace id (the client's,
// or a new one): sampled, Begin starts a server span named name and returns its context, the
// span and its span context; not sampled, it starts nothing and returns a nil context and
// span, and the span context to send downstream (a new span id, the sampled flag off),
// allocating nothing when h has no traceparent.
func (t *Tracer) Begin(h *fasthttp.RequestHeader, name string) (context.Context, trace.Span, trace.SpanContext) {
	parent := t.Extract(context.Background(), h)
	psc := trace.SpanContextFromContext(parent)
	tid := psc.TraceID()
	if !tid.IsValid() {
		tid = newTraceID()
	}
	res := t.sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: parent, TraceID: tid, Name: name, Kind: trace.SpanKindServer})
	if res.Decision == sdktrace.Drop {
		return nil, nil, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: newSpanID(),
			TraceFlags: psc.TraceFlags() &^ trace.FlagsSampled, TraceState: res.Tracestate})
	}
	if !psc.IsValid() {
		// A new trace: the span takes the trace id just sampled (idGenerator), so that the
		// sampler, asked again by Start, decides the same.
		parent = context.WithValue(parent, presetTraceID{}, tid)
	}
	ctx, span := t.tr.Start(parent, name, trace.WithSpanKind(trace.SpanKindServer))
	return ctx, span, span.SpanContext()
}

// presetTraceID is the context key of the trace id Begin sampled for a new trace.
type presetTraceID struct{}

// idGenerator is the SDK's random ids, but for a new trace whose id Begin chose.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if tid, ok := ctx.Value(presetTraceID{}).(trace.TraceID); ok {
		return tid, newSpanID()
	}
	return newTraceID(), newSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }

// newTraceID and newSpanID are random non-zero ids (math/rand/v2's generator, as the SDK's
// own: ids need to be unique, not secret).
func newTraceID() trace.TraceID {
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid
}

func newSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.NativeEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}

// Start starts a span named name as a child of the span in ctx (or of the remote span
// context Extract put there; a root without either). See trace.Tracer.Start.
func (t *Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.tr.Start(ctx, name, opts...)
}
