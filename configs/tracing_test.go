package configs

import (
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/tracing"
)

// The tracing section: defaults, a 0 ratio told apart from one left out, and errors that name
// the field, whether tracing is on or off.
func TestTracingSection(t *testing.T) {
	const be = "backends:\n  - url: http://a:8000\n"
	c, err := Parse([]byte(be))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tracing.Enabled || *c.Tracing.SampleRatio != tracing.DefaultSampleRatio || c.Tracing.ServiceName != tracing.DefaultServiceName {
		t.Errorf("defaults: %+v", c.Tracing)
	}
	c, err = Parse([]byte("tracing:\n  enabled: true\n  endpoint: http://otel:4318\n  sample_ratio: 0\n  service_name: lb-eu\n  headers: {authorization: Bearer x}\n" + be))
	if err != nil {
		t.Fatal(err)
	}
	o := c.Tracing.Options()
	if !c.Tracing.Enabled || o.SampleRatio != 0 || o.Endpoint != "http://otel:4318" || o.ServiceName != "lb-eu" || o.Headers["authorization"] != "Bearer x" {
		t.Errorf("options: %+v", o)
	}
	for _, tc := range []struct{ yaml, field string }{
		{"  sample_ratio: 1.5\n", "tracing.sample_ratio"},
		{"  sample_ratio: -0.1\n", "tracing.sample_ratio"},
		{"  sample_ratio: .nan\n", "tracing.sample_ratio"},
		{"  endpoint: otel:4318\n", "tracing.endpoint"},
		{"  endpoint: grpc://otel:4317\n", "tracing.endpoint"},
		{"  headers: {\"bad name\": x}\n", "tracing.headers"},
		{"  enabled: true\n  headers: {x-key: \"a\\r\\nb\"}\n", "tracing.headers.x-key"},
	} {
		_, err := Parse([]byte("tracing:\n" + tc.yaml + be))
		if err == nil || !strings.HasPrefix(err.Error(), tc.field+":") {
			t.Errorf("%q: error %v, want one naming %s", tc.yaml, err, tc.field)
		}
	}
}
