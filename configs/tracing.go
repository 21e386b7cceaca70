package configs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prefixlb/prefixlb/tracing"
)

// Tracing exports OpenTelemetry spans of the requests prefixlb serves, over OTLP/HTTP
// (package tracing; docs/tracing.md). Off by default. Changing it needs a restart.
type Tracing struct {
	// Enabled turns tracing on. Off, no span is started and a client's traceparent reaches
	// the backend unchanged, like any other header.
	Enabled bool `yaml:"enabled"`
	// Endpoint is the collector's OTLP/HTTP URL, http:// or https:// (e.g.
	// http://otel-collector:4318; /v1/traces is added to a URL without a path). Empty: the
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT environment variable.
	Endpoint string `yaml:"endpoint"`
	// SampleRatio is the share of new traces recorded, 0 to 1 (nil: tracing.DefaultSampleRatio,
	// 0.01). A request with a traceparent follows its sampled flag.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// ServiceName is the spans' service.name (default tracing.DefaultServiceName, prefixlb).
	ServiceName string `yaml:"service_name"`
	// Headers are sent with every export (e.g. authorization for a hosted collector).
	Headers map[string]string `yaml:"headers"`
}

func (t *Tracing) applyDefaults() {
	if t.SampleRatio == nil {
		t.SampleRatio = new(tracing.DefaultSampleRatio)
	}
	setS(&t.ServiceName, tracing.DefaultServiceName)
}

// Options are the tracing package's options of a defaulted section.
func (t *Tracing) Options() tracing.Options {
	o := tracing.Options{Endpoint: t.Endpoint, ServiceName: t.ServiceName, Headers: t.Headers, SampleRatio: tracing.DefaultSampleRatio}
	if t.SampleRatio != nil {
		o.SampleRatio = *t.SampleRatio
	}
	return o
}

// validate checks the section, on or off (a typo is found before tracing is turned on).
func (t *Tracing) validate() error {
	if r := t.SampleRatio; r != nil && !(*r >= 0 && *r <= 1) { // NaN fails both
		return fmt.Errorf("tracing.sample_ratio: %g is outside 0..1", *r)
	}
	if err := tracing.CheckEndpoint(t.Endpoint); err != nil {
		return fmt.Errorf("tracing.endpoint: %w", err)
	}
	if t.ServiceName == "" {
		return errors.New("tracing.service_name: empty")
	}
	for k, v := range t.Headers {
		if !isToken(k) {
			return fmt.Errorf("tracing.headers: %q is not a header field name", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("tracing.headers.%s: the value holds CR, LF or NUL", k)
		}
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110 §5.6.2), as a field name must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
