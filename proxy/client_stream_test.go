package proxy

// The client side of a relayed response: a client that stops reading is cut after
// timeouts.client_write and frees its backend; an HTTP/1.0 client gets a close-delimited body,
// not chunks; a response that did not complete is logged and counted as what it was, not as a
// plain 200.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// metricsText is the server's Prometheus text.
func metricsText(s *Server) string {
	var b bytes.Buffer
	s.m.set.WritePrometheus(&b)
	return b.String()
}

// counterLines are the counter lines of the Prometheus text m that matter to these tests.
func counterLines(m string) string {
	var out []string
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, "prefixlb_stream_errors_total") || strings.HasPrefix(l, "prefixlb_client_disconnects_total") ||
			strings.HasPrefix(l, "prefixlb_requests_total") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// chunkedHead is the head of a chunked event stream.
const chunkedHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// chunk frames p as one chunk.
func chunk(p string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(p), p) }

// rawPost writes a streaming chat request on a new connection to the proxy at url.
func rawPost(t *testing.T, url, proto string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions %s\r\nHost: prefixlb\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", proto, len(body), body); err != nil {
		t.Fatal(err)
	}
	return c
}

// Defect 11: a client that sends a streaming request and never reads. Once the socket
// buffers are full the proxy's write makes no progress; after timeouts.client_write both
// connections are closed, the backend's in-flight slot is free, and the cut is counted.
func TestClientThatStopsReadingIsCut(t *testing.T) {
	const clientWrite = 300 * time.Millisecond
	cut := make(chan error, 1)
	be := newRawBackend(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := readRequest(br); err != nil {
			return
		}
		ev := chunk("data: " + strings.Repeat("t", 16<<10) + "\n\n")
		_ = c.SetWriteDeadline(time.Now().Add(testTimeout))
		for _, err := io.WriteString(c, chunkedHead); ; _, err = io.WriteString(c, ev) {
			if err != nil { // the proxy closed: reset, since what we sent sits unread
				cut <- err
				return
			}
		}
	})
	log, logs := recordingLogger()
	s, url := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
		o.Log = log
		o.Timeouts.ClientWrite = clientWrite
	})
	cc := rawPost(t, url, "HTTP/1.1") // and never read

	if err := recvWithin(t, cut, 15*time.Second, "backend connection closed after the client stopped reading"); isTimeout(err) {
		t.Fatalf("backend write: %v: the proxy never closed the upstream", err)
	}
	waitInFlightZero(t, s)
	// The client's connection is closed too: draining it ends, not at the read deadline.
	_ = cc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, cc); isTimeout(err) {
		t.Errorf("client connection still open: %v", err)
	}
	if l := requestLines(t, logs, 1)[0]; l["result"] != "client_write_timeout" || fmt.Sprint(l["status"]) != "200" {
		t.Errorf("request logged with status %v result %v, want 200 client_write_timeout", l["status"], l["result"])
	}
	if m := metricsText(s); !strings.Contains(m, `prefixlb_stream_errors_total{reason="client_write_timeout"} 1`) {
		t.Errorf("client write timeout not counted:\n%s", counterLines(m))
	}
	if st := s.Health().State(s.Backends()[0]); st.PassiveFailures != 0 {
		t.Errorf("a client that stopped reading counted against the backend: %+v", st)
	}
}

// A backend slower between chunks than timeouts.client_write is not the client's fault: a
// client that reads gets the whole stream.
func TestSlowBackendIsNotCutByClientWrite(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			if i > 0 && !fltSleep(r.Context(), 400*time.Millisecond) {
				return
			}
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer ts.Close()
	s, url := startProxy(t, "round-robin", []string{ts.URL}, func(o *Options) {
		o.Timeouts.ClientWrite = 150 * time.Millisecond
	})
	resp, err := testClient().Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
		t.Errorf("stream cut: %v after %q", err, b)
	}
	waitInFlightZero(t, s)
}

// HTTP/1.0 has no chunked coding: a stream of unknown length goes to an HTTP/1.0 client
// close-delimited (no Content-Length, no Transfer-Encoding, the connection closed at its end);
// a body of known length keeps its Content-Length.
func TestHTTP10ClientGetsCloseDelimitedBody(t *testing.T) {
	events := []string{"data: {\"i\":0}\n\n", "data: {\"i\":1}\n\n", "data: [DONE]\n\n"}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-User") == "json" {
			_, _ = io.WriteString(w, `{"ok":true}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			_, _ = io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	}))
	defer ts.Close()
	log, logs := recordingLogger()
	s, url := startProxy(t, "round-robin", []string{ts.URL}, logTo(log))

	c := rawPost(t, url, "HTTP/1.0")
	_ = c.SetReadDeadline(time.Now().Add(testTimeout))
	raw, err := io.ReadAll(c) // ends only when the proxy closes
	if err != nil {
		t.Fatalf("reading the HTTP/1.0 response: %v after %q", err, raw)
	}
	head, body, ok := strings.Cut(string(raw), "\r\n\r\n")
	if !ok || !strings.HasPrefix(head, "HTTP/1.") || !strings.HasPrefix(head[len("HTTP/1.x"):], " 200 ") {
		t.Fatalf("response %q", raw)
	}
	lower := strings.ToLower(head)
	if strings.Contains(lower, "transfer-encoding") || strings.Contains(lower, "content-length") {
		t.Errorf("HTTP/1.0 stream framed: %q", head)
	}
	if want := strings.Join(events, ""); body != want {
		t.Errorf("HTTP/1.0 body %q, want exactly %q (no chunk framing)", body, want)
	}
	waitInFlightZero(t, s)
	if l := requestLines(t, logs, 1)[0]; l["result"] != "ok" || fmt.Sprint(l["status"]) != "200" {
		t.Errorf("request logged with status %v result %v, want 200 ok", l["status"], l["result"])
	}

	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{}`))
	req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/1.0", 1, 0
	req.Header.Set("X-Test-User", "json")
	c2, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(testTimeout))
	if err := req.Write(c2); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c2), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != `{"ok":true}` || resp.ContentLength != int64(len(b)) {
		t.Errorf("HTTP/1.0 JSON response: %v %q, Content-Length %d", err, b, resp.ContentLength)
	}
}

// A response that did not complete keeps the status the client saw (200) and says in the log
// line's result and in prefixlb_stream_errors_total{reason} (or the client-disconnect counter)
// what happened to it.
func TestIncompleteResponseIsCountedAsWhatItWas(t *testing.T) {
	for _, tt := range []struct {
		name       string
		serve      func(c net.Conn, br *bufio.Reader)
		clientGone bool // the client reads the first event and leaves
		result     string
		series     string
	}{
		{
			name: "backend dies mid-stream",
			serve: func(c net.Conn, br *bufio.Reader) {
				if _, err := readRequest(br); err == nil {
					_, _ = io.WriteString(c, chunkedHead+chunk("data: {\"i\":0}\n\n"))
				}
			},
			result: "truncated", series: `prefixlb_stream_errors_total{reason="truncated"} 1`,
		},
		{
			name: "backend stalls mid-stream",
			serve: func(c net.Conn, br *bufio.Reader) {
				if _, err := readRequest(br); err == nil {
					_, _ = io.WriteString(c, chunkedHead+chunk("data: {\"i\":0}\n\n"))
					_, _ = io.Copy(io.Discard, br) // until the proxy closes
				}
			},
			result: "idle_timeout", series: `prefixlb_stream_errors_total{reason="idle_timeout"} 1`,
		},
		{
			name: "client leaves mid-stream",
			serve: func(c net.Conn, br *bufio.Reader) {
				if _, err := readRequest(br); err != nil {
					return
				}
				_ = c.SetWriteDeadline(time.Now().Add(testTimeout))
				for _, err := io.WriteString(c, chunkedHead); err == nil; _, err = io.WriteString(c, chunk("data: {}\n\n")) {
					time.Sleep(20 * time.Millisecond) // the point: a token every 20 ms until the proxy closes
				}
			},
			clientGone: true, result: "client_gone", series: `prefixlb_client_disconnects_total 1`,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			be := newRawBackend(t, tt.serve)
			log, logs := recordingLogger()
			s, url := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
				o.Log = log
				o.Timeouts.Idle = 300 * time.Millisecond
			})
			c := rawPost(t, url, "HTTP/1.1")
			_ = c.SetReadDeadline(time.Now().Add(testTimeout))
			br := bufio.NewReader(c)
			if tt.clientGone {
				if line, err := br.ReadString('}'); err != nil {
					t.Fatalf("first event: %v after %q", err, line)
				}
				_ = c.Close()
			} else {
				raw, err := io.ReadAll(br)
				if isTimeout(err) {
					t.Fatalf("stream never ended: %v", err)
				}
				if bytes.HasSuffix(raw, []byte("0\r\n\r\n")) {
					t.Errorf("a cut stream was closed like a complete one: %q", raw)
				}
			}
			waitInFlightZero(t, s)
			l := requestLines(t, logs, 1)[0]
			if fmt.Sprint(l["status"]) != "200" || l["result"] != tt.result {
				t.Errorf("request logged with status %v result %v, want 200 %s", l["status"], l["result"], tt.result)
			}
			m := metricsText(s)
			if !strings.Contains(m, tt.series) {
				t.Errorf("want %s in\n%s", tt.series, counterLines(m))
			}
			if !strings.Contains(m, `status="200"} 1`) {
				t.Errorf("prefixlb_requests_total does not keep the status the client saw (200):\n%s", counterLines(m))
			}
		})
	}
}
