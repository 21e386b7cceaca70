package proxy

// What backends that bend HTTP/1.1 get (upframe.go), and the h2c preface on the data port.
// Every backend is raw bytes on a 127.0.0.1 socket.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// fixedBackend answers every request on a connection with resp, keeping the connection
// open; with closeAfter it closes the connection after the first answer.
func fixedBackend(t *testing.T, resp string, closeAfter bool) *rawBackend {
	return newRawBackend(t, func(c net.Conn, br *bufio.Reader) {
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
			if _, err := io.WriteString(c, resp); err != nil || closeAfter {
				return
			}
		}
	})
}

// quirkClient is a client whose wait is well under the proxies' response_header timeout
// (quirkHeaderTimeout): a response that waits for that timeout fails it.
func quirkClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableCompression: true}}
}

const quirkHeaderTimeout = 60 * time.Second

// quirkOptions log to log (nil: nowhere) and wait long for a backend's response head.
func quirkOptions(log *zap.Logger) func(*Options) {
	return func(o *Options) {
		o.Log = log
		o.Timeouts.ResponseHeader = quirkHeaderTimeout
	}
}

// A status code outside 100–599 ("000" among them) is an invalid response: 502 when it is the
// only backend, retried on another before the first byte otherwise. It was relayed as 200.
func TestBackendStatusOutOfRangeIsInvalid(t *testing.T) {
	for _, code := range []string{"000", "099", "600", "999"} {
		t.Run(code, func(t *testing.T) {
			bad := fixedBackend(t, "HTTP/1.1 "+code+" OK\r\nContent-Length: 2\r\n\r\nhi", false)
			log, logs := recordingLogger()
			_, url := startProxy(t, "round-robin", []string{bad.URL()}, quirkOptions(log))
			st, body := userDo(t, quirkClient(), http.MethodPost, url, "1")
			if st != http.StatusBadGateway {
				t.Fatalf("status %d %q, want 502", st, body)
			}
			checkErrorBody(t, body, 502, msgInvalidResponse)
			if l := requestLines(t, logs, 1)[0]; l["result"] != "failed" || fmt.Sprint(l["status"]) != "502" {
				t.Errorf("log line %v, want status 502, result failed", l)
			}

			good := fixedBackend(t, jsonResponse(`{"ok":1}`), false)
			_, url = startProxy(t, "round-robin", []string{bad.URL(), good.URL()}, quirkOptions(nil))
			for i := range 4 {
				if st, body := userDo(t, quirkClient(), http.MethodPost, url, "1"); st != 200 || body != `{"ok":1}` {
					t.Errorf("request %d beside a good backend: %d %q, want the good backend's 200", i, st, body)
				}
			}
		})
	}
}

// A body cut short of its Content-Length is reported as an incomplete upstream response. One
// that fits the read-ahead is a 502 (retried elsewhere), never an empty reply logged as 200;
// a longer one reaches the client as its head and fewer bytes than it announced, then the
// close, and is logged and counted as truncated.
func TestBackendShortBodyIsReported(t *testing.T) {
	t.Run("read ahead", func(t *testing.T) {
		bad := fixedBackend(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n0123456789", true)
		log, logs := recordingLogger()
		_, url := startProxy(t, "round-robin", []string{bad.URL()}, quirkOptions(log))
		st, body := userDo(t, quirkClient(), http.MethodPost, url, "1")
		if st != http.StatusBadGateway {
			t.Fatalf("status %d %q, want 502", st, body)
		}
		checkErrorBody(t, body, 502, "upstream response ended early")
		if l := requestLines(t, logs, 1)[0]; fmt.Sprint(l["status"]) != "502" || l["error"] != "upstream response ended early" {
			t.Errorf("log line %v, want status 502 naming the early end", l)
		}
		good := fixedBackend(t, jsonResponse(`{"ok":1}`), false)
		_, url = startProxy(t, "round-robin", []string{bad.URL(), good.URL()}, quirkOptions(nil))
		for i := range 4 {
			if st, body := userDo(t, quirkClient(), http.MethodPost, url, "1"); st != 200 || body != `{"ok":1}` {
				t.Errorf("request %d beside a good backend: %d %q, want the good backend's 200", i, st, body)
			}
		}
	})
	t.Run("streamed", func(t *testing.T) {
		const announced, sent = 100000, 20000
		bad := fixedBackend(t, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", announced, strings.Repeat("x", sent)), true)
		log, logs := recordingLogger()
		s, url := startProxy(t, "round-robin", []string{bad.URL()}, quirkOptions(log))
		truncated0 := s.m.streamErrors[resultTruncated].Get()
		resp, err := quirkClient().Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || resp.ContentLength != announced || err == nil || len(b) >= announced {
			t.Errorf("client: %d, Content-Length %d, %d bytes, %v; want the 200 head, fewer bytes and an error", resp.StatusCode, resp.ContentLength, len(b), err)
		}
		if l := requestLines(t, logs, 1)[0]; l["result"] != "truncated" || l["error"] != "upstream response ended early" {
			t.Errorf("log line %v, want result truncated naming the early end", l)
		}
		if n := s.m.streamErrors[resultTruncated].Get() - truncated0; n != 1 {
			t.Errorf("prefixlb_stream_errors_total{reason=\"truncated\"} +%d, want +1", n)
		}
	})
}

// A chunked response that arrived whole is relayed whole: whitespace before a chunk
// extension's ";" (RFC 9112 BWS), trailer fields of any name, trailer lines in bare LF. The
// connection stays reusable. What is not chunked coding is an invalid response (502) in the
// first size line, read before the head goes to the client, and cuts the stream later.
func TestChunkedResponseLeniency(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
	const (
		whole = iota
		invalid
		cut
	)
	for _, c := range []struct {
		name, body string
		want       int
	}{
		{"space before the extension", "5 ; a=b\r\nhello\r\n0\r\n\r\n", whole},
		{"tab and space around it", "5\t; a = \"x;y\"\r\nhello\r\n0 ;last\r\n\r\n", whole},
		{"uppercase hex, leading zeros", "000A\r\nhello" + "hello\r\n000\r\n\r\n", whole},
		{"forbidden trailer fields", "5\r\nhello\r\n0\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nHost: elsewhere\r\nSet-Cookie: a=b\r\n\r\n", whole},
		{"trailer lines in bare LF", "5\r\nhello\r\n0\r\nX-Checksum: 1\n\n", whole},
		{"first size line not a size", "5 x\r\nhello\r\n0\r\n\r\n", invalid},
		{"a later size line not a size", "5\r\nhello\r\n5 x\r\nhello\r\n0\r\n\r\n", cut},
		{"chunk data longer than its size", "3\r\nhello\r\n0\r\n\r\n", cut},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := fixedBackend(t, head+c.body, false)
			log, logs := recordingLogger()
			_, url := startProxy(t, "round-robin", []string{be.URL()}, quirkOptions(log))
			for i := range 2 {
				resp, err := quirkClient().Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				l := requestLines(t, logs, i+1)[i]
				switch c.want {
				case whole:
					if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "hello") || err != nil || l["result"] != "ok" {
						t.Errorf("request %d: %d %q %v, logged %v; want 200 hello, result ok", i, resp.StatusCode, b, err, l["result"])
					}
				case invalid:
					if resp.StatusCode != http.StatusBadGateway {
						t.Errorf("request %d: %d %q, want 502", i, resp.StatusCode, b)
					}
					checkErrorBody(t, string(b), 502, msgInvalidResponse)
				case cut:
					if resp.StatusCode != 200 || err == nil || l["result"] != "truncated" {
						t.Errorf("request %d: %d %q %v, logged %v; want the stream cut, result truncated", i, resp.StatusCode, b, err, l["result"])
					}
				}
			}
			if n := be.accepted.Load(); c.want == whole && n != 1 {
				t.Errorf("backend accepted %d connections, want 1 (reused)", n)
			}
		})
	}
}

// A response head in bare LF is read at once, not after timeouts.response_header, and its
// connection is reused.
func TestBareLFResponseHead(t *testing.T) {
	for _, c := range []struct{ name, resp string }{
		{"all lines", "HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 2\n\nhi"},
		{"fields only", "HTTP/1.1 200 OK\r\nContent-Type: application/json\nContent-Length: 2\n\r\nhi"},
		{"chunked body", "HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n2\r\nhi\r\n0\r\n\r\n"},
		{"after a bare-LF 100 Continue", "HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\nContent-Length: 2\n\nhi"},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := fixedBackend(t, c.resp, false)
			_, url := startProxy(t, "round-robin", []string{be.URL()}, quirkOptions(nil))
			for i := range 2 {
				if st, body := userDo(t, quirkClient(), http.MethodPost, url, "1"); st != 200 || body != "hi" {
					t.Errorf("request %d: %d %q, want 200 hi", i, st, body)
				}
			}
			if n := be.accepted.Load(); n != 1 {
				t.Errorf("backend accepted %d connections, want 1 (reused)", n)
			}
		})
	}
}

// A response head over the 16 KiB read buffer is read up to maxResponseHead (64 KiB) and
// relayed; its connection is not pooled (its buffer grew). Past that it is an invalid
// response (502).
func TestLongResponseHead(t *testing.T) {
	field := func(n int) string { return strings.Repeat("v", n) }
	t.Run("40 KiB", func(t *testing.T) {
		be := fixedBackend(t, "HTTP/1.1 200 OK\r\nX-Big: "+field(40<<10)+"\r\nContent-Length: 2\r\n\r\nhi", false)
		_, url := startProxy(t, "round-robin", []string{be.URL()}, quirkOptions(nil))
		for i := range 2 {
			resp, err := quirkClient().Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "hi" || len(resp.Header.Get("X-Big")) != 40<<10 {
				t.Errorf("request %d: %d %q, X-Big of %d bytes; want 200 hi with the field", i, resp.StatusCode, b, len(resp.Header.Get("X-Big")))
			}
		}
		if n := be.accepted.Load(); n != 2 {
			t.Errorf("backend accepted %d connections, want 2 (a grown connection is not pooled)", n)
		}
	})
	t.Run("over 64 KiB", func(t *testing.T) {
		be := fixedBackend(t, "HTTP/1.1 200 OK\r\nX-Big: "+field(maxResponseHead)+"\r\nContent-Length: 2\r\n\r\nhi", false)
		_, url := startProxy(t, "round-robin", []string{be.URL()}, quirkOptions(nil))
		st, body := userDo(t, quirkClient(), http.MethodPost, url, "1")
		if st != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", st)
		}
		checkErrorBody(t, body, 502, msgInvalidResponse)
	})
}

// The HTTP/2 connection preface (h2c with prior knowledge) gets 505 like any other version
// than HTTP/1.0 and 1.1, also when it arrives in pieces; nothing is forwarded.
func TestH2CPrefaceGets505(t *testing.T) {
	be := fixedBackend(t, jsonResponse(`{}`), false)
	log, logs := recordingLogger()
	_, url := startProxy(t, "round-robin", []string{be.URL()}, quirkOptions(log))
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	for _, split := range []int{0, 7} {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), testTimeout)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(testTimeout))
		if split > 0 {
			_, _ = io.WriteString(c, preface[:split])
			time.Sleep(50 * time.Millisecond) // the point: the rest arrives in a read of its own
		}
		_, _ = io.WriteString(c, preface[split:])
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("split %d: %v", split, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = c.Close()
		if resp.StatusCode != http.StatusHTTPVersionNotSupported || !strings.Contains(string(b), `"code":"prefixlb_505"`) || !resp.Close {
			t.Errorf("split %d: %d %q close %v, want 505 with the JSON error, then the close", split, resp.StatusCode, b, resp.Close)
		}
	}
	if lines := logs.WithMessage("rejected request"); len(lines) != 2 || lines[0].Fields["class"] != "http_version" {
		t.Errorf("log lines %v, want two rejections of class http_version", lines)
	}
	if n := be.accepted.Load(); n != 0 {
		t.Errorf("backend reached %d times", n)
	}
}
