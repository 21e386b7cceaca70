package configs

import (
	"os"
	"strings"
	"testing"
)

// response_headers.backend: default on, off when set false, a non-boolean is an error that
// names the line; the example config documents it with its default.
func TestResponseHeadersBackend(t *testing.T) {
	const bk = "backends:\n - url: http://a:1\n"
	cases := []struct {
		name, yaml string
		want       bool
		errPart    string
	}{
		{"default", bk, DefaultResponseHeaderBackend, ""},
		{"section without the field", "response_headers: {}\n" + bk, DefaultResponseHeaderBackend, ""},
		{"on", "response_headers:\n  backend: true\n" + bk, true, ""},
		{"off", "response_headers:\n  backend: false\n" + bk, false, ""},
		{"not a boolean", "response_headers:\n  backend: maybe\n" + bk, false, "line 2"},
		{"unknown header", "response_headers:\n  route: false\n" + bk, false, "response_headers.route: line 2: unknown field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.yaml))
			if c.errPart != "" {
				if err == nil || !strings.Contains(err.Error(), c.errPart) {
					t.Fatalf("Parse(%q) = %v, want an error containing %q", c.yaml, err, c.errPart)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ResponseHeaders.Backend == nil || *cfg.ResponseHeaders.Backend != c.want || cfg.ResponseHeaders.BackendOn() != c.want {
				t.Errorf("response_headers.backend = %v (BackendOn %v), want %v", cfg.ResponseHeaders.Backend, cfg.ResponseHeaders.BackendOn(), c.want)
			}
		})
	}
	if !(ResponseHeaders{}).BackendOn() {
		t.Error("an unset response_headers.backend (no ApplyDefaults) is off")
	}

	data, err := os.ReadFile("prefixlb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "response_headers:\n  backend: true ") {
		t.Error("configs/prefixlb.yaml does not document response_headers.backend with its default (true)")
	}
	if ex := parseFile(t, exampleFile); !ex.ResponseHeaders.BackendOn() {
		t.Error("the example config turns x-prefixlb-backend off")
	}
}
