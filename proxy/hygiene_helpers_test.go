package proxy

// Helpers of the hostile-backend tests (upstream_hygiene_test.go, client_stream_test.go):
// backends written in raw bytes, and the request's log line.

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// rawBackend is a backend written in raw bytes: serve runs for each accepted connection and the
// connection is closed when it returns. It counts connections accepted and finished.
type rawBackend struct {
	ln       net.Listener
	scheme   string
	accepted atomic.Int64
	finished atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

func newRawBackend(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) *rawBackend {
	return newRawBackendTLS(t, nil, serve)
}

// newRawBackendTLS is newRawBackend speaking TLS with cfg (nil: plain TCP).
func newRawBackendTLS(t *testing.T, cfg *tls.Config, serve func(c net.Conn, br *bufio.Reader)) *rawBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &rawBackend{ln: ln, scheme: "http"}
	if cfg != nil {
		b.ln, b.scheme = tls.NewListener(ln, cfg), "https"
	}
	go func() {
		for {
			c, err := b.ln.Accept()
			if err != nil {
				return
			}
			b.accepted.Add(1)
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			go func() {
				defer b.finished.Add(1)
				defer c.Close()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			_ = c.Close()
		}
	})
	return b
}

func (b *rawBackend) URL() string  { return b.scheme + "://" + b.ln.Addr().String() }
func (b *rawBackend) Addr() string { return b.ln.Addr().String() }

// testTLS is a server certificate for 127.0.0.1 and, for the proxy, a pool that trusts it.
func testTLS(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	cfg := &tls.Config{Certificates: ts.TLS.Certificates, NextProtos: []string{"http/1.1"}}
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	ts.Close()
	return cfg, pool
}

// trustUpstreams returns a prep that makes the server's TLS upstreams trust pool.
func trustUpstreams(pool *x509.CertPool) func(*Server) {
	return func(s *Server) {
		for _, u := range *s.ups.Load() {
			if u.tls != nil {
				u.tls.RootCAs = pool
			}
		}
	}
}

// readRequest reads one request from br, its body included; it fails when the proxy closed
// the connection.
func readRequest(br *bufio.Reader) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, req.Body)
	return req, err
}

// jsonResponse is a well-framed 200 with body.
func jsonResponse(body string) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// userDo sends one request as user to url and returns status and body (bounded by the client).
func userDo(t *testing.T, c *http.Client, method, url, user string) (int, string) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello from ` + user + `"}]}`)
	}
	req, _ := http.NewRequest(method, url+"/v1/chat/completions", body)
	req.Header.Set("X-Test-User", user)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("user %s: %v", user, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// requestLines waits (bounded) for n request log lines in logs and returns the fields of
// each; more than n fails the test.
func requestLines(t *testing.T, logs *logRecorder, n int) []map[string]any {
	t.Helper()
	eventually(t, testTimeout, fmt.Sprintf("%d request log lines", n), func() bool { return len(logs.WithMessage("request")) >= n })
	var out []map[string]any
	for _, e := range logs.WithMessage("request") {
		out = append(out, e.Fields)
	}
	if len(out) != n {
		t.Fatalf("%d request log lines, want %d:\n%.600s", len(out), n, logs.Text())
	}
	return out
}
