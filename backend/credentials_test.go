package backend

import (
	"strings"
	"testing"
)

// A backend URL with credentials is refused: prefixlb never sends them, and the URL would be
// published as the backend's name (x-prefixlb-backend, logs, metric labels). No error message
// repeats the secret, whichever check the URL fails first.
func TestNewRefusesCredentials(t *testing.T) {
	const secret = "s3cret"
	cases := []struct{ url, errPart string }{
		{"http://user:" + secret + "@vllm-0:8000", "has credentials"},
		{"https://" + secret + "@vllm-0:8000", "has credentials"},
		{"http://user:" + secret + "@vllm-0:8000/", "has credentials"},
		{"http://:" + secret + "@vllm-0:8000", "has credentials"},
		{"http://@vllm-0:8000", "has credentials"},
		{"http://user:" + secret + "@vllm-0:8000/v1", "has credentials"},
		{"user:" + secret + "@vllm-0:8000", "missing scheme"},
		{"http://user:" + secret + "@vllm 0:8000", "has credentials"},
		{"http://user:" + secret + "%zz@vllm-0:8000", "has credentials"},
		{"ftp://user:" + secret + "@vllm-0", "has credentials"},
		{"http://vllm-0:8000#" + secret, "path or query"},
		{"http://vllm-0:8000/?key=" + secret, "path or query"},
		// A password with an unencoded '/', '?' or '#' (base64 tokens): Go's parser then
		// reads part of it as the host and port, and its error quotes that part.
		{"http://u:" + secret + "/x@127.0.0.1:8011", "has credentials"},
		{"http://u:" + secret + "?x@127.0.0.1:8011", "has credentials"},
		{"http://u:" + secret + "#x@127.0.0.1:8011", "has credentials"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			b, err := New(c.url, 0, 1)
			if err == nil {
				t.Fatalf("New(%q) accepted as %q", c.url, b.Name)
			}
			if !strings.Contains(err.Error(), c.errPart) {
				t.Errorf("New(%q) error %q, want it to contain %q", c.url, err, c.errPart)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("New(%q) error repeats the secret: %q", c.url, err)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	cases := []struct{ in, want string }{
		{"http://vllm-0:8000", "http://vllm-0:8000"},
		{"http://u:p@vllm-0:8000/x@y", "http://xxxxx@y"},
		{"u:p@vllm-0:8000", "xxxxx@vllm-0:8000"},
		{"http://a@b@vllm-0", "http://xxxxx@vllm-0"},
		{"http://vllm-0/?q=a@b", "http://xxxxx@b"},
		// A key in a query or fragment is masked too.
		{"http://127.0.0.1:9101/?key=sk-SECRET", "http://127.0.0.1:9101/?xxxxx"},
		{"http://127.0.0.1:8011?pa/ss", "http://127.0.0.1:8011?xxxxx"},
		{"http://vllm-0:8000#sk-SECRET", "http://vllm-0:8000#xxxxx"},
		{"http://u:p@vllm-0:8000/?k=s", "http://xxxxx@vllm-0:8000/?xxxxx"},
		// Unencoded '/', '?', '#' in a password (a base64 token) end no authority here.
		{"http://u:pa/ss@127.0.0.1:8011", "http://xxxxx@127.0.0.1:8011"},
		{"http://u:p?x#y@vllm-0:8000", "http://xxxxx@vllm-0:8000"},
		{"HTTP://u:pa/ss@[::1]:8011", "HTTP://xxxxx@[::1]:8011"},
	}
	for _, c := range cases {
		if got := redactURL(c.in); got != c.want {
			t.Errorf("redactURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
