package proxy

// The scaffolding of the fault-injection tests (faults_*_test.go).
//
// Fault injection through the real proxy on loopback: backends that die, go silent, fail every
// request or receive hostile bodies. Every test counts what the clients saw: succeeded, failed
// with an error the client can see (an HTTP error status or a cut stream), and lost (no
// response and no error: a hang, or a stream that ended cleanly without its [DONE]). Lost must
// always be 0. Run with -v for the numbers (t.Logf).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// fltCheckEvery is the active-check interval and timeout of fltChecks. The config allows
// no timeout longer than the interval; 250 ms keeps a check of a good backend on a loaded
// 2-core machine under -race from timing out three times in a row (which would mark it
// unhealthy), where the config minimum of 100 ms did not.
const fltCheckEvery = 250 * time.Millisecond

// fltChecks turns active health checks on (every fltCheckEvery), scraping off, and makes
// ejections short (a mutate of startProxy's; fltWaitAllHealthy then waits for the first
// checks).
func fltChecks(o *Options) {
	checksOn(o)
	h := &o.Health
	h.Interval, h.Timeout, h.ScrapeInterval = fltCheckEvery, fltCheckEvery, 0
	h.BaseEjection, h.MaxEjection = 300*time.Millisecond, time.Second
}

// fltWaitAllHealthy waits (bounded) until every backend of s has passed its first checks.
func fltWaitAllHealthy(t *testing.T, s *Server) {
	t.Helper()
	for _, b := range s.Backends() {
		if _, ok := fltWaitHealthy(b, true, 10*time.Second); !ok {
			t.Fatalf("%s never passed its first health checks", b.Name)
		}
	}
}

// fltWaitHealthy polls b until its health is want (bounded) and returns how long it took.
func fltWaitHealthy(b *backend.Backend, want bool, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	ok := testutil.Poll(limit, 2*time.Millisecond, func() bool { return b.Healthy() == want })
	return time.Since(start), ok
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
	var ln net.Listener
	var err error
	if !testutil.Poll(2*time.Second, 20*time.Millisecond, func() bool {
		ln, err = net.Listen("tcp", b.addr)
		return err == nil
	}) {
		t.Fatalf("restart on %s: %v", b.addr, err)
	}
	b.serve(ln)
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
