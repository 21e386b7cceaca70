package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// shortAdminTimeouts stand in for the admin defaults (seconds to minutes) so that a test sees
// them act within a bounded wait.
var shortAdminTimeouts = adminTimeouts{readHeader: 300 * time.Millisecond, read: 500 * time.Millisecond,
	write: 2 * time.Second, idle: 300 * time.Millisecond}

// adminDropWait bounds how long a test waits for the admin server to drop a stalled client;
// far above shortAdminTimeouts, so only a missing timeout fails it.
const adminDropWait = 10 * time.Second

// startAdmin serves s's admin handler with timeouts t on 127.0.0.1 until the test ends.
func startAdmin(t *testing.T, s *Server, to adminTimeouts) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := s.adminServer(to)
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// waitDropped reads from c until the server closes it, and fails the test if that takes over
// adminDropWait. It returns what the server sent before closing.
func waitDropped(t *testing.T, c net.Conn, what string) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(adminDropWait))
	got, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: the admin server still holds the connection after %v", what, adminDropWait)
	}
	return got
}

// A client that stalls on the admin port is dropped: mid-headers (slowloris), mid-body
// (a POST /debug/route that never finishes), or idle after a request on a kept-alive
// connection. Without read and idle timeouts the last two held a connection and a goroutine
// for as long as the client liked.
func TestAdminDropsStalledClients(t *testing.T) {
	s, _ := startProxy(t, "round-robin", []string{deadURL(t)}, nil)
	addr := startAdmin(t, s, shortAdminTimeouts)
	cases := []struct {
		name, send string
		request    bool // send a complete request and read its response first
	}{
		{"headers never finish", "GET /metrics HTTP/1.1\r\nHost: admin\r\nX-Slow: a", false},
		{"body never finishes", "POST /debug/route HTTP/1.1\r\nHost: admin\r\nContent-Length: 100000\r\n\r\n{\"model\":", false},
		{"idle after a request", "GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", addr, testTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, c.send); err != nil {
				t.Fatal(err)
			}
			if c.request {
				_ = conn.SetReadDeadline(time.Now().Add(testTimeout))
				br := bufio.NewReader(conn)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK || resp.Close {
					t.Fatalf("GET /healthz: %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
				}
				conn = &bufferedConn{Conn: conn, r: br}
			}
			waitDropped(t, conn, c.name)
		})
	}
}

// bufferedConn reads through r, which may hold bytes already read from Conn.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// ServeAdmin runs with every timeout set, generous enough for /metrics and /debug.
func TestAdminServerTimeouts(t *testing.T) {
	s, _ := startProxy(t, "round-robin", []string{deadURL(t)}, nil)
	hs := s.adminServer(defaultAdminTimeouts)
	if hs.ReadHeaderTimeout <= 0 || hs.ReadTimeout < hs.ReadHeaderTimeout || hs.WriteTimeout < 30*time.Second || hs.IdleTimeout <= 0 {
		t.Fatalf("admin timeouts: read header %v, read %v, write %v, idle %v", hs.ReadHeaderTimeout, hs.ReadTimeout, hs.WriteTimeout, hs.IdleTimeout)
	}
}
