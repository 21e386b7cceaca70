package proxy

// A request body that ends before its framing says (Content-Length, the last chunk) is bad
// input, and gets what bad input gets: a status, an OpenAI-shaped error and one log line
// naming the class. A client that half-closed after part of its body can still read the
// 400; one that reset the connection cannot, and the log line and a counter say it left.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
)

func TestIncompleteRequestBody(t *testing.T) {
	be := newBBHoldBackend(t)
	close(be.release)
	log, rec := recordingLogger()
	s, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
		o.Log = log
		o.Timeouts.ClientRead = 60 * time.Second
		o.Timeouts.ClientBodyIdle = 30 * time.Second // no case may end by a timeout
	})
	const chunkedHead = "POST /v1/upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
	clHead := func(n int) string {
		return fmt.Sprintf("POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", n)
	}
	big := string(bbPattern[:40<<10]) // past the first buffer (16 KiB) and the pre-read (8 KiB)
	const (
		halfClose = iota // the client shuts its sending side and reads the answer
		closeConn        // the client closes (FIN): nobody reads the answer
		reset            // the client resets the connection (RST) once the proxy reads the body
	)
	for _, c := range []struct {
		name          string
		head, body    string
		end           int
		status        int    // what the log line says, and a half-closed client reads
		class         string // the log line's
		incomplete    uint64 // prefixlb_request_body_incomplete_total
		disconnects   uint64 // prefixlb_client_disconnects_total
		waitForBuffer bool   // the proxy holds a body buffer before the client ends
	}{
		{"chunked, whole chunks, half-closed", chunkedHead, "5\r\nhello\r\n", halfClose, 400, "body_incomplete", 1, 0, false},
		{"chunked, mid-chunk, half-closed", chunkedHead, "100\r\nhello", halfClose, 400, "body_incomplete", 1, 0, false},
		{"chunked, past the first buffer, half-closed", chunkedHead, "10000\r\n" + big, halfClose, 400, "body_incomplete", 1, 0, true},
		{"chunked, closed", chunkedHead, "10000\r\n" + big, closeConn, 400, "body_incomplete", 1, 0, true},
		{"chunked, reset", chunkedHead, "10000\r\n" + big, reset, StatusClientClosedRequest, "body_client_gone", 0, 1, true},
		{"length, within the pre-read, half-closed", clHead(4000), "hello", halfClose, 400, "body_incomplete", 1, 0, false},
		{"length, past the pre-read, half-closed", clHead(100 << 10), big, halfClose, 400, "body_incomplete", 1, 0, true},
		{"length, past the pre-read, closed", clHead(100 << 10), big, closeConn, 400, "body_incomplete", 1, 0, true},
		{"length, past the pre-read, reset", clHead(100 << 10), big, reset, StatusClientClosedRequest, "body_client_gone", 0, 1, true},
		{"header, half-closed", "POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Le", "", halfClose, 400, "request_incomplete", 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec.Take()
			inc0, gone0 := s.m.bodyIncomplete.Get(), s.m.clientGone.Get()
			conn := bbDial(t, base, 20*time.Second).(*net.TCPConn)
			_, _ = io.WriteString(conn, c.head+c.body)
			if c.waitForBuffer {
				eventually(t, 10*time.Second, "the proxy reads the body", func() bool { return s.bodies.used.Load() > 0 })
			}
			switch c.end {
			case halfClose:
				_ = conn.CloseWrite()
				resp, b := bbRead(t, bufio.NewReader(conn), c.name)
				if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/json" ||
					!strings.Contains(string(b), `"code":"prefixlb_400"`) || !strings.Contains(string(b), "incomplete") || !resp.Close {
					t.Errorf("answer %d %q (%s), close %v; want a 400 JSON error naming the incomplete request, then the close",
						resp.StatusCode, b, resp.Header.Get("Content-Type"), resp.Close)
				}
			case closeConn:
				_ = conn.Close()
			case reset:
				_ = conn.SetLinger(0)
				_ = conn.Close()
			}
			var lines []logEntry
			eventually(t, 10*time.Second, "the request's log line", func() bool {
				lines = append(lines, rec.Take()...)
				return len(logsAtLeast(zapcore.InfoLevel, lines)) > 0
			})
			eventually(t, 10*time.Second, "the body budget back to 0", func() bool { return s.bodies.used.Load() == 0 })
			lines = logsAtLeast(zapcore.InfoLevel, append(lines, rec.Take()...))
			if len(lines) != 1 || lines[0].Message != "rejected request" {
				t.Fatalf("log lines %+v, want one rejected request", lines)
			}
			f := lines[0].Fields
			if fmt.Sprint(f["status"]) != fmt.Sprint(c.status) || f["class"] != c.class || f["remote"] == nil {
				t.Errorf("log line %v, want status %d, class %s and the remote", f, c.status, c.class)
			}
			if got := s.m.bodyIncomplete.Get() - inc0; got != c.incomplete {
				t.Errorf("prefixlb_request_body_incomplete_total +%d, want +%d", got, c.incomplete)
			}
			if got := s.m.clientGone.Get() - gone0; got != c.disconnects {
				t.Errorf("prefixlb_client_disconnects_total +%d, want +%d", got, c.disconnects)
			}
		})
	}
	if n := be.arrived.Load(); n != 0 {
		t.Errorf("the backend got %d incomplete requests", n)
	}
	// The proxy serves the next request.
	resp, err := testClient().Post(base+"/v1/upload", "application/json", strings.NewReader("{}"))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the next request: %v %v", resp, err)
	}
	_ = resp.Body.Close()
}
