package proxy

// A panic while serving one request fails that request, never the process (recover.go):
// panics injected through Server.testPanic at each stage of a request's serving, through the
// real proxy on 127.0.0.1 in front of a real backend.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
)

// panicMarker is what the injected panics panic with.
const panicMarker = "injected panic (recover_test)"

// holdPrompt in a request makes panicReplica send one event and then hold the stream open
// until the proxy closes the connection.
const holdPrompt = "hold the stream"

// panicReplica is a model server on 127.0.0.1 that streams two events and [DONE], or, for a
// request holding holdPrompt, one event and then nothing until its connection closes.
type panicReplica struct {
	srv    *httptest.Server
	closed chan struct{} // one per held stream whose connection the proxy closed
	mu     sync.Mutex
	bodies [][]byte        // the bodies received, in order
	remote []string        // the connection (client address) each came on
	gone   map[string]bool // the connections closed
}

func newPanicReplica(t *testing.T) *panicReplica {
	t.Helper()
	r := &panicReplica{closed: make(chan struct{}, 4), gone: map[string]bool{}}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.bodies = append(r.bodies, body)
		r.remote = append(r.remote, req.RemoteAddr)
		r.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"one\"}]}\n\n")
		w.(http.Flusher).Flush()
		if bytes.Contains(body, []byte(holdPrompt)) {
			select {
			case <-req.Context().Done():
				r.closed <- struct{}{}
			case <-time.After(testTimeout):
			}
			return
		}
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"two\"}]}\n\ndata: [DONE]\n\n")
	}))
	r.srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			r.mu.Lock()
			r.gone[c.RemoteAddr().String()] = true
			r.mu.Unlock()
		}
	}
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	return r
}

// received returns the bodies and connections of the requests so far.
func (r *panicReplica) received() (bodies [][]byte, remote []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.bodies...), append([]string(nil), r.remote...)
}

// closedConn reports whether the connection from addr was closed.
func (r *panicReplica) closedConn(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gone[addr]
}

// panicAt is a hook of startProxy's that makes the proxy's serving panic at stage once for
// each time armed is set.
func panicAt(stage panicStage) (hook func(*Server), armed *atomic.Bool) {
	armed = &atomic.Bool{}
	return func(s *Server) {
		s.testPanic = func(at panicStage) {
			if at == stage && armed.CompareAndSwap(true, false) {
				panic(panicMarker)
			}
		}
	}, armed
}

// panicChatBody is a streamed chat body of a few chunks whose user turn starts with prompt.
func panicChatBody(prompt string) string {
	return `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + prompt + ": " +
		strings.Repeat("the cache keeps every prefix it has seen ", 40) + `"}]}`
}

// logsAtLeast are the entries of logs at level lvl and above.
func logsAtLeast(lvl zapcore.Level, logs []logEntry) []logEntry {
	var out []logEntry
	for _, e := range logs {
		if e.Level >= lvl {
			out = append(out, e)
		}
	}
	return out
}

// errorLines are the error-level entries of logs.
func errorLines(logs []logEntry) []logEntry { return logsAtLeast(zapcore.ErrorLevel, logs) }

// infoLines counts the entries of logs at info level and above.
func infoLines(logs []logEntry) int { return len(logsAtLeast(zapcore.InfoLevel, logs)) }

// checkPanicLine checks that logs hold exactly one error line, the panic's: message msg, the
// panic's value, a stack cut to its bound that shows where the panic was raised, the request
// id and, when backend is set, the backend's name.
func checkPanicLine(t *testing.T, logs []logEntry, msg, backend string) {
	t.Helper()
	errs := errorLines(logs)
	if len(errs) != 1 {
		var msgs []string
		for _, e := range errs {
			msgs = append(msgs, e.Message)
		}
		t.Fatalf("%d error lines %q, want the panic's only", len(errs), msgs)
	}
	e := errs[0]
	if e.Message != msg {
		t.Fatalf("error line %q, want %q", e.Message, msg)
	}
	if got := fmt.Sprint(e.Fields["panic"]); got != panicMarker {
		t.Errorf("panic field %q, want %q", got, panicMarker)
	}
	stack := fmt.Sprint(e.Fields["stack"])
	if !strings.Contains(stack, "recover_test.go") || len(stack) > maxPanicStack {
		t.Errorf("stack of %d bytes (bound %d), naming the panic's site: %v", len(stack), maxPanicStack, strings.Contains(stack, "recover_test.go"))
	}
	if id := fmt.Sprint(e.Fields["request_id"]); id == "0" || id == "<nil>" {
		t.Errorf("request_id %s, want the request's", id)
	}
	if got := fmt.Sprint(e.Fields["backend"]); backend != "" && got != backend {
		t.Errorf("backend field %q, want %q", got, backend)
	}
}

// checkCounters checks prefixlb_key_panics_total and prefixlb_handler_panics_total.
func checkCounters(t *testing.T, s *Server, keyPanics, handlerPanics int) {
	t.Helper()
	m := metricsText(s)
	for name, want := range map[string]int{"prefixlb_key_panics_total": keyPanics, "prefixlb_handler_panics_total": handlerPanics} {
		if line := fmt.Sprintf("%s %d\n", name, want); !strings.Contains(m, line) {
			t.Errorf("metrics lack %q", strings.TrimSpace(line))
		}
	}
}

// checkReleased waits (bounded) until nothing is in flight, then checks that no backend's
// in-flight count or prefill tokens went past 0 either way.
func checkReleased(t *testing.T, s *Server) {
	t.Helper()
	waitInFlightZero(t, s)
	for _, b := range s.Backends() {
		if b.InFlight() != 0 || b.PrefillTokens() != 0 {
			t.Errorf("%s: in flight %d, prefill tokens %d; want 0, 0", b.Name, b.InFlight(), b.PrefillTokens())
		}
	}
}

// A panic at each stage of a request's serving: the request fails as the stage allows (the
// key: parse-fallback routing, body unchanged; before the response: a 500 with an
// OpenAI-shaped error; mid-stream: a cut stream; in the release: the client already has its
// answer), the backend's connection is closed and its lease released, one error line and a
// counter say what happened, and the proxy serves the next request.
func TestPanicContained(t *testing.T) {
	cases := []struct {
		name          string
		stage         panicStage
		hold          bool // the backend holds the stream open (it sees the proxy close it)
		status        int
		outcome       sseOutcome // of a 200's body
		keyPanics     int
		handlerPanics int
		line          string
		reached       bool // the request reached the backend
		lineBackend   bool // the log line names the backend
		lines         int  // info and above: the panic's, and the request line of a request that went on
	}{
		{"key build", stageKey, false, http.StatusOK, sseComplete, 1, 0, logKeyPanic, true, false, 2},
		{"after the pick", stagePick, false, http.StatusInternalServerError, 0, 0, 1, logHandlerPanic, false, true, 1},
		{"before the first byte", stageHead, true, http.StatusInternalServerError, 0, 0, 1, logHandlerPanic, true, true, 1},
		{"mid-stream relay", stageRelay, true, http.StatusOK, sseCut, 0, 1, logRelayPanic, true, true, 1},
		{"release", stageFinish, false, http.StatusOK, sseComplete, 0, 1, logFinishPanic, true, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newPanicReplica(t)
			log, rec := recordingLogger()
			hook, armed := panicAt(c.stage)
			s, base := startProxy(t, "prefix", []string{r.srv.URL}, logTo(log), hook)
			cl := testClient()
			prompt := "first request"
			if c.hold {
				prompt = holdPrompt
			}
			sent := panicChatBody(prompt)
			armed.Store(true)
			resp, err := cl.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(sent))
			if err != nil {
				t.Fatalf("the panicking request: %v", err)
			}
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			if c.status == http.StatusOK {
				events := newSSEReader(resp.Body)
				if got := events.drain(); got != c.outcome || events.events == 0 {
					t.Errorf("stream %v after %d events, want %v after at least one", got, events.events, c.outcome)
				}
			} else {
				checkInternalError(t, resp)
			}
			_ = resp.Body.Close()
			if armed.Load() {
				t.Fatal("the injected panic did not fire")
			}
			if c.hold {
				recvWithin(t, r.closed, testTimeout, "the backend sees the proxy close its connection")
			}
			checkReleased(t, s)

			bodies, remote := r.received()
			if !c.reached && len(bodies) != 0 || c.reached && len(bodies) != 1 {
				t.Fatalf("the backend received %d requests, want the panicking one: %v", len(bodies), c.reached)
			}
			if c.reached && c.stage != stageKey {
				// Closed, not pooled: a response may be half read on it, and the close makes
				// the engine stop generating.
				eventually(t, testTimeout, "the proxy closes the panicked request's backend connection", func() bool {
					return r.closedConn(remote[0])
				})
			}
			if c.stage == stageKey {
				if string(bodies[0]) != sent {
					t.Error("the body reached the backend changed")
				}
				if got := resp.Header.Get(HeaderRoute); !strings.HasPrefix(got, "parse-fallback;") {
					t.Errorf("%s %q, want parse-fallback", HeaderRoute, got)
				}
				if !strings.Contains(metricsText(s), "prefixlb_parse_fallbacks_total 1\n") {
					t.Error("the request is not counted as a parse fallback")
				}
			}
			backend := ""
			if c.lineBackend {
				backend = r.srv.URL
			}
			logs := rec.Take()
			checkPanicLine(t, logs, c.line, backend)
			if n := infoLines(logs); n != c.lines {
				t.Errorf("the panicked request logged %d lines at info and above, want %d", n, c.lines)
			}
			checkCounters(t, s, c.keyPanics, c.handlerPanics)

			// The proxy goes on serving, and routes by the key again.
			resp, err = cl.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(panicChatBody("next request")))
			if err != nil {
				t.Fatalf("the request after the panic: %v", err)
			}
			if events := newSSEReader(resp.Body); resp.StatusCode != http.StatusOK || events.drain() != sseComplete {
				t.Fatalf("the request after the panic: status %d, stream %v", resp.StatusCode, events.outcome())
			}
			if got := resp.Header.Get(HeaderRoute); strings.HasPrefix(got, "parse-fallback") {
				t.Errorf("the request after the panic routed %q", got)
			}
			_ = resp.Body.Close()
			checkReleased(t, s)
			if errs := errorLines(rec.Take()); len(errs) != 0 {
				t.Errorf("the request after the panic logged %d error lines", len(errs))
			}
			checkCounters(t, s, c.keyPanics, c.handlerPanics)
		})
	}
}

// checkInternalError checks a 500 of a contained panic: an OpenAI-shaped error with its fixed
// message, and the connection closed after it.
func checkInternalError(t *testing.T, resp *http.Response) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("500 body: %v", err)
	}
	if e.Error.Message != msgInternal || e.Error.Type != "server_error" || e.Error.Code != "prefixlb_500" || e.Error.Param != nil {
		t.Errorf("500 body %+v", e.Error)
	}
	if !resp.Close {
		t.Error("the connection stays open after the 500")
	}
}

// An HTTP/1.0 client's relay runs on a hijacked connection in its own goroutine
// (relayClosing): a panic in it closes the connection, which ends the close-delimited body
// without its [DONE], and releases the backend as in the relay of fasthttp's.
func TestPanicContainedHTTP10Relay(t *testing.T) {
	r := newPanicReplica(t)
	log, rec := recordingLogger()
	hook, armed := panicAt(stageRelay)
	s, base := startProxy(t, "prefix", []string{r.srv.URL}, logTo(log), hook)
	armed.Store(true)
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	body := panicChatBody(holdPrompt)
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.0\r\nHost: prefixlb\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(testTimeout))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the response: %v (the connection must be closed, not left hanging)", err)
	}
	if !bytes.HasPrefix(got, []byte("HTTP/1.0 200")) || !bytes.Contains(got, []byte(`"one"`)) || bytes.Contains(got, []byte("[DONE]")) {
		t.Fatalf("response %q: want the head and the first event, then the close", got)
	}
	recvWithin(t, r.closed, testTimeout, "the backend sees the proxy close its connection")
	checkReleased(t, s)
	logs := rec.Take()
	checkPanicLine(t, logs, logRelayPanic, r.srv.URL)
	if n := infoLines(logs); n != 1 {
		t.Errorf("the panicked request logged %d lines at info and above, want the panic's", n)
	}
	checkCounters(t, s, 0, 1)
	if st, _ := postCompletions(t, base, 1); st[0] != http.StatusOK {
		t.Fatalf("the request after the panic: status %d", st[0])
	}
}

// /debug/route keys the body as the data path does: a panic in the key build is contained,
// counted and logged, and the answer is the parse-fallback decision (the model still read).
func TestPanicContainedDebugRoute(t *testing.T) {
	r := newPanicReplica(t)
	log, rec := recordingLogger()
	hook, armed := panicAt(stageKey)
	s, _ := startProxy(t, "prefix", []string{r.srv.URL}, logTo(log), hook)
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	route := func() RouteInfo {
		t.Helper()
		resp, err := testClient().Post(admin.URL+"/debug/route", "application/json", strings.NewReader(panicChatBody("debug")))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var ri RouteInfo
		if err := json.NewDecoder(resp.Body).Decode(&ri); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/debug/route: status %d, %v", resp.StatusCode, err)
		}
		return ri
	}
	armed.Store(true)
	if ri := route(); !ri.Routed || ri.Parsed || ri.Reason != "parse-fallback" || ri.Model != "m" || ri.Chunks != 0 {
		t.Fatalf("/debug/route after a key panic: %+v", ri)
	}
	errs := errorLines(rec.Take())
	if len(errs) != 1 || errs[0].Message != logKeyPanic {
		t.Fatalf("error lines %v, want the key panic's", errs)
	}
	checkCounters(t, s, 1, 0)
	if ri := route(); !ri.Parsed || ri.Chunks == 0 {
		t.Fatalf("/debug/route after: %+v", ri)
	}
}
