package proxy

// Fault injection through the real proxy on loopback (issue #5): backends that die, go
// silent, fail every request or receive hostile bodies. Every test counts what the clients
// saw: succeeded, failed with an error the client can see (an HTTP error status or a cut
// stream), and lost (no response and no error: a hang, or a stream that ended cleanly
// without its [DONE]). Lost must always be 0. Run with -v for the numbers (t.Logf).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// fltCheckEvery is the active-check interval and timeout of fltStartProxy. The config allows
// no timeout longer than the interval; 250 ms keeps a check of a good backend on a loaded
// 2-core machine under -race from timing out three times in a row (which would mark it
// unhealthy), where the config minimum of 100 ms did not.
const fltCheckEvery = 250 * time.Millisecond

// fltStartProxy runs a proxy on 127.0.0.1 with active health checks on (every
// fltCheckEvery), scraping off and short ejections; mutate may change anything. It waits
// (bounded) until every backend has passed its first checks.
func fltStartProxy(t *testing.T, mode string, urls []string, mutate func(*configs.Config)) (*Server, string) {
	t.Helper()
	cfg := &configs.Config{Mode: mode, Listen: "127.0.0.1:0", Health: configs.Health{
		Interval:       configs.Duration(fltCheckEvery),
		Timeout:        configs.Duration(fltCheckEvery),
		BaseEjection:   configs.Duration(300 * time.Millisecond),
		MaxEjection:    configs.Duration(time.Second),
		ScrapeDisabled: true,
	}}
	s, base := serveConfig(t, cfg, urls, mutate)
	if !cfg.Health.Disabled {
		for _, b := range s.Backends() {
			if _, ok := fltWaitHealthy(b, true, 10*time.Second); !ok {
				t.Fatalf("%s never passed its first health checks", b.Name)
			}
		}
	}
	return s, base
}

// fltWaitHealthy polls b until its health is want (bounded) and returns how long it took.
func fltWaitHealthy(b *backend.Backend, want bool, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < limit {
		if b.Healthy() == want {
			return time.Since(start), true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start), b.Healthy() == want
}

// fltBackendByURL finds the proxy's backend for a configured URL.
func fltBackendByURL(t *testing.T, s *Server, url string) *backend.Backend {
	t.Helper()
	for _, b := range s.Backends() {
		if b.Name == url {
			return b
		}
	}
	t.Fatalf("no backend %s", url)
	return nil
}

// fltBackend is a backend on a fixed loopback port that can be killed (listener and every
// connection closed, as when the process dies) and started again on the same port.
type fltBackend struct {
	addr string
	h    http.Handler
	mu   sync.Mutex
	srv  *http.Server
}

func fltNewBackend(t *testing.T, h http.Handler) *fltBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &fltBackend{addr: ln.Addr().String(), h: h}
	b.serve(ln)
	t.Cleanup(b.kill)
	return b
}

func (b *fltBackend) URL() string { return "http://" + b.addr }

func (b *fltBackend) serve(ln net.Listener) {
	srv := &http.Server{Handler: b.h, ErrorLog: nil}
	b.mu.Lock()
	b.srv = srv
	b.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// kill closes the listener and every connection; handlers still running see their writes fail.
func (b *fltBackend) kill() {
	b.mu.Lock()
	srv := b.srv
	b.srv = nil
	b.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// restart listens on the same port again (bounded retries while the port is released).
func (b *fltBackend) restart(t *testing.T) {
	t.Helper()
	var err error
	for i := 0; i < 100; i++ {
		var ln net.Listener
		if ln, err = net.Listen("tcp", b.addr); err == nil {
			b.serve(ln)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("restart on %s: %v", b.addr, err)
}

// fltLLM is a streaming chat backend: /health answers 200; any other path reads the body,
// waits prefill (headers first when headersFirst, as vLLM/uvicorn do for stream=true), then
// writes events SSE events gap apart and [DONE]. It counts requests.
type fltLLM struct {
	prefill      time.Duration
	events       int
	gap          time.Duration
	headersFirst bool
	hits         atomic.Int64
}

func (l *fltLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return // 200
	}
	_, _ = io.Copy(io.Discard, r.Body)
	l.hits.Add(1)
	fl := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	if l.headersFirst {
		w.WriteHeader(200)
		fl.Flush()
	}
	if !fltSleep(r.Context(), l.prefill) {
		return
	}
	for i := 0; i < l.events; i++ {
		if i > 0 && !fltSleep(r.Context(), l.gap) {
			return
		}
		if _, err := fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i); err != nil {
			return
		}
		fl.Flush()
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

func fltSleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// fltResult is what one client request came to.
type fltResult int

const (
	fltOK        fltResult = iota // 200 and a complete stream ([DONE], or the whole body)
	fltErrStatus                  // an HTTP error status with a body (proxy's JSON error or the backend's)
	fltErrStream                  // 200 but the body was cut: the client's read failed
	fltErrConn                    // no response: the connection failed (an error, but no status)
	fltLost                       // no response and no error: hang, or a stream that ended cleanly without [DONE]
)

var fltResultNames = [...]string{"ok", "error-status", "cut-stream", "conn-error", "LOST"}

func (r fltResult) String() string { return fltResultNames[r] }

// fltTally counts results, safe for concurrent use.
type fltTally struct {
	n      [len(fltResultNames)]atomic.Int64
	mu     sync.Mutex
	byBE   map[string]int
	detail []string
}

func (ta *fltTally) add(r fltResult, be, detail string) {
	ta.n[r].Add(1)
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if ta.byBE == nil {
		ta.byBE = map[string]int{}
	}
	if r == fltOK {
		ta.byBE[be]++
	}
	if r != fltOK && len(ta.detail) < 20 {
		ta.detail = append(ta.detail, r.String()+": "+detail)
	}
}

func (ta *fltTally) sent() int64 {
	var n int64
	for i := range ta.n {
		n += ta.n[i].Load()
	}
	return n
}

func (ta *fltTally) get(r fltResult) int64 { return ta.n[r].Load() }

func (ta *fltTally) String() string {
	return fmt.Sprintf("sent %d: ok %d, error-status %d, cut-stream %d, conn-error %d, lost %d",
		ta.sent(), ta.get(fltOK), ta.get(fltErrStatus), ta.get(fltErrStream), ta.get(fltErrConn), ta.get(fltLost))
}

// fltClient is a client with its own connection pool and testTimeout per request (fltDo
// sets a shorter limit of its own).
func fltClient() *http.Client { return testClient() }

// fltDo sends one request and classifies it. stream says the body must end with [DONE]. A
// request that takes longer than limit counts as lost (the proxy left the client hanging).
func fltDo(c *http.Client, method, url string, body []byte, stream bool, limit time.Duration) (res fltResult, status int, be, route, detail string) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fltLost, 0, "", "", "no response within " + limit.String()
		}
		return fltErrConn, 0, "", "", err.Error()
	}
	defer resp.Body.Close()
	be, route = resp.Header.Get(HeaderBackend), resp.Header.Get(HeaderRoute)
	if resp.StatusCode == 200 && stream {
		sr := newSSEReader(resp.Body)
		o := sr.drain()
		switch {
		case ctx.Err() != nil:
			return fltLost, 200, be, route, "body hung"
		case o == sseCut:
			return fltErrStream, 200, be, route, fmt.Sprintf("after %d bytes: %v", sr.bytes, sr.err)
		case o == sseUnterminated:
			return fltLost, 200, be, route, fmt.Sprintf("stream ended cleanly without [DONE] after %d bytes", sr.bytes)
		}
		return fltOK, 200, be, route, ""
	}
	b, err := io.ReadAll(resp.Body)
	switch {
	case ctx.Err() != nil:
		return fltLost, resp.StatusCode, be, route, "body hung"
	case resp.StatusCode != 200:
		if len(b) == 0 && err == nil {
			return fltErrStatus, resp.StatusCode, be, route, fmt.Sprintf("status %d, empty body", resp.StatusCode)
		}
		return fltErrStatus, resp.StatusCode, be, route, fmt.Sprintf("status %d: %.200s", resp.StatusCode, b)
	case err != nil:
		return fltErrStream, 200, be, route, fmt.Sprintf("after %d bytes: %v", len(b), err)
	}
	return fltOK, 200, be, route, ""
}

// fltChatBody is a streaming chat request of conversation conv at turn turn: a long system
// prompt per conversation (several chunks) and one user message per turn.
func fltChatBody(conv, turn int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"system","content":"`)
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&sb, "Conversation %d follows policy clause %d carefully. ", conv, i)
	}
	sb.WriteString(`"}`)
	for i := 0; i <= turn; i++ {
		fmt.Fprintf(&sb, `,{"role":"user","content":"question %d"}`, i)
		if i < turn {
			sb.WriteString(`,{"role":"assistant","content":"answer"}`)
		}
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// A backend dies after sending 200 and the SSE headers, before its first body byte (vLLM
// flushes stream headers at once, then queues and prefills): no byte reached the client, so
// the request must be retried on the other backend, as a connect error would be. The proxy
// does so: it sends the client nothing before the first body byte (fasthttp writes headers
// with the first chunk), so every request succeeds.
func TestFaultBackendDiesAfterHeadersBeforeFirstByte(t *testing.T) {
	ok := &fltLLM{events: 3}
	good := fltNewBackend(t, ok)
	dying := fltNewBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond) // prefill
		c, _, _ := w.(http.Hijacker).Hijack()
		_ = c.Close()
	}))
	s, url := startProxy(t, "round-robin", []string{dying.URL(), good.URL()}, nil)
	c := fltClient()
	var ta fltTally
	for i := 0; i < 6; i++ {
		res, _, be, _, detail := fltDo(c, "POST", url+"/v1/chat/completions", fltChatBody(i, 0), true, 20*time.Second)
		ta.add(res, be, detail)
	}
	waitInFlightZero(t, s)
	t.Logf("backend dies after headers, before the first byte: %s; details %q", &ta, ta.detail)
	fltRow(t, "backend sends stream headers then dies before the first byte (2 backends)", &ta, "-", "-")
	if ta.get(fltLost) != 0 {
		t.Errorf("%d requests lost", ta.get(fltLost))
	}
	if ta.get(fltOK) != ta.sent() {
		t.Errorf("%d of %d requests failed although no byte had reached the client (retry before the first byte); %q", ta.sent()-ta.get(fltOK), ta.sent(), ta.detail)
	}
}

// fltRow logs one line of the fault table (grep "fault-table" in -v output).
func fltRow(t *testing.T, fault string, ta *fltTally, eject, recover string) {
	t.Helper()
	t.Logf("fault-table | %s | sent %d | ok %d | failed with error %d (status %d, cut stream %d, conn error %d) | lost %d | eject %s | recover %s",
		fault, ta.sent(), ta.get(fltOK), ta.get(fltErrStatus)+ta.get(fltErrStream)+ta.get(fltErrConn),
		ta.get(fltErrStatus), ta.get(fltErrStream), ta.get(fltErrConn), ta.get(fltLost), eject, recover)
}

// fltLoad runs clients concurrent clients against url until stop is closed (each at most max
// requests). Each client walks through its own conversations, three turns each, so the
// prefix index learns them and new conversations keep being placed cold.
type fltLoad struct {
	ta   fltTally
	once sync.Once
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	conv map[int]string // conversation → backend of its last successful turn
}

func fltStartLoad(url string, clients, max int) *fltLoad {
	l := &fltLoad{stop: make(chan struct{}), conv: map[int]string{}}
	c := fltClient()
	for ci := 0; ci < clients; ci++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for k := 0; k < max; k++ {
				select {
				case <-l.stop:
					return
				default:
				}
				conv, turn := ci*100000+k/3, k%3
				res, _, be, _, detail := fltDo(c, "POST", url+"/v1/chat/completions", fltChatBody(conv, turn), true, 20*time.Second)
				l.ta.add(res, be, detail)
				if res == fltOK {
					l.mu.Lock()
					l.conv[conv] = be
					l.mu.Unlock()
				}
			}
		}()
	}
	return l
}

func (l *fltLoad) end() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// convOn returns a conversation last served by be (-1: none).
func (l *fltLoad) convOn(be string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, b := range l.conv {
		if b == be {
			return c
		}
	}
	return -1
}

func (l *fltLoad) okOn(be string) int {
	l.ta.mu.Lock()
	defer l.ta.mu.Unlock()
	return l.ta.byBE[be]
}

// fltMatch is how many leading chunks of body the index credits b with.
func fltMatch(s *Server, body []byte, b *backend.Backend) int {
	var k key.Key
	s.keys.Build([]byte("/v1/chat/completions"), body, &k)
	out := make([]int, 1)
	s.Policy().(*router.Prefix).Index().Match(k.Chunks, []*backend.Backend{b}, out)
	return out[0]
}

func fltIndexEntries(s *Server, b *backend.Backend) int64 {
	for _, st := range s.Policy().(*router.Prefix).Index().Stats(nil) {
		if st.Name == b.Name {
			return st.Entries
		}
	}
	return -1
}

// A backend killed under steady load (listener and connections closed, as a crashed process):
// requests that had not started streaming are retried elsewhere and succeed, streams cut
// mid-way end with a visible error, nothing is lost; the backend is ejected, its index
// entries stop counting (epoch bump), and when it comes back on the same port it passes two
// checks and takes traffic again.
func TestFaultBackendKilledUnderLoad(t *testing.T) {
	for _, v := range []struct {
		name         string
		headersFirst bool
	}{{"headers-after-prefill", false}, {"vllm-headers-first", true}} {
		t.Run(v.name, func(t *testing.T) { fltKillUnderLoad(t, v.headersFirst) })
	}
}

func fltKillUnderLoad(t *testing.T, headersFirst bool) {
	const clients = 6
	var llms [3]*fltLLM
	var bes [3]*fltBackend
	var urls []string
	for i := range bes {
		llms[i] = &fltLLM{prefill: 30 * time.Millisecond, events: 10, gap: 10 * time.Millisecond, headersFirst: headersFirst}
		bes[i] = fltNewBackend(t, llms[i])
		urls = append(urls, bes[i].URL())
	}
	s, url := fltStartProxy(t, "prefix", urls, nil)
	load := fltStartLoad(url, clients, 5000)
	defer load.end()

	// Warm up until every backend served something and holds index entries.
	eventually(t, 15*time.Second, "warm-up: every backend served 3 requests and holds index entries", func() bool {
		for _, u := range urls {
			if load.okOn(u) < 3 || fltIndexEntries(s, fltBackendByURL(t, s, u)) <= 0 {
				return false
			}
		}
		return true
	})
	vi := 0
	for i, u := range urls {
		if fltIndexEntries(s, fltBackendByURL(t, s, u)) > fltIndexEntries(s, fltBackendByURL(t, s, urls[vi])) {
			vi = i
		}
	}
	victim := fltBackendByURL(t, s, urls[vi])
	oldConv := load.convOn(urls[vi])
	if oldConv < 0 {
		t.Fatal("no conversation on the victim")
	}
	oldBody := fltChatBody(oldConv, 0)
	epoch, entries, matched := victim.Epoch(), fltIndexEntries(s, victim), fltMatch(s, oldBody, victim)
	if matched == 0 {
		t.Fatalf("conversation %d served by the victim is not in the index", oldConv)
	}
	before := load.ta.sent()

	// Kill while requests are in flight on the victim, at least one still in prefill (no
	// byte yet) and at least one streaming (its prompt tokens no longer pending).
	var k key.Key
	s.keys.Build([]byte("/v1/chat/completions"), fltChatBody(0, 2), &k)
	perReq := int64(k.PromptTokens) + 8 // the longest turn, with margin
	var inflight, prefill int64
	waitStart := time.Now()
	for {
		// Bounded: fails below. The window is often milliseconds wide, so poll fast.
		inflight, prefill = victim.InFlight(), victim.PrefillTokens()
		if inflight >= 2 && prefill > 0 && prefill <= (inflight-1)*perReq {
			break
		}
		if time.Since(waitStart) > 10*time.Second {
			t.Fatalf("within 10 s the victim never had a request in prefill and one streaming at once (last: %d in flight, %d prefill tokens)", inflight, prefill)
		}
		time.Sleep(200 * time.Microsecond)
	}
	t.Logf("kill window reached after %v", time.Since(waitStart).Round(time.Millisecond))
	bes[vi].kill()
	ejectIn, ok := fltWaitHealthy(victim, false, 10*time.Second)
	if !ok {
		t.Fatalf("killed backend still healthy after %v", ejectIn)
	}
	st := s.Health().State(victim)
	how := "active checks"
	if st.Ejections > 0 {
		how = "passive ejection"
	}
	// Stay down until active checks call it unhealthy and any passive ejection (300 ms) has
	// ended: its return is then up to the active checks. (A passive ejection that ends first
	// lets it be tried again, and ejected again: correct, and not what is measured here.)
	eventually(t, 10*time.Second, "active checks call the dead backend unhealthy and its ejection ends", func() bool {
		st := s.Health().State(victim)
		return !st.ActiveHealthy && st.EjectedUntil.IsZero()
	})
	// Attempts dispatched to it before that have failed over. From here on it must get no
	// request while 20 more go to the others.
	eventually(t, 10*time.Second, "the attempts on the dead backend end", func() bool { return victim.InFlight() == 0 })
	servedDown, sentDown := victim.Served(), load.ta.sent()
	eventually(t, 10*time.Second, "20 requests while the backend is down", func() bool { return load.ta.sent() >= sentDown+20 })
	if d := victim.Served() - servedDown; d != 0 {
		t.Errorf("the dead backend got %d requests while unhealthy", d)
	}

	restartedAt := time.Now()
	bes[vi].restart(t)
	recoverIn, ok := fltWaitHealthy(victim, true, 10*time.Second)
	if !ok {
		t.Fatalf("restarted backend not healthy after %v: %+v", recoverIn, s.Health().State(victim))
	}
	if victim.Epoch() <= epoch {
		t.Errorf("epoch %d after the return, was %d: the index still trusts the old cache", victim.Epoch(), epoch)
	}
	if m := fltMatch(s, oldBody, victim); m != 0 {
		t.Errorf("after the return the index credits the restarted backend with %d chunks of an old conversation", m)
	}
	staleEntries := fltIndexEntries(s, victim)
	okBefore := load.okOn(urls[vi])
	eventually(t, 15*time.Second, "the returned backend serves a request", func() bool { return load.okOn(urls[vi]) > okBefore })
	trafficIn := time.Since(restartedAt)
	load.end()
	waitInFlightZero(t, s)

	t.Logf("victim %s: index entries %d before the kill (old conversation matched %d chunks), %d (stale, ignored) at the return, %d after new traffic; epoch %d -> %d",
		victim.Name, entries, matched, staleEntries, fltIndexEntries(s, victim), epoch, victim.Epoch())
	t.Logf("at the kill: %d in flight on the victim (%d prefill tokens pending)", inflight, prefill)
	t.Logf("%s; %d sent before the kill; retries %d; per backend %v; details %q", &load.ta, before, s.m.retries.Get(), load.ta.byBE, load.ta.detail)
	fault := "backend killed under load, " + map[bool]string{false: "headers after prefill", true: "headers first (vLLM)"}[headersFirst]
	fltRow(t, fault, &load.ta, fmt.Sprintf("%v (%s)", ejectIn.Round(time.Millisecond), how),
		fmt.Sprintf("healthy %v after restart, first success on it %v", recoverIn.Round(time.Millisecond), trafficIn.Round(time.Millisecond)))

	if n := load.ta.get(fltLost); n != 0 {
		t.Errorf("%d requests lost", n)
	}
	// The proxy itself never failed: every request got a response. Only streams cut mid-way
	// (at most one per client at the kill) may fail, and they fail visibly.
	if n := load.ta.get(fltErrConn); n != 0 {
		t.Errorf("%d requests got no HTTP response at all (bare connection close): requests that had no byte yet must be retried or answered 502", n)
	}
	if n := load.ta.get(fltErrStatus); n != 0 {
		t.Errorf("%d requests got an error status: requests not yet streaming must be retried on another backend", n)
	}
	if n := load.ta.get(fltErrStream); n > clients {
		t.Errorf("%d streams cut, more than the %d that can be mid-stream on the victim at once", n, clients)
	}
}

// fltSilent accepts connections and never answers (a wedged server: the kernel completes the
// handshake, the process never reads). It counts connections and how many the peer closed.
type fltSilent struct {
	ln       net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	accepted atomic.Int64
	closed   atomic.Int64 // connections the proxy closed (read returned EOF or error)
}

func fltNewSilent(t *testing.T) *fltSilent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &fltSilent{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			sl.accepted.Add(1)
			sl.mu.Lock()
			sl.conns = append(sl.conns, c)
			sl.mu.Unlock()
			go func() {
				_, _ = io.Copy(io.Discard, c) // ends when either side closes
				sl.closed.Add(1)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		sl.mu.Lock()
		defer sl.mu.Unlock()
		for _, c := range sl.conns {
			_ = c.Close()
		}
	})
	return sl
}

func (sl *fltSilent) URL() string { return "http://" + sl.ln.Addr().String() }

// A backend that accepts and never answers: timeouts.response_header fires, the request is
// retried on another backend and succeeds, counted in prefixlb_retries_total; after five
// timeouts the silent backend is ejected. The proxy closes every connection it opened to it.
func TestFaultSilentBackendHeaderTimeout(t *testing.T) {
	const headerTimeout = 300 * time.Millisecond
	setTimeout := func(c *configs.Config) { c.Timeouts.ResponseHeader = configs.Duration(headerTimeout) }

	t.Run("retried-elsewhere", func(t *testing.T) {
		sl := fltNewSilent(t)
		good := fltNewBackend(t, &fltLLM{events: 2})
		s, url := startProxy(t, "round-robin", []string{sl.URL(), good.URL()}, setTimeout)
		silent := fltBackendByURL(t, s, sl.URL())
		c := fltClient()
		var ta fltTally
		var slowest time.Duration
		start := time.Now()
		ejectAfter := time.Duration(0)
		for i := 0; i < 16; i++ {
			t0 := time.Now()
			res, _, be, _, detail := fltDo(c, "POST", url+"/v1/chat/completions", fltChatBody(i, 0), true, 20*time.Second)
			ta.add(res, be, detail)
			slowest = max(slowest, time.Since(t0))
			if ejectAfter == 0 && !silent.Healthy() {
				ejectAfter = time.Since(start)
			}
		}
		waitInFlightZero(t, s)
		retries := s.m.retries.Get()
		t.Logf("%s; retries %d; silent backend: %d connections, %d closed by the proxy; slowest request %v; ejected after %v",
			&ta, retries, sl.accepted.Load(), sl.closed.Load(), slowest.Round(time.Millisecond), ejectAfter.Round(time.Millisecond))
		fltRow(t, "silent backend (accept, never answer), response_header 300ms", &ta,
			fmt.Sprintf("%v (5 header timeouts, passive)", ejectAfter.Round(time.Millisecond)), "n/a (ejected 30 s)")
		if ta.get(fltOK) != ta.sent() {
			t.Errorf("not every request succeeded: %q", ta.detail)
		}
		if retries == 0 || retries > 5 {
			t.Errorf("prefixlb_retries_total = %d, want 1..5 (one per header timeout until the ejection)", retries)
		}
		if got := sl.accepted.Load(); uint64(got) != retries {
			t.Errorf("silent backend got %d connections, want one per retried request (%d)", got, retries)
		}
		if silent.Healthy() {
			t.Errorf("silent backend not ejected after %d header timeouts: %+v", retries, s.Health().State(silent))
		}
		if slowest > headerTimeout+5*time.Second {
			t.Errorf("slowest request took %v with a %v header timeout", slowest, headerTimeout)
		}
		// The proxy closes the connections of timed-out attempts.
		eventually(t, 5*time.Second, "the proxy closes every connection to the silent backend", func() bool {
			return sl.closed.Load() == sl.accepted.Load()
		})
	})

	// Nowhere else to go: the client gets 504 in the OpenAI shape after the header timeout.
	t.Run("only-backend", func(t *testing.T) {
		sl := fltNewSilent(t)
		s, url := startProxy(t, "prefix", []string{sl.URL()}, setTimeout)
		c := fltClient()
		var ta fltTally
		for i := 0; i < 3; i++ {
			t0 := time.Now()
			res, status, be, _, detail := fltDo(c, "POST", url+"/v1/chat/completions", fltChatBody(i, 0), true, 20*time.Second)
			ta.add(res, be, detail)
			if status != 504 || !strings.Contains(detail, "prefixlb_504") {
				t.Errorf("request %d: %s %d %q, want a 504 JSON error", i, res, status, detail)
			}
			if d := time.Since(t0); d > headerTimeout+5*time.Second {
				t.Errorf("request %d took %v", i, d)
			}
		}
		waitInFlightZero(t, s)
		fltRow(t, "silent only backend, response_header 300ms", &ta, "not ejected (single backend, 50% cap)", "n/a")
		if ta.get(fltLost) != 0 {
			t.Errorf("%d lost", ta.get(fltLost))
		}
	})

	// Headers and one event, then silence: timeouts.idle cuts the stream; the client sees an
	// error, not a clean end.
	t.Run("stalls-mid-stream", func(t *testing.T) {
		stall := fltNewBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"i\":0}\n\n")
			w.(http.Flusher).Flush()
			fltSleep(r.Context(), 20*time.Second)
		}))
		s, url := startProxy(t, "round-robin", []string{stall.URL()}, func(c *configs.Config) {
			c.Timeouts.Idle = configs.Duration(headerTimeout)
		})
		c := fltClient()
		var ta fltTally
		t0 := time.Now()
		res, _, be, _, detail := fltDo(c, "POST", url+"/v1/chat/completions", fltChatBody(0, 0), true, 20*time.Second)
		ta.add(res, be, detail)
		d := time.Since(t0)
		waitInFlightZero(t, s)
		fltRow(t, "backend stalls mid-stream, idle 300ms", &ta, "-", "-")
		if res != fltErrStream {
			t.Errorf("got %s (%s), want a cut stream", res, detail)
		}
		if d > headerTimeout+5*time.Second {
			t.Errorf("stalled stream ended after %v", d)
		}
		if got := s.m.streamErrors.Get(); got != 1 {
			t.Errorf("prefixlb_stream_errors_total = %d, want 1", got)
		}
	})
}

// fltStatusBackend answers every path, /health included, with the status next returns.
type fltStatusBackend struct {
	hits atomic.Int64
	next func(n int64) int
}

func (b *fltStatusBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	st := b.next(b.hits.Add(1))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st)
	fmt.Fprintf(w, `{"error":{"message":"status %d","code":%d}}`, st, st)
}

// Passive ejection by status: 5 consecutive 500s eject (the 500s reach the client as they
// are, not retried); 4xx never ejects and resets the count; 429 never ejects and is retried.
func TestFaultErrorStatusEjection(t *testing.T) {
	okBody := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	send := func(c *http.Client, url string, n int, ta *fltTally) {
		for i := 0; i < n; i++ {
			res, _, be, _, detail := fltDo(c, "POST", url+"/v1/chat/completions", okBody, false, 20*time.Second)
			ta.add(res, be, detail)
		}
	}
	okHandler := &fltStatusBackend{next: func(int64) int { return 200 }}

	t.Run("500-ejects-after-5", func(t *testing.T) {
		var broken atomic.Bool
		broken.Store(true)
		e500 := fltNewBackend(t, &fltStatusBackend{next: func(int64) int {
			if broken.Load() {
				return 500
			}
			return 200
		}})
		ok1, ok2 := fltNewBackend(t, okHandler), fltNewBackend(t, okHandler)
		s, url := startProxy(t, "round-robin", []string{e500.URL(), ok1.URL(), ok2.URL()}, func(c *configs.Config) {
			c.Health.BaseEjection = configs.Duration(time.Second)
			c.Health.MaxEjection = configs.Duration(2 * time.Second)
		})
		bad := fltBackendByURL(t, s, e500.URL())
		c := fltClient()
		var ta fltTally
		start := time.Now()
		var ejectIn time.Duration
		for i := 0; i < 30 && bad.Healthy(); i++ {
			send(c, url, 1, &ta)
		}
		ejectIn = time.Since(start)
		hitsAtEject := e500.h.(*fltStatusBackend).hits.Load()
		if bad.Healthy() {
			t.Fatalf("backend answering 500 not ejected after %d requests: %+v", ta.sent(), s.Health().State(bad))
		}
		if hitsAtEject != 5 {
			t.Errorf("ejected after %d 500s, want 5", hitsAtEject)
		}
		if ta.get(fltErrStatus) != hitsAtEject {
			t.Errorf("clients saw %d error statuses, want the %d 500s passed through", ta.get(fltErrStatus), hitsAtEject)
		}
		// While ejected the others serve everything: requests are sent only while the
		// ejection has comfortably long to run, so a slow machine sends fewer of them but
		// never one that the returning backend may rightly take.
		const ejectedMargin = 250 * time.Millisecond
		until := s.Health().State(bad).EjectedUntil
		var after fltTally
		for i := 0; i < 20 && time.Until(until) > ejectedMargin; i++ {
			send(c, url, 1, &after)
		}
		if after.sent() == 0 {
			t.Fatalf("the ejection (until %v) ended before a request could be sent", until)
		}
		if after.get(fltOK) != after.sent() || e500.h.(*fltStatusBackend).hits.Load() != hitsAtEject {
			t.Errorf("while ejected: %s, ejected backend hits %d (was %d)", &after, e500.h.(*fltStatusBackend).hits.Load(), hitsAtEject)
		}
		// Repaired: it returns when the ejection (1 s) ends, at the next housekeeping tick.
		broken.Store(false)
		recoverIn, ok := fltWaitHealthy(bad, true, 10*time.Second)
		if !ok {
			t.Fatalf("repaired backend still ejected after %v", recoverIn)
		}
		send(c, url, 9, &after)
		if got := e500.h.(*fltStatusBackend).hits.Load() - hitsAtEject; got == 0 || after.get(fltOK) != after.sent() {
			t.Errorf("after the return: %s, returned backend got %d", &after, got)
		}
		waitInFlightZero(t, s)
		all := fltTally{}
		for i := range all.n {
			all.n[i].Store(ta.n[i].Load() + after.n[i].Load())
		}
		fltRow(t, "backend answers 500 to everything (3 backends)", &all,
			fmt.Sprintf("%v after 5 consecutive 500s (passive)", ejectIn.Round(time.Millisecond)),
			fmt.Sprintf("%v after repair (1s ejection, 1s housekeeping tick)", recoverIn.Round(time.Millisecond)))
	})

	t.Run("4xx-never-ejects", func(t *testing.T) {
		e400 := fltNewBackend(t, &fltStatusBackend{next: func(int64) int { return 400 }})
		ok1 := fltNewBackend(t, okHandler)
		s, url := startProxy(t, "round-robin", []string{e400.URL(), ok1.URL()}, nil)
		b := fltBackendByURL(t, s, e400.URL())
		c := fltClient()
		var ta fltTally
		send(c, url, 200, &ta)
		waitInFlightZero(t, s)
		hits := e400.h.(*fltStatusBackend).hits.Load()
		fltRow(t, "backend answers 400 to everything (x100)", &ta, "never (correct)", "-")
		if hits != 100 || ta.get(fltErrStatus) != 100 || ta.get(fltOK) != 100 {
			t.Errorf("400 backend hits %d; %s: want 100 400s passed through and 100 OK", hits, &ta)
		}
		if !b.Healthy() || s.Health().State(b).PassiveFailures != 0 {
			t.Errorf("4xx counted against the backend: %+v", s.Health().State(b))
		}
	})

	t.Run("429-never-ejects", func(t *testing.T) {
		busy := fltNewBackend(t, &fltStatusBackend{next: func(int64) int { return 429 }})
		ok1 := fltNewBackend(t, okHandler)
		s, url := startProxy(t, "round-robin", []string{busy.URL(), ok1.URL()}, nil)
		b := fltBackendByURL(t, s, busy.URL())
		c := fltClient()
		var ta fltTally
		send(c, url, 200, &ta)
		waitInFlightZero(t, s)
		hits := busy.h.(*fltStatusBackend).hits.Load()
		fltRow(t, "backend answers 429 to everything (x100)", &ta, "never (correct)", "-")
		if ta.get(fltOK) != 200 {
			t.Errorf("%s: every 429 should have been retried on the other backend; %q", &ta, ta.detail)
		}
		// Round-robin's counter also advances on the retry's pick, so with two backends the
		// busy one is tried first every time (not asserted: fairness, not correctness).
		t.Logf("429 backend got %d of 200 first attempts; retries %d", hits, s.m.retries.Get())
		if hits < 100 || uint64(hits) != s.m.retries.Get() {
			t.Errorf("429 backend hits %d, retries %d, want one retry per 429 and at least 100", hits, s.m.retries.Get())
		}
		if !b.Healthy() {
			t.Errorf("429 ejected the backend: %+v", s.Health().State(b))
		}
	})

	// Four 500s, then a 400 (the server answered sanely): the count restarts, no ejection.
	t.Run("4xx-resets-the-count", func(t *testing.T) {
		flaky := fltNewBackend(t, &fltStatusBackend{next: func(n int64) int {
			if n%5 == 0 {
				return 400
			}
			return 500
		}})
		ok1 := fltNewBackend(t, okHandler)
		s, url := startProxy(t, "round-robin", []string{flaky.URL(), ok1.URL()}, nil)
		b := fltBackendByURL(t, s, flaky.URL())
		c := fltClient()
		var ta fltTally
		send(c, url, 100, &ta)
		waitInFlightZero(t, s)
		if !b.Healthy() || flaky.h.(*fltStatusBackend).hits.Load() != 50 {
			t.Errorf("four 500s and a 400, repeated, ejected the backend (hits %d): %+v", flaky.h.(*fltStatusBackend).hits.Load(), s.Health().State(b))
		}
	})
}

// fltEcho answers with the status the request asks for (X-Want-Status, default 200) and
// reports the exact body it received: its length and SHA-256.
func fltEcho() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(599)
			return
		}
		sum := sha256.Sum256(b)
		w.Header().Set("X-Body-Sha256", hex.EncodeToString(sum[:]))
		w.Header().Set("X-Body-Len", strconv.Itoa(len(b)))
		st := 200
		if v, err := strconv.Atoi(r.Header.Get("X-Want-Status")); err == nil {
			st = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st)
		fmt.Fprintf(w, `{"status":%d}`, st)
	})
}

// Hostile bodies through the real proxy in prefix mode: none crashes it, each is forwarded
// byte for byte, bodies that do not parse are routed parse-fallback (and counted), and the
// client gets the backend's status.
func TestFaultHostileInput(t *testing.T) {
	var urls []string
	for i := 0; i < 3; i++ {
		urls = append(urls, fltNewBackend(t, fltEcho()).URL())
	}
	s, base := startProxy(t, "prefix", urls, nil)

	big := strings.Repeat("lorem ipsum dolor sit amet ", 4<<20/27) // ≈ 4 MB
	deep := strings.Repeat("[", 100000)
	garbage := make([]byte, 64<<10)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range garbage {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		garbage[i] = byte(x)
	}
	var many strings.Builder
	many.WriteString(`{"model":"m","messages":[`)
	for i := 0; i < 100000; i++ {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`{"role":"user","content":"a"}`)
	}
	many.WriteString(`]}`)
	const fallback = "parse-fallback"
	const routed = "routed" // a prompt that parses: match, cold, overload or least-load
	cases := []struct {
		name, path string
		body       []byte
		status     int
		reason     string
		chunked    bool // no Content-Length: sent with Transfer-Encoding: chunked
	}{
		{"malformed-json", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}`), 400, fallback, false},
		{"trailing-garbage", "/v1/chat/completions", []byte(`{"model":"m","messages":[]} xyz`), 400, fallback, false},
		{"huge-unterminated-string", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"` + big), 400, fallback, false},
		{"huge-valid-prompt", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"` + big + `"}]}`), 200, routed, false},
		{"100k-messages", "/v1/chat/completions", []byte(many.String()), 200, routed, false},
		{"deep-nesting-open", "/v1/chat/completions", []byte(deep), 400, fallback, false},
		{"deep-nesting-balanced", "/v1/chat/completions", []byte(deep + strings.Repeat("]", 100000)), 400, fallback, false},
		{"deep-nesting-in-messages", "/v1/chat/completions", []byte(`{"model":"m","messages":` + deep + strings.Repeat("]", 100000) + `}`), 400, fallback, false},
		{"deep-nesting-in-content", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":` + strings.Repeat(`{"a":`, 50000) + `1` + strings.Repeat("}", 50000) + `}]}`), 400, fallback, false},
		{"model-not-a-string", "/v1/chat/completions", []byte(`{"model":42,"messages":[{"role":"user","content":"hi"}]}`), 400, fallback, false},
		{"messages-a-string", "/v1/chat/completions", []byte(`{"model":"m","messages":"hello"}`), 400, fallback, false},
		{"messages-null-entries", "/v1/chat/completions", []byte(`{"model":"m","messages":[null,1,"x"]}`), 400, fallback, false},
		{"content-a-number", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":42}]}`), 400, fallback, false},
		{"top-level-array", "/v1/chat/completions", []byte(`[{"model":"m"}]`), 400, fallback, false},
		{"top-level-null", "/v1/chat/completions", []byte(`null`), 400, fallback, false},
		{"cache-salt-object", "/v1/chat/completions", []byte(`{"model":"m","cache_salt":{},"messages":[{"role":"user","content":"hi"}]}`), 400, fallback, false},
		{"invalid-utf8-in-string", "/v1/chat/completions", []byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xc3\x28\"}]}"), 400, fallback, false},
		{"invalid-utf8-chunked", "/v1/chat/completions", []byte("{\"model\":\"\xed\xa0\x80\",\"messages\":[]}"), 400, fallback, true},
		{"binary-garbage", "/v1/chat/completions", garbage, 400, fallback, false},
		{"binary-garbage-chunked", "/v1/completions", garbage, 400, fallback, true},
		{"empty-body", "/v1/chat/completions", nil, 400, fallback, false},
		{"whitespace-body", "/v1/chat/completions", []byte(" \r\n\t "), 400, fallback, false},
		{"nul-bytes", "/v1/chat/completions", []byte("{\"model\":\"m\x00\",\"messages\":[\x00]}"), 400, fallback, false},
		{"completions-prompt-object", "/v1/completions", []byte(`{"model":"m","prompt":{"a":1}}`), 400, fallback, false},
		{"completions-mixed-token-ids", "/v1/completions", []byte(`{"model":"m","prompt":[1,2,"x",-5,1e99]}`), 400, fallback, false},
		{"responses-input-number", "/v1/responses", []byte(`{"model":"m","input":123}`), 400, fallback, false},
		{"huge-number", "/v1/chat/completions", []byte(`{"model":"m","max_tokens":1` + strings.Repeat("0", 100000) + `,"messages":[{"role":"user","content":"hi"}]}`), 400, routed, false},
		// model is optional (vLLM then serves its only model): routed on the prompt, not a fallback.
		{"missing-model", "/v1/chat/completions", []byte(`{"messages":[{"role":"user","content":"hi"}]}`), 200, routed, false},
		{"lone-surrogate-escape", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"\ud800\udfff\ud800"}]}`), 200, routed, false},
	}
	c := fltClient()
	var ta fltTally
	fallbacks := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rd io.Reader = bytes.NewReader(tc.body)
			if tc.chunked {
				rd = io.MultiReader(rd) // hides the length: Transfer-Encoding: chunked
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", base+tc.path, rd)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Want-Status", strconv.Itoa(tc.status))
			resp, err := c.Do(req)
			if err != nil {
				ta.add(fltErrConn, "", err.Error())
				t.Fatalf("no response: %v", err)
			}
			rb, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				ta.add(fltErrStream, "", err.Error())
				t.Fatalf("reading the response: %v", err)
			}
			if resp.StatusCode == 200 {
				ta.add(fltOK, resp.Header.Get(HeaderBackend), "")
			} else {
				ta.add(fltErrStatus, resp.Header.Get(HeaderBackend), tc.name)
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d (%.200s), want the backend's %d", resp.StatusCode, rb, tc.status)
			}
			sum := sha256.Sum256(tc.body)
			if got := resp.Header.Get("X-Body-Sha256"); got != hex.EncodeToString(sum[:]) {
				t.Errorf("backend received %s bytes (sha256 %.12s), sent %d (sha256 %.12s): body altered", resp.Header.Get("X-Body-Len"), got, len(tc.body), hex.EncodeToString(sum[:]))
			}
			route := resp.Header.Get(HeaderRoute)
			reason, _, _ := strings.Cut(route, ";")
			switch tc.reason {
			case fallback:
				fallbacks++
				if reason != fallback {
					t.Errorf("route %q, want %s", route, fallback)
				}
			case routed:
				if reason == fallback || reason == "passthrough" || reason == "" {
					t.Errorf("route %q, want a prefix decision", route)
				}
			}
			t.Logf("%d bytes -> %d, route %s", len(tc.body), resp.StatusCode, route)
		})
	}
	// Malformed HTTP itself: answered 400 (or closed), never a crash.
	for _, raw := range []string{
		"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("a", 200<<10) + "\r\n\r\n",
	} {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(conn, raw)
		resp, _ := io.ReadAll(io.LimitReader(conn, 4096))
		_ = conn.Close()
		line, _, _ := strings.Cut(string(resp), "\r\n")
		t.Logf("raw %.30q -> %q", raw, line)
		if len(resp) > 0 && !strings.HasPrefix(line, "HTTP/1.1 4") {
			t.Errorf("raw %.30q answered %q, want a 4xx", raw, line)
		}
	}
	// Still serving.
	res, status, _, _, detail := fltDo(c, "POST", base+"/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), false, 10*time.Second)
	if res != fltOK {
		t.Errorf("after the hostile input a normal request got %s %d %s", res, status, detail)
	}
	waitInFlightZero(t, s)
	if got := s.m.parseFallbacks.Get(); got != uint64(fallbacks) {
		t.Errorf("prefixlb_parse_fallbacks_total = %d, want %d", got, fallbacks)
	}
	fltRow(t, fmt.Sprintf("hostile bodies (%d kinds) + 4 malformed HTTP", len(cases)), &ta, "-", "-")
	if ta.get(fltErrConn)+ta.get(fltErrStream)+ta.get(fltLost) != 0 {
		t.Errorf("hostile input lost or broke requests: %s", &ta)
	}
}

// Clients that leave mid-stream (a user pressing stop) say nothing about the backend: however
// many do so at once, no backend is ejected, and the disconnects are counted as client
// disconnects, not stream errors. The proxy usually notices such a client by a failed write
// to it, before the watchdog's next peek.
func TestFaultClientCancelsDoNotEjectBackend(t *testing.T) {
	llm := &fltLLM{events: 2000, gap: 5 * time.Millisecond, headersFirst: true}
	var urls []string
	for i := 0; i < 3; i++ {
		urls = append(urls, fltNewBackend(t, llm).URL())
	}
	s, url := startProxy(t, "round-robin", urls, nil)
	const perBackend = 6
	n := perBackend * len(urls)
	// Open n streams (6 per backend), all past their first event, then close them all.
	c := fltClient()
	var bodies []io.ReadCloser
	var cancels []context.CancelFunc
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", bytes.NewReader(fltChatBody(i, 0)))
		resp, err := c.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		buf := make([]byte, 8)
		if _, err := io.ReadAtLeast(resp.Body, buf, 1); err != nil {
			t.Fatal(err)
		}
		bodies, cancels = append(bodies, resp.Body), append(cancels, cancel)
	}
	for i := range bodies {
		cancels[i]()
		bodies[i].Close()
	}
	waitInFlightZero(t, s)
	for _, be := range s.Backends() {
		st := s.Health().State(be)
		t.Logf("%s: healthy %v, passive failures %d, ejections %d", be.Name, st.Healthy, st.PassiveFailures, st.Ejections)
		if !st.Healthy || st.Ejections != 0 || st.PassiveFailures != 0 {
			t.Errorf("%s: %d client cancellations counted against the backend: healthy %v, passive failures %d, ejections %d",
				be.Name, perBackend, st.Healthy, st.PassiveFailures, st.Ejections)
		}
	}
	t.Logf("client disconnects %d, stream errors %d", s.m.clientGone.Get(), s.m.streamErrors.Get())
	if s.m.streamErrors.Get() != 0 || s.m.clientGone.Get() != uint64(n) {
		t.Errorf("prefixlb_client_disconnects_total %d, prefixlb_stream_errors_total %d; want %d and 0", s.m.clientGone.Get(), s.m.streamErrors.Get(), n)
	}
}
