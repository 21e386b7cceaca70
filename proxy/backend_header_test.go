package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// rawHeaderBackend answers every request on a raw 127.0.0.1 socket with a 200 carrying the
// given extra header lines (names as written), so that a test sees header names exactly.
func rawHeaderBackend(t *testing.T, extra string) string {
	t.Helper()
	ln := testutil.ServeRaw(t, func(c net.Conn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(testTimeout))
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			body := `{"choices":[{"text":"ok"}]}`
			if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", extra, len(body), body); err != nil {
				return
			}
		}
	})
	return "http://" + ln.Addr().String()
}

// rawResponseHeaders sends one completion request to the proxy on a raw socket and returns the
// response's header lines as sent.
func rawResponseHeaders(t *testing.T, base string) []string {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	body := `{"model":"m","prompt":"hello"}`
	if _, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: lb\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var lines []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the response head: %v (so far %q)", err, lines)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "HTTP/1.1 200") {
		t.Fatalf("response head %q, want 200", lines)
	}
	return lines[1:]
}

// backendHeaderValues returns the values of every x-prefixlb-backend line, in any case.
func backendHeaderValues(lines []string) []string {
	var out []string
	for _, l := range lines {
		if name, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(strings.TrimSpace(name), HeaderBackend) {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// Options.OmitBackendHeader (response_headers.backend: false) leaves x-prefixlb-backend out of every response, also one
// that a backend sent itself (a prefixlb in front of others); on (the default), there is
// exactly one, naming the backend.
func TestBackendHeaderSetting(t *testing.T) {
	cases := []struct {
		name  string
		omit  bool // Options.OmitBackendHeader
		extra string
		want  func(url string) []string
	}{
		{"default on", false, "", func(u string) []string { return []string{u} }},
		{"default on, backend sends its own", false, HeaderBackend + ": http://10.0.0.9:8000\r\n", func(u string) []string { return []string{u} }},
		{"off", true, "", func(string) []string { return nil }},
		{"off, backend sends its own", true, HeaderBackend + ": http://10.0.0.9:8000\r\n", func(string) []string { return nil }},
		{"off, backend sends its own in another case", true, "X-Prefixlb-Backend: http://10.0.0.9:8000\r\n", func(string) []string { return nil }},
		{"on, backend sends its own in another case", false, "X-PREFIXLB-BACKEND: http://10.0.0.9:8000\r\n", func(u string) []string { return []string{u} }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			be := rawHeaderBackend(t, c.extra)
			_, base := startProxy(t, "round-robin", []string{be}, func(o *Options) { o.OmitBackendHeader = c.omit })
			got := backendHeaderValues(rawResponseHeaders(t, base))
			want := c.want(be)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("%s values %q, want %q", HeaderBackend, got, want)
			}
		})
	}
}
