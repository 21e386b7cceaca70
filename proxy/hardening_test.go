package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/prefixlb/prefixlb/router"
)

type flakyListener struct {
	net.Listener
	fails int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, &net.OpError{Op: "accept", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

// Running out of file descriptors pauses accepting; it does not stop the server. The
// condition is counted on every failure and logged once (localResources), not once per retry.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	log, rec := recordingLogger()
	local := newLocalResources(metrics.NewSet(), log, time.Now)
	rl := &retryListener{Listener: &flakyListener{Listener: ln, fails: 3}, local: local, where: "accept"}
	accepted := make(chan struct{})
	defer close(accepted)
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			<-accepted // open until the test has accepted it
		}
	}()
	c, err := rl.Accept()
	if err != nil {
		t.Fatalf("Accept after EMFILE: %v", err)
	}
	c.Close()
	if temporaryAccept(errors.New("use of closed network connection")) {
		t.Error("a closed listener must end Serve")
	}
	if n := local.counts[localEMFILE].Get(); n != 3 {
		t.Errorf("prefixlb_local_resource_errors_total{kind=\"emfile\"} %d, want 3", n)
	}
	if lines := rec.WithMessage(logLocalResource); len(lines) != 1 || lines[0].Fields["kind"] != "emfile" || lines[0].Fields["where"] != "accept" {
		t.Errorf("log lines %+v, want one for kind emfile at accept", lines)
	}
}

// slowClientSlack is how much later than timeouts.client_read a slow client may be dropped
// on a loaded machine.
const slowClientSlack = time.Second

// A client that opens a connection and sends nothing, or half a header, is dropped after
// timeouts.client_read: not before it, and not much later.
func TestSlowClientIsDropped(t *testing.T) {
	const clientRead = 300 * time.Millisecond
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer ts.Close()
	_, url := startProxy(t, "round-robin", []string{ts.URL}, func(o *Options) {
		o.Timeouts.ClientRead = clientRead
	})
	for _, send := range []string{"", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo"} {
		start := time.Now() // client_read runs from the connection's accept
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), testTimeout)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, send)
		_ = c.SetReadDeadline(time.Now().Add(clientRead + slowClientSlack))
		_, err = io.ReadAll(c)
		d := time.Since(start)
		c.Close()
		t.Logf("connection sending %d bytes closed after %v", len(send), d)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("connection sending %q still open after %v (client_read %v)", send, clientRead+slowClientSlack, clientRead)
		} else if d < clientRead-clientRead/10 {
			t.Errorf("connection sending %q closed after %v, before client_read (%v)", send, d, clientRead)
		}
	}
}

// A request the backend refuses (400: context too long) teaches the index nothing.
// The index learns a prompt while the backend works on it; what a refusal (400, or a 503
// retried elsewhere) added is withdrawn again, and what the backend held before stays.
func TestRefusedRequestIsNotLearned(t *testing.T) {
	refuser := func(status int) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			switch {
			case status != 200:
				w.WriteHeader(status)
			case r.Header.Get("X-Refuse") != "":
				w.WriteHeader(400)
			}
		}))
	}
	ok, busy := refuser(200), refuser(503)
	defer ok.Close()
	defer busy.Close()
	doc := strings.Repeat("long prompt ", 500)
	body := func(text string) string {
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, text)
	}
	c := testClient()
	send := func(t *testing.T, url, b string, refuse bool) string {
		t.Helper()
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(b))
		if refuse {
			req.Header.Set("X-Refuse", "1")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get(HeaderBackend)
	}

	t.Run("400", func(t *testing.T) {
		s, url := startProxy(t, "prefix", []string{ok.URL}, nil)
		entries := func() int64 { return s.Policy().(*router.Prefix).Index().Entries() }
		send(t, url, body(doc), true)
		if n := entries(); n != 0 {
			t.Fatalf("a 400 left %d index entries", n)
		}
		send(t, url, body(doc), false)
		held := entries()
		if held == 0 {
			t.Fatal("a 200 left no index entries")
		}
		// The same document with a question appended, refused: the document's chunks were
		// held before and stay; the question's are withdrawn.
		send(t, url, body(doc+strings.Repeat("and a question ", 100)), true)
		if n := entries(); n != held {
			t.Errorf("after a refused extension: %d entries, want the %d held before", n, held)
		}
	})

	t.Run("503 retried elsewhere", func(t *testing.T) {
		s, url := startProxy(t, "prefix", []string{busy.URL, ok.URL}, nil)
		ix := s.Policy().(*router.Prefix).Index()
		for i := range 6 { // distinct prompts: some are placed on the busy backend first
			if got := send(t, url, body(fmt.Sprintf("%d %s", i, doc)), false); got != ok.URL {
				t.Fatalf("request %d answered by %q, want %q", i, got, ok.URL)
			}
		}
		for _, st := range ix.Stats(nil) {
			if st.Name == busy.URL && st.Entries != 0 {
				t.Errorf("the backend that answered 503 holds %d entries", st.Entries)
			}
			if st.Name == ok.URL && st.Entries == 0 {
				t.Errorf("the backend that answered holds no entries")
			}
		}
	})
}

// /readyz fails as soon as shutdown starts, while streams are still draining, so Kubernetes
// stops sending traffic before the pod goes away.
func TestReadyzFailsWhileDraining(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer ts.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock() // before ts.Close, which waits for the handler
	s, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	c := testClient()
	get := func() int {
		resp, err := c.Get(admin.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != 200 {
		t.Fatalf("/readyz %d before shutdown", code)
	}
	streamed := make(chan error, 1)
	go func() {
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatStreamBody))
		if err != nil {
			streamed <- err
			return
		}
		defer resp.Body.Close()
		if o := newSSEReader(resp.Body).drain(); o != sseComplete {
			streamed <- fmt.Errorf("stream %s", o)
			return
		}
		streamed <- nil
	}()
	recvWithin(t, entered, testTimeout, "the stream reaches the backend")
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	eventually(t, testTimeout, "/readyz fails once shutdown began", func() bool { return get() == 503 })
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a stream still held by its backend", err)
	default:
	}
	if n := s.Backends()[0].InFlight(); n != 1 {
		t.Errorf("in flight %d while draining, want the held stream", n)
	}
	unblock()
	if err := recvWithin(t, streamed, testTimeout, "the drained stream ends"); err != nil {
		t.Errorf("the stream in flight at shutdown: %v", err)
	}
	if err := recvWithin(t, shut, testTimeout, "Shutdown returns once the stream ended"); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// client_read bounds reading the request only: a response that takes longer (a long stream,
// or a backend slow to send headers) is not cut as a disconnect. fasthttp leaves the request's
// read deadline on the client socket while the response streams; the disconnect watchdog
// must not read that as the client leaving.
func TestClientReadDoesNotLimitResponses(t *testing.T) {
	const clientRead = 300 * time.Millisecond
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Slow-Headers") != "" {
			time.Sleep(3 * clientRead) // the point: headers slower than client_read
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 10 { // 10 × 100 ms: over three times client_read
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(clientRead / 3) // the point: a stream longer than client_read
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer ts.Close()
	_, url := startProxy(t, "round-robin", []string{ts.URL}, func(o *Options) {
		o.Timeouts.ClientRead = clientRead
	})
	c := testClient()
	for _, slow := range []bool{false, true} {
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		if slow {
			req.Header.Set("X-Slow-Headers", "1")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("slow headers %v: %v", slow, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Errorf("slow headers %v: status %d, err %v, body ends %q", slow, resp.StatusCode, err, tail(string(body), 20))
		}
	}
}

func tail(s string, n int) string { return s[max(len(s)-n, 0):] }

// A backend that restarted closed every pooled connection: a request that meets one stale
// connection is resent on a new one, not on the next stale one from the pool.
func TestStalePoolAfterBackendRestart(t *testing.T) {
	const held = 6
	release := make(chan struct{})
	var hold atomic.Bool
	var holding atomic.Int32
	hold.Store(true)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if hold.Load() {
			holding.Add(1)
			<-release
		}
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer ts.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock() // before ts.Close, which waits for held handlers, also when the test fails
	s, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
	c := testClient()
	post := func() (int, error) {
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	// Six concurrent requests held in the backend at once leave six idle upstream
	// connections in the pool.
	var wg sync.WaitGroup
	for range held {
		wg.Go(func() { _, _ = post() })
	}
	eventually(t, testTimeout, "six requests held in the backend at once", func() bool { return holding.Load() == held })
	hold.Store(false)
	unblock()
	wg.Wait()
	eventually(t, testTimeout, "six idle upstream connections pooled", func() bool { return soakIdleUpstreams(s) == held })
	ts.CloseClientConnections() // the "restart": every pooled connection is now closed by the backend
	for i := range 3 {
		if code, err := post(); err != nil || code != 200 {
			t.Errorf("request %d after the restart: %d, %v", i, code, err)
		}
	}
}

// A request in absolute form (as sent to a forward proxy) is forwarded and routed in origin
// form, and the userinfo in it is not passed on.
func TestAbsoluteFormRequestTarget(t *testing.T) {
	got := make(chan *http.Request, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r
	}))
	defer ts.Close()
	_, url := startProxy(t, "prefix", []string{ts.URL}, nil)
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat("absolute form ", 40))
	fmt.Fprintf(c, "POST http://user:pass@example.invalid/v1/chat/completions?x=1 HTTP/1.1\r\nHost: example.invalid\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	r := recvWithin(t, got, testTimeout, "the backend gets the request")
	if r.RequestURI != "/v1/chat/completions?x=1" || r.Header.Get("Authorization") != "" {
		t.Errorf("backend saw %q with Authorization %q", r.RequestURI, r.Header.Get("Authorization"))
	}
	if route := resp.Header.Get(HeaderRoute); !strings.HasPrefix(route, "cold") && !strings.HasPrefix(route, "match") {
		t.Errorf("route %q: the chat completion was not prefix-routed", route)
	}
}

// Unlearning a request that fails withdraws only what it added: request B (a long prompt
// sharing A's document) is learned, stalls and is abandoned by its client; meanwhile A, with
// the same document, is accepted. After B's unlearn, A's whole prompt must still match.
func TestUnlearnKeepsWhatAnotherRequestLearned(t *testing.T) {
	stalled := make(chan struct{}, 1)
	testDone := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Stall") != "" {
			stalled <- struct{}{}
			select {
			case <-r.Context().Done(): // prefixlb closed the connection: B's client left
			case <-testDone: // the test ended without that (it failed)
			}
			return
		}
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer ts.Close()
	other := httptest.NewServer(ts.Config.Handler) // a second backend, so that a match is "useful"
	defer other.Close()
	defer close(testDone) // before the Closes, which wait for a stalled handler
	s, url := startProxy(t, "prefix", []string{ts.URL, other.URL}, nil)
	doc := strings.Repeat("a shared document of some length ", 60)
	body := func(q string) string {
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, doc, q)
	}
	c := testClient()
	post := func(ctx context.Context, b string, stall bool) (string, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(b))
		if stall {
			req.Header.Set("X-Stall", "1")
		}
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		// The predicted TTFT moves with the load (B in flight or not): compare what matched.
		route, _, _ := strings.Cut(resp.Header.Get(HeaderRoute), ";predicted_ttft_us=")
		return route, nil
	}
	ctxB, leave := context.WithCancel(context.Background())
	defer leave() // before the backends close: their stalled handler waits for it
	doneB := make(chan struct{})
	go func() {
		defer close(doneB)
		_, _ = post(ctxB, body(strings.Repeat("question b ", 80)), true)
	}()
	// B is written to the backend (its handler runs) and learned (right after the write).
	recvWithin(t, stalled, testTimeout, "B reaches the backend")
	ix := s.Policy().(*router.Prefix).Index()
	eventually(t, testTimeout, "B is learned", func() bool { return ix.Entries() > 0 })
	a := body(strings.Repeat("question a ", 80))
	if _, err := post(context.Background(), a, false); err != nil {
		t.Fatal(err)
	}
	full, err := post(context.Background(), a, false) // A again: every chunk matches
	if err != nil || !strings.HasPrefix(full, "match;") {
		t.Fatalf("A's second route %q, %v", full, err)
	}
	leave()
	recvWithin(t, doneB, testTimeout, "B's client returns once it left")
	waitInFlightZero(t, s) // B's flow has finished, its unlearn included
	if got, err := post(context.Background(), a, false); err != nil || got != full {
		t.Errorf("after B was unlearned A routes %q, want %q as before", got, full)
	}
}
