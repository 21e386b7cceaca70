// Package tracing is prefixlb's OpenTelemetry tracing: a tracer provider of the official Go
// SDK that exports spans over OTLP/HTTP (protobuf) in batches, a parent-based sampler whose
// new traces are kept at a configured ratio, and W3C Trace Context (traceparent, tracestate)
// read from and written to fasthttp request headers, so that a client's trace is continued
// through prefixlb into the backend (vLLM and SGLang continue a traceparent they receive).
//
// OTLP/HTTP rather than OTLP/gRPC: the gRPC exporter would add a gRPC client and its
// dependencies to prefixlb for no gain; every OpenTelemetry Collector (and Jaeger, Tempo)
// accepts OTLP/HTTP on port 4318.
//
// The standard OTEL_* environment variables apply where the SDK reads them: with no
// endpoint configured, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
// (and OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE); OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES over the configured service name; OTEL_BSP_* for the batch
// processor. The sampler is the configuration's (OTEL_TRACES_SAMPLER is not read).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

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
// *Tracer is tracing off (Shutdown and ForceFlush accept it; callers test for nil before
// starting spans, so that tracing off costs one compare).
type Tracer struct {
	tp   *sdktrace.TracerProvider
	tr   trace.Tracer
	prop propagation.TraceContext
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
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
	)
	return &Tracer{tp: tp, tr: tp.Tracer(InstrumentationName)}, nil
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

// ForceFlush exports the spans ended so far, within ctx. Nil-safe.
func (t *Tracer) ForceFlush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.ForceFlush(ctx)
}

// Start starts a span named name as a child of the span in ctx (or of the remote span
// context Extract put there; a root without either). See trace.Tracer.Start.
func (t *Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.tr.Start(ctx, name, opts...)
}
