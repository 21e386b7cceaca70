package proxy

// The request-body budget under attack (issue 11 follow-up): slow uploads that declare huge
// bodies hold only what they sent, and the budget is given back on every path.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/configs"
)

// bbDial connects to the proxy at base with a deadline of wait on every read and write; the
// connection is closed when the test ends.
func bbDial(t *testing.T, base string, wait time.Duration) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(wait))
	return c
}

// bbRead reads one response from br, failing the test with what when none comes before the
// connection's deadline.
func bbRead(t *testing.T, br *bufio.Reader, what string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: no response: %v", what, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}

// Seventeen connections declare 64 MiB bodies, send a little over fasthttp's pre-read and
// stall: with the budget charged on the declared length two of them filled a 128 MiB
// budget and every other POST got 503 as long as they held on. Now each holds the buffer
// of what it sent (16 KiB), a small chat request and a 1 MiB upload beside them are
// forwarded, and closing them gives everything back.
func TestSlowUploadsDeclaringHugeBodiesDoNotShutOutOthers(t *testing.T) {
	const (
		declared = 64 << 20
		budget   = 2 * declared
		slow     = 17
		sent     = bodyPrefetch + 100 // past the pre-read: handle reads the rest
	)
	be := newBBHoldBackend(t)
	close(be.release)
	s, base := rqStartProxy(t, []string{be.URL()}, nil, func(c *configs.Config) {
		c.MaxRequestBodyBytes = declared
		c.Limits.MaxBufferedBodyBytes = budget
		c.Timeouts.ClientBodyIdle = configs.Duration(60 * time.Second) // they stall for the whole test
		c.Timeouts.ClientRead = configs.Duration(120 * time.Second)
	})
	conns := make([]net.Conn, slow)
	for i := range conns {
		conns[i] = bbDial(t, base, 60*time.Second)
		fmt.Fprintf(conns[i], "POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", declared)
		if _, err := conns[i].Write(bbPattern[:sent]); err != nil {
			t.Fatal(err)
		}
	}
	// Every slow upload in handle holds 16 KiB; charged on the declared length, two of them
	// hold the whole budget.
	eventually(t, 10*time.Second, "the slow uploads reach the budget", func() bool {
		return s.bodies.used.Load() >= slow*bodyFirst
	})
	chat := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	if resp, b := rqRoundTrip(t, base, rqPost("", chat)); resp.StatusCode != 200 {
		t.Fatalf("a %d-byte chat request beside %d stalled uploads: %d %.120q, want 200 (budget in use %d of %d)",
			len(chat), slow, resp.StatusCode, b, s.bodies.used.Load(), int64(budget))
	}
	if u := bbSend(base, 1<<20, 16<<10, true, 20*time.Second); u.err != nil || u.status != 200 || string(u.body) != strconv.Itoa(1<<20) {
		t.Errorf("a 1 MiB upload beside %d stalled uploads: %d %.120q %v, want 200 with all of it forwarded", slow, u.status, u.body, u.err)
	}
	if u := s.bodies.used.Load(); u != slow*bodyFirst {
		t.Errorf("budget in use %d with %d uploads stalled after %d bytes, want %d: each holds the buffer of what it sent",
			u, slow, sent, slow*bodyFirst)
	}
	if n := s.bodies.rejected.Get(); n != 0 {
		t.Errorf("%d requests refused for the budget, want none", n)
	}
	for _, c := range conns {
		_ = c.Close()
	}
	eventually(t, 10*time.Second, "the budget back to 0 once the slow uploads left", func() bool { return s.bodies.used.Load() == 0 })
}

// The budget is back to 0 after every way a request with a body can end: forwarded (small,
// large, chunked, after a retry), refused (413 declared or grown, 503, 408 mid-body), or
// left by its client mid-body.
func TestBodyBudgetGivenBackOnEveryPath(t *testing.T) {
	const limit = 1 << 20
	be := newBBHoldBackend(t)
	close(be.release)
	held := newBBHoldBackend(t) // answers only when released: a body it holds keeps its budget
	mutate := func(c *configs.Config) {
		c.MaxRequestBodyBytes = limit
		c.Limits.MaxBufferedBodyBytes = 2 * limit
		c.Timeouts.ClientBodyIdle = configs.Duration(300 * time.Millisecond)
		c.Timeouts.ClientRead = configs.Duration(60 * time.Second)
	}
	s, base := rqStartProxy(t, []string{be.URL()}, nil, mutate)
	sRetry, baseRetry := rqStartProxy(t, []string{deadURL(t), be.URL()}, nil, mutate)
	sHeld, baseHeld := rqStartProxy(t, []string{held.URL()}, nil, mutate)

	// send writes head and the first `first` bytes of an upload of n, then does what after
	// says, and returns the status (0: no response, as wanted from a client that left).
	send := func(t *testing.T, base, head string, body []byte, after string) int {
		c := bbDial(t, base, 10*time.Second)
		_, _ = io.WriteString(c, head)
		_, _ = c.Write(body)
		if after == "leave" {
			_ = c.Close()
			return 0
		}
		resp, _ := bbRead(t, bufio.NewReader(c), head)
		return resp.StatusCode
	}
	clHead := func(n int) string {
		return fmt.Sprintf("POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", n)
	}
	chunked := func(n int) []byte {
		var b bytes.Buffer
		for left := n; left > 0; left -= min(left, 64<<10) {
			fmt.Fprintf(&b, "%x\r\n%s\r\n", min(left, 64<<10), bbPattern[:min(left, 64<<10)])
		}
		b.WriteString("0\r\n\r\n")
		return b.Bytes()
	}
	payload := bytes.Repeat([]byte("y"), limit)
	const chunkedHead = "POST /v1/upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, tc := range []struct {
		name string
		run  func(t *testing.T) int
		want int
	}{
		{"forwarded, 100 bytes", func(t *testing.T) int { return send(t, base, clHead(100), payload[:100], "") }, 200},
		{"forwarded, 300 KiB", func(t *testing.T) int { return send(t, base, clHead(300<<10), payload[:300<<10], "") }, 200},
		{"forwarded, chunked 300 KiB", func(t *testing.T) int { return send(t, base, chunkedHead, chunked(300<<10), "") }, 200},
		{"forwarded, exactly the limit", func(t *testing.T) int { return send(t, base, clHead(limit), payload, "") }, 200},
		{"forwarded after a retry", func(t *testing.T) int {
			for range 2 { // round-robin: one of two tries the dead backend first
				if st := send(t, baseRetry, clHead(300<<10), payload[:300<<10], ""); st != 200 {
					return st
				}
			}
			eventually(t, 10*time.Second, "one upload retried", func() bool { return sRetry.m.retries.Get() == 1 })
			return 200
		}, 200},
		{"413 declared", func(t *testing.T) int { return send(t, base, clHead(limit+1), payload[:16<<10], "") }, 413},
		{"413 chunked", func(t *testing.T) int { return send(t, base, chunkedHead, chunked(limit+1), "") }, 413},
		{"408 mid-body", func(t *testing.T) int { return send(t, base, clHead(512<<10), payload[:100<<10], "") }, 408},
		{"client gone mid-body", func(t *testing.T) int { return send(t, base, clHead(512<<10), payload[:100<<10], "leave") }, 0},
		{"client gone mid chunked body", func(t *testing.T) int {
			return send(t, base, chunkedHead, chunked(300 << 10)[:200<<10], "leave")
		}, 0},
		{"503 beside a held upload", func(t *testing.T) int {
			first := make(chan bbUpload, 1)
			go func() { first <- bbSend(baseHeld, limit, 16<<10, true, 20*time.Second) }()
			eventually(t, 10*time.Second, "the backend holds the first upload", func() bool { return held.arrived.Load() == 1 })
			st := send(t, baseHeld, clHead(limit), payload, "")
			close(held.release)
			if u := recvWithin(t, first, 20*time.Second, "the held upload's answer"); u.status != 200 {
				t.Errorf("held upload: %d %v", u.status, u.err)
			}
			return st
		}, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.run(t); got != tc.want {
				t.Errorf("status %d, want %d", got, tc.want)
			}
			for _, srv := range []*Server{s, sRetry, sHeld} {
				eventually(t, 10*time.Second, "the body budget back to 0", func() bool { return srv.bodies.used.Load() == 0 })
			}
		})
	}
}
