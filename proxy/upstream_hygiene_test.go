package proxy

// Hostile and misframing backends: a pooled connection is never reused with bytes left over
// from another user's response, a 101 is never relayed or pooled, a backend's early 4xx
// reaches the client without counting against the backend, and no error body or log line
// carries upstream payload bytes or internal addresses. Every backend here is raw bytes on a
// 127.0.0.1 socket.

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prefixlb/prefixlb/backend"
)

const user1Secret = "PRIVATE-USER1-COMPLETION"

// Defect 1: a backend that sends more than it frames leaves bytes on the connection. Another
// user's request must never read them: user 2 and user 3 get exactly their own responses, and
// user 1's text is in no log line.
func TestMisframedResponseNeverReachesNextUser(t *testing.T) {
	text := `{"user":1,"text":"` + user1Secret + ` café, naïve, señor, über"}`
	chunked := chunkedHead + chunk(text) + "0\r\n\r\n"
	headOnly := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(text))
	for _, tt := range []struct {
		name   string
		method string // user 1's
		resp   string // user 1's response, written at once
		late   string // written after user 1 has its response: it waits in the socket, not in the proxy's buffer
	}{
		{name: "content-length counted in characters", method: http.MethodPost,
			resp: fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", utf8.RuneCountInString(text), text)},
		{name: "content-length counted in characters, tail late", method: http.MethodPost,
			resp: fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", utf8.RuneCountInString(text), text[:utf8.RuneCountInString(text)]),
			late: text[utf8.RuneCountInString(text):]},
		{name: "body on a HEAD reply", method: http.MethodHead, resp: headOnly + text},
		{name: "body on a HEAD reply, late", method: http.MethodHead, resp: headOnly, late: text},
		{name: "stray CRLF after a chunked response", method: http.MethodPost, resp: chunked + "\r\n"},
		{name: "stray CRLF after a chunked response, late", method: http.MethodPost, resp: chunked, late: "\r\n"},
		{name: "a chunk after the last chunk", method: http.MethodPost, resp: chunked + chunk(text)},
		{name: "a chunk after the last chunk, late", method: http.MethodPost, resp: chunked, late: chunk(text)},
	} {
		for _, overTLS := range []bool{false, true} {
			name := tt.name
			if overTLS {
				name += ", TLS"
			}
			t.Run(name, func(t *testing.T) { misframedTwoUsers(t, overTLS, tt.method, tt.resp, tt.late) })
		}
	}
}

// misframedTwoUsers runs one case of TestMisframedResponseNeverReachesNextUser: user 1 gets
// resp (then late), users 2 and 3 must get exactly their own responses.
func misframedTwoUsers(t *testing.T, overTLS bool, method, resp, late string) {
	var tlsCfg *tls.Config
	var pool *x509.CertPool
	if overTLS {
		tlsCfg, pool = testTLS(t)
	}
	user1Done, lateWritten := make(chan struct{}), make(chan struct{}, 1)
	be := newRawBackendTLS(t, tlsCfg, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := readRequest(br)
			if err != nil {
				return
			}
			switch u := req.Header.Get("X-Test-User"); u {
			case "1":
				if _, err := io.WriteString(c, resp); err != nil {
					return
				}
				if late != "" {
					select {
					case <-user1Done:
					case <-time.After(testTimeout):
						return
					}
					_, _ = io.WriteString(c, late)
					lateWritten <- struct{}{}
				}
			default:
				if _, err := io.WriteString(c, jsonResponse(`{"user":`+u+`}`)); err != nil {
					return
				}
			}
		}
	})
	log, logs := recordingLogger()
	_, url := startProxy(t, "round-robin", []string{be.URL()}, logTo(log), trustUpstreams(pool))
	c := testClient()
	if st, _ := userDo(t, c, method, url, "1"); st != 200 {
		t.Fatalf("user 1: status %d", st)
	}
	close(user1Done)
	if late != "" {
		recvWithin(t, lateWritten, testTimeout, "backend writing the late bytes")
	}
	for _, u := range []string{"2", "3"} {
		st, body := userDo(t, c, http.MethodPost, url, u)
		if st != 200 || body != `{"user":`+u+`}` {
			t.Errorf("user %s got %d %q, want 200 {\"user\":%s}", u, st, body, u)
		}
		if strings.Contains(body, user1Secret) {
			t.Errorf("user %s received user 1's completion", u)
		}
	}
	if strings.Contains(logs.Text(), user1Secret) {
		t.Errorf("user 1's completion text is in the log: %.400s", logs.Text())
	}
}

// Defect 4: a backend that answers 101 has switched the connection to another protocol. The
// client gets a generic 502, the connection is closed, never pooled, and the next user gets
// their own answer. 100 and 103 before the final response are consumed and the connection
// stays reusable.
func TestUpgradeResponseIsNeverRelayedOrPooled(t *testing.T) {
	const tunnel = "TUNNEL-BYTES-OF-USER-1"
	for _, tt := range []struct {
		name      string
		resp      string
		status    int    // user 1's
		body      string // user 1's, exactly ("" : the proxy's JSON error)
		reuseConn bool   // user 2 goes over user 1's connection
	}{
		{name: "101 switching protocols", status: 502,
			resp: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" + tunnel},
		{name: "100 and 103 before the response", status: 200, body: `{"user":1}`, reuseConn: true,
			resp: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" + jsonResponse(`{"user":1}`)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			be := newRawBackend(t, func(c net.Conn, br *bufio.Reader) {
				for {
					req, err := readRequest(br)
					if err != nil {
						return
					}
					resp := jsonResponse(`{"user":` + req.Header.Get("X-Test-User") + `}`)
					if req.Header.Get("X-Test-User") == "1" {
						resp = tt.resp
					}
					if _, err := io.WriteString(c, resp); err != nil {
						return
					}
				}
			})
			log, logs := recordingLogger()
			_, url := startProxy(t, "round-robin", []string{be.URL()}, logTo(log))
			c := testClient()
			st, body := userDo(t, c, http.MethodPost, url, "1")
			if st != tt.status {
				t.Fatalf("user 1: status %d %q, want %d", st, body, tt.status)
			}
			if tt.body != "" && body != tt.body {
				t.Errorf("user 1: body %q, want %q", body, tt.body)
			}
			if tt.body == "" {
				checkErrorBody(t, body, 502, msgInvalidResponse, be.Addr(), tunnel)
				eventually(t, 5*time.Second, "the upgraded connection closed by the proxy", func() bool { return be.finished.Load() == 1 })
			}
			st, body = userDo(t, c, http.MethodPost, url, "2")
			if st != 200 || body != `{"user":2}` {
				t.Errorf("user 2 got %d %q, want 200 {\"user\":2}", st, body)
			}
			if n := be.accepted.Load(); (n == 1) != tt.reuseConn {
				t.Errorf("backend accepted %d connections; reuse expected: %v", n, tt.reuseConn)
			}
			if strings.Contains(logs.Text(), tunnel) {
				t.Errorf("tunnel bytes in the log")
			}
		})
	}
}

// Client messages of the proxy's own errors (errors.go): the failure class, never details.
const (
	msgConnect         = "upstream connect error"
	msgInvalidResponse = "upstream sent an invalid response"
	msgClosedEarly     = "upstream closed the connection before responding"
	msgHeaderTimeout   = "upstream response headers timeout"
)

// checkErrorBody checks an OpenAI-shaped proxy error: the status's code, the class message,
// and none of the forbidden strings.
func checkErrorBody(t *testing.T, body string, status int, msg string, forbidden ...string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body is not JSON: %v: %.300q", err, body)
	}
	if e.Error.Code != fmt.Sprintf("prefixlb_%d", status) || !strings.HasPrefix(e.Error.Message, msg) {
		t.Errorf("error body %q, want code prefixlb_%d and a message starting %q", body, status, msg)
	}
	for _, f := range forbidden {
		if strings.Contains(body, f) {
			t.Errorf("error body %q contains %q", body, f)
		}
	}
}

// Defect 6: a backend that answers 413 before reading a large body and closes makes the
// proxy's write fail. The answer is in the socket: the client gets it, and a 4xx never counts
// toward ejection.
func TestEarlyErrorResponseIsRelayed(t *testing.T) {
	const answer = `{"error":{"message":"request too large for this replica","type":"invalid_request_error"}}`
	be := newRawBackend(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil { // headers only; the body stays unread
			return
		}
		_, _ = io.WriteString(c, fmt.Sprintf("HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer))
		// Closing with the body unread makes the kernel reset the connection.
	})
	s, url := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
		o.Health.MaxEjectedPercent = 100 // the one backend may be ejected: 5 counted failures would
	})
	big := bytes.Repeat([]byte("x"), 16<<20) // far beyond the socket buffers: the write must fail
	c := testClient()
	for i := 0; i < 10; i++ {
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(big))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 413 || string(b) != answer {
			t.Fatalf("request %d: %d %.300q, want the backend's 413 %q", i, resp.StatusCode, b, answer)
		}
	}
	waitInFlightZero(t, s)
	b := s.Backends()[0]
	if st := s.Health().State(b); !b.Healthy() || st.PassiveFailures != 0 || !st.EjectedUntil.IsZero() {
		t.Errorf("backend that answered 413 is counted as failing: healthy %v, %+v", b.Healthy(), st)
	}
}

// Defect 10: error bodies name the failure class; neither they nor any log line, at any
// level, carry the bytes a backend sent or (in bodies) the backend's address. The per-request
// line names the class; the debug line a sanitized detail.
func TestErrorsCarryNoUpstreamBytesOrAddresses(t *testing.T) {
	const secret = "SECRET-MARKER-8f3a"
	respond := func(raw string) func(c net.Conn, br *bufio.Reader) {
		return func(c net.Conn, br *bufio.Reader) {
			if _, err := readRequest(br); err == nil {
				_, _ = io.WriteString(c, raw)
			}
		}
	}
	for _, tt := range []struct {
		name   string
		serve  func(c net.Conn, br *bufio.Reader) // nil: a dead port
		silent bool
		status int
		msg    string
		detail string // in the debug log
	}{
		{name: "garbage status line", serve: respond("HTTP/1.1 2OO " + secret + "\r\nContent-Length: 0\r\n\r\n"), status: 502, msg: msgInvalidResponse},
		{name: "invalid header", serve: respond("HTTP/1.1 200 OK\r\nX-Broken " + secret + "\r\nContent-Length: 0\r\n\r\n"), status: 502, msg: msgInvalidResponse},
		{name: "not HTTP", serve: respond(strings.Repeat(secret+" ", 200) + "\r\n\r\n"), status: 502, msg: msgInvalidResponse},
		{name: "closes before responding", serve: respond("HTTP/1.1 200 OK\r\nX-Partial: " + secret), status: 502, msg: msgClosedEarly},
		{name: "dead backend", status: 502, msg: msgConnect, detail: "connection refused"},
		{name: "silent backend", silent: true, status: 504, msg: msgHeaderTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var url, addr string
			switch {
			case tt.silent:
				be := newRawBackend(t, func(c net.Conn, br *bufio.Reader) { _, _ = io.Copy(io.Discard, br) })
				url, addr = be.URL(), be.Addr()
			case tt.serve == nil:
				url = deadURL(t)
				addr = strings.TrimPrefix(url, "http://")
			default:
				be := newRawBackend(t, tt.serve)
				url, addr = be.URL(), be.Addr()
			}
			log, logs := recordingLogger()
			_, purl := startProxy(t, "round-robin", []string{url}, func(o *Options) {
				o.Log = log
				o.Timeouts.ResponseHeader = 300 * time.Millisecond
			})
			st, body := userDo(t, testClient(), http.MethodPost, purl, "1")
			if st != tt.status {
				t.Fatalf("status %d %q, want %d", st, body, tt.status)
			}
			host, _, _ := net.SplitHostPort(addr)
			checkErrorBody(t, body, tt.status, tt.msg, secret, addr, host+":")
			lines := requestLines(t, logs, 1)
			if text := logs.Text(); strings.Contains(text, secret) || strings.Contains(text, "contents:") {
				t.Errorf("backend bytes in the log: %.600s", text)
			}
			if got, _ := lines[0]["error"].(string); !strings.HasPrefix(got, tt.msg) {
				t.Errorf("request log line error %q, want the class %q", got, tt.msg)
			}
			if tt.detail != "" && !strings.Contains(fmt.Sprint(lines[0]["detail"]), tt.detail) {
				t.Errorf("request log line (debug) detail %q, want %q", lines[0]["detail"], tt.detail)
			}
		})
	}

	// A chunk-size line of garbage after the response started: the client's stream is cut; the
	// log says so without the bytes.
	t.Run("garbage mid-stream", func(t *testing.T) {
		be := newRawBackend(t, respond("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"+secret+"\r\n"))
		log, logs := recordingLogger()
		s, purl := startProxy(t, "round-robin", []string{be.URL()}, logTo(log))
		resp, err := testClient().Post(purl+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr == nil || strings.Contains(string(b), secret) {
			t.Errorf("client read %q, %v; want a cut stream without the garbage", b, rerr)
		}
		waitInFlightZero(t, s)
		requestLines(t, logs, 1)
		if text := logs.Text(); strings.Contains(text, secret) {
			t.Errorf("backend bytes in the log: %.600s", text)
		}
	})
}

// silent tells a connection a finished response left quiet from one with bytes waiting: in
// the socket (data, EOF, reset), and under TLS also plaintext the TLS layer decrypted past
// what the reader took.
func TestIdleConnectionSilence(t *testing.T) {
	const greeting = "hello"
	for _, tt := range []struct {
		name    string
		overTLS bool
		peer    func(c net.Conn) // after the greeting was read
		consume func(c *uconn)   // what the proxy read after the peer acted
		want    bool
	}{
		{name: "quiet", want: true},
		{name: "data", peer: func(c net.Conn) { _, _ = io.WriteString(c, "x") }},
		{name: "EOF", peer: func(c net.Conn) { _ = c.Close() }},
		{name: "reset", peer: func(c net.Conn) { _ = c.(*net.TCPConn).SetLinger(0); _ = c.Close() }},
		{name: "buffered", peer: func(c net.Conn) { _, _ = io.WriteString(c, "xy") },
			consume: func(c *uconn) { _, _ = c.br.ReadByte() }},
		{name: "TLS quiet", overTLS: true, want: true},
		{name: "TLS data", overTLS: true, peer: func(c net.Conn) { _, _ = io.WriteString(c, "x") }},
		{name: "TLS close_notify", overTLS: true, peer: func(c net.Conn) { _ = c.Close() }},
		{
			// A 10-byte record, then a full 16 KiB one: the reader takes the first, then fills
			// its remaining 16 KiB - 10 from the second; 10 decrypted bytes stay in the TLS
			// layer, in neither the reader nor the socket.
			name: "TLS decrypted, unread", overTLS: true,
			peer: func(c net.Conn) {
				_, _ = io.WriteString(c, "0123456789")
				_, _ = io.WriteString(c, strings.Repeat("y", 16<<10))
			},
			consume: func(c *uconn) {
				if b, err := c.br.Peek(10); err != nil || string(b) != "0123456789" {
					t.Errorf("first record: %q %v", b, err)
				}
				if _, err := c.br.Peek(11); err != nil {
					t.Errorf("second record: %v", err)
				}
				if _, err := c.br.Discard(c.br.Buffered()); err != nil || c.br.Buffered() != 0 {
					t.Errorf("discard: %v", err)
				}
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var srvCfg *tls.Config
			var pool *x509.CertPool
			if tt.overTLS {
				srvCfg, pool = testTLS(t)
				srvCfg.DynamicRecordSizingDisabled = true // records of up to 16 KiB from the start
			}
			act, acted := make(chan struct{}), make(chan struct{})
			be := newRawBackendTLS(t, srvCfg, func(c net.Conn, br *bufio.Reader) {
				_, _ = io.WriteString(c, greeting)
				select {
				case <-act:
				case <-time.After(testTimeout):
					return
				}
				if tt.peer != nil {
					tt.peer(c)
				}
				close(acted)
				_, _ = io.Copy(io.Discard, br) // until the test ends
			})
			b, err := backend.New(be.URL(), 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			up := newUpstream(b, 5*time.Second, nil)
			if up.tls != nil {
				up.tls.RootCAs = pool
			}
			c, err := up.dial()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(testTimeout))
			got := make([]byte, len(greeting)) // as a response: it also takes TLS 1.3 session tickets
			if _, err := io.ReadFull(c.br, got); err != nil || string(got) != greeting {
				t.Fatalf("greeting: %q %v", got, err)
			}
			close(act)
			recvWithin(t, acted, testTimeout, "the peer acting")
			if tt.consume != nil {
				tt.consume(c)
			}
			if tt.peer != nil {
				// What the peer sent is on its way over loopback: wait until the socket shows it,
				// so that a wrong "silent" is not a race.
				eventually(t, 5*time.Second, "the peer's bytes reaching the socket", func() bool { return readable(c) || c.br.Buffered() > 0 || tt.consume != nil })
			}
			if got := c.silent(); got != tt.want {
				t.Errorf("silent() = %v, want %v", got, tt.want)
			}
		})
	}
}

// readable reports whether c's socket has data or EOF waiting.
func readable(c *uconn) bool {
	var buf [1]byte
	r := false
	_ = c.raw.Control(func(fd uintptr) {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		r = err != syscall.EAGAIN
	})
	return r
}
