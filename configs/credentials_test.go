package configs

import (
	"strings"
	"testing"
)

// A backend URL with credentials is refused at load, with an error that names the field and
// does not repeat the secret (it would otherwise be published as the backend's name in
// x-prefixlb-backend, logs and metric labels, and never used).
func TestBackendCredentialsRefused(t *testing.T) {
	const secret = "s3cret"
	cases := []struct{ yaml, want string }{
		{"backends:\n - url: http://a:1\n - url: http://b:1\n - url: http://user:" + secret + "@vllm-2:8000\n",
			"backends[2].url: \"http://xxxxx@vllm-2:8000\" has credentials"},
		{"backends:\n - url: https://" + secret + "@vllm-0:8000\n", "backends[0].url: \"https://xxxxx@vllm-0:8000\" has credentials"},
		{"backends:\n - url: user:" + secret + "@vllm-0:8000\n", "backends[0].url: missing scheme"},
		{"backends:\n - url: http://user:" + secret + "@vllm-0:8000/v1\n", "backends[0].url: \"http://xxxxx@vllm-0:8000/v1\" has credentials"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse(%q) = %v, want an error containing %q", c.yaml, err, c.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error repeats the secret: %v", err)
			}
		})
	}
}
