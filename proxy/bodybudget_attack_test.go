package proxy

// The request-body budget under attack: slow uploads that declare huge bodies hold only what
// they sent, a declared length over max_request_body_bytes is refused before any body byte is
// read (with or without Expect: 100-continue), fasthttp's pre-read of a body is bounded by
// timeouts.client_body_idle, and the budget is given back on every path.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
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
	s, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
		o.MaxRequestBodyBytes = declared
		o.MaxBufferedBodyBytes = budget
		o.Timeouts.ClientBodyIdle = 60 * time.Second // they stall for the whole test
		o.Timeouts.ClientRead = 120 * time.Second
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

// A declared Content-Length over max_request_body_bytes gets 413 at once, before any body
// byte is read: whether the client sent a byte of it or none, and without a 100 Continue
// inviting the upload when the client expects one. Left to itself fasthttp pre-reads up to
// 8 KiB of it first (headerReceived cuts the length to 0), so the 413 would come only with
// those bytes, a client that sent fewer would get 408 after timeouts.client_read, and with
// Expect: 100-continue it would send 100 Continue first.
func TestOverLimitContentLengthRefusedAtOnce(t *testing.T) {
	const limit = 64 << 20
	be := newBBHoldBackend(t)
	close(be.release)
	s, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
		o.MaxRequestBodyBytes = limit
		o.Timeouts.ClientBodyIdle = 30 * time.Second // far past the 10 s a test waits
		o.Timeouts.ClientRead = 60 * time.Second
	})
	for i, tc := range []struct {
		name, extra, body string
	}{
		{"one body byte", "", "{"},
		{"no body byte", "", ""},
		{"a few KiB of body", "", strings.Repeat("x", 4000)},
		{"Expect: 100-continue", "Expect: 100-continue\r\n", ""},
		{"Expect: 100-continue, HTTP/1.0 client", "Expect: 100-continue\r\n", "{"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := bbDial(t, base, 10*time.Second)
			proto := "HTTP/1.1"
			if strings.Contains(tc.name, "HTTP/1.0") {
				proto = "HTTP/1.0"
			}
			fmt.Fprintf(c, "POST /v1/chat/completions %s\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s", proto, tc.extra, limit+1, tc.body)
			resp, b := bbRead(t, bufio.NewReader(c), "over-limit Content-Length")
			var e struct {
				Error struct{ Message, Code string } `json:"error"`
			}
			if resp.StatusCode != 413 || json.Unmarshal(b, &e) != nil || e.Error.Code != "prefixlb_413" ||
				!strings.Contains(e.Error.Message, "max_request_body_bytes") || !strings.Contains(e.Error.Message, strconv.Itoa(limit)) {
				t.Fatalf("%s %.160q, want 413 with a JSON error naming max_request_body_bytes (%d), and no 100 Continue first",
					resp.Status, b, limit)
			}
			if !resp.Close {
				t.Errorf("413 keeps the connection open: the body bytes that follow would be read as a request")
			}
			if got := s.m.rejected413.Get(); got != uint64(i+1) {
				t.Errorf("prefixlb_request_body_too_large_total = %d, want %d", got, i+1)
			}
		})
	}
	if n := be.arrived.Load(); n != 0 {
		t.Errorf("backend got %d requests, want none", n)
	}
	if u := s.bodies.used.Load(); u != 0 {
		t.Errorf("budget in use %d after the refusals", u)
	}
}

// fasthttp reads up to 8 KiB of a body before the handler runs; a client that stalls
// within them (4000 bytes sent of 5000 or of 1 MiB) is answered 408 naming
// timeouts.client_body_idle once that passes, not after timeouts.client_read.
func TestBodyPreReadBoundedByClientBodyIdle(t *testing.T) {
	be := newBBHoldBackend(t)
	close(be.release)
	s, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
		o.Timeouts.ClientBodyIdle = 300 * time.Millisecond
		o.Timeouts.ClientRead = 60 * time.Second // far past the 10 s a test waits
	})
	for _, declared := range []int{5000, 1 << 20} {
		t.Run(strconv.Itoa(declared), func(t *testing.T) {
			c := bbDial(t, base, 10*time.Second)
			fmt.Fprintf(c, "POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", declared)
			if _, err := c.Write(bbPattern[:4000]); err != nil {
				t.Fatal(err)
			}
			resp, b := bbRead(t, bufio.NewReader(c), "upload stalled in the pre-read (client_read is 60 s)")
			if resp.StatusCode != 408 || !bytes.Contains(b, []byte("client_body_idle")) {
				t.Errorf("%s %s, want 408 naming timeouts.client_body_idle", resp.Status, b)
			}
		})
	}
	if n := be.arrived.Load(); n != 0 {
		t.Errorf("backend got %d partial uploads", n)
	}
	if u := s.bodies.used.Load(); u != 0 {
		t.Errorf("budget in use %d after the stalls", u)
	}
}

// The budget is back to 0 after every way a request with a body can end: forwarded (small,
// large, chunked, after a retry), refused (413 declared or grown, 503, 408 mid-body or in
// the pre-read, Expect with an over-limit length), or left by its client mid-body.
func TestBodyBudgetGivenBackOnEveryPath(t *testing.T) {
	const limit = 1 << 20
	be := newBBHoldBackend(t)
	close(be.release)
	held := newBBHoldBackend(t) // answers only when released: a body it holds keeps its budget
	mutate := func(o *Options) {
		o.MaxRequestBodyBytes = limit
		o.MaxBufferedBodyBytes = 2 * limit
		o.Timeouts.ClientBodyIdle = 300 * time.Millisecond
		o.Timeouts.ClientRead = 60 * time.Second
	}
	s, base := startProxy(t, "round-robin", []string{be.URL()}, mutate)
	sRetry, baseRetry := startProxy(t, "round-robin", []string{deadURL(t), be.URL()}, mutate)
	sHeld, baseHeld := startProxy(t, "round-robin", []string{held.URL()}, mutate)

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
		{"413 declared", func(t *testing.T) int { return send(t, base, clHead(limit+1), []byte("{"), "") }, 413},
		{"413 declared, Expect: 100-continue", func(t *testing.T) int {
			return send(t, base, strings.Replace(clHead(limit+1), "Host: x\r\n", "Host: x\r\nExpect: 100-continue\r\n", 1), nil, "")
		}, 413},
		{"413 chunked", func(t *testing.T) int { return send(t, base, chunkedHead, chunked(limit+1), "") }, 413},
		{"408 mid-body", func(t *testing.T) int { return send(t, base, clHead(512<<10), payload[:100<<10], "") }, 408},
		{"408 in the pre-read", func(t *testing.T) int { return send(t, base, clHead(512<<10), payload[:4000], "") }, 408},
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
