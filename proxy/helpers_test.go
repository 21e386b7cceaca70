package proxy

// Shared test scaffolding: every wait in a proxy test is bounded and fails with a message.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/prefixlb/prefixlb/configs"
)

// testTimeout bounds one request of a test client: a proxy that stops answering fails the test
// with a message instead of hanging the package until go test's own timeout.
const testTimeout = 30 * time.Second

// testClient is an HTTP client with its own connection pool and a total timeout per request.
func testClient() *http.Client {
	return &http.Client{
		Timeout:   testTimeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
	}
}

// eventually polls cond every 2 ms until it holds, and fails the test with what if it does not
// within limit.
func eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", limit, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// recvWithin receives one value from ch, failing the test with what after limit.
func recvWithin[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatalf("not within %v: %s", limit, what)
	}
	var zero T
	return zero
}

// freeAddr is a 127.0.0.1 host:port that was just listened on and closed: nothing listens
// there (until someone else takes the port, which on loopback within a test is unlikely).
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	_ = ln.Close()
	return a
}

// deadURL is the URL of a 127.0.0.1 port that was just listened on and closed: connecting to
// it is refused.
func deadURL(t testing.TB) string {
	t.Helper()
	return "http://" + freeAddr(t)
}

// serveOpts are the optional parts of serveConfigWith.
type serveOpts struct {
	// log is the server's logger (nil: none).
	log *zap.Logger
	// hook runs after New and before Serve: fasthttp settings, backend changes.
	hook func(s *Server)
}

// serveConfigWith adds urls as backends to cfg, applies mutate, validates, builds a Server
// with o's logger, runs o's hook and serves it on an ephemeral 127.0.0.1 port until the test
// ends. It returns the server and its base URL.
func serveConfigWith(t testing.TB, cfg *configs.Config, urls []string, mutate func(*configs.Config), o serveOpts) (*Server, string) {
	t.Helper()
	for _, u := range urls {
		cfg.Backends = append(cfg.Backends, configs.Backend{URL: u})
	}
	if mutate != nil {
		mutate(cfg)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, o.log)
	if err != nil {
		t.Fatal(err)
	}
	if o.hook != nil {
		o.hook(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s, "http://" + ln.Addr().String()
}

// runHandle is a Run started by startRun.
type runHandle struct {
	s     *Server
	base  string // data listener, http://host:port
	admin string // admin listener, http://host:port
}

// startRun runs Run(cfg, log, opts) until the test ends: it waits (bounded) until both
// listeners accept, and in t.Cleanup cancels Run's context and waits (bounded) for Run to
// return, failing the test if it returns an error. opts.OnReady, if set, is still called.
// Cleanups registered after startRun (load generators) run before Run is stopped.
func startRun(t *testing.T, cfg *configs.Config, log *zap.Logger, opts RunOptions) *runHandle {
	t.Helper()
	if log == nil {
		log = zap.NewNop()
	}
	type ready struct {
		s           *Server
		data, admin net.Addr
	}
	rc := make(chan ready, 1)
	user := opts.OnReady
	opts.OnReady = func(s *Server, data, admin net.Addr) {
		if user != nil {
			user(s, data, admin)
		}
		rc <- ready{s, data, admin}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, log, opts) }()
	var r ready
	select {
	case r = <-rc:
	case err := <-done:
		cancel()
		t.Fatalf("Run returned before listening: %v", err)
	case <-time.After(testTimeout):
		cancel()
		t.Fatalf("Run not listening within %v", testTimeout)
	}
	t.Cleanup(func() {
		cancel()
		if err := recvWithin(t, done, testTimeout, "Run returns once its context is cancelled"); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &runHandle{s: r.s, base: "http://" + r.data.String(), admin: "http://" + r.admin.String()}
}

// logEntry is one recorded log entry, its fields encoded when it was written.
type logEntry struct {
	level   zapcore.Level
	message string
	fields  map[string]any
}

// text is everything the entry carries, for "never logged" checks.
func (e logEntry) text() string {
	var sb strings.Builder
	sb.WriteString(e.message)
	for k, v := range e.fields {
		fmt.Fprintf(&sb, " %s=%v", k, v)
	}
	return sb.String()
}

// logRecorder keeps every entry of a recordingLogger. Unlike zaptest/observer it encodes the
// fields inside Write: the proxy logs pooled buffers (zap.ByteString of a flow's method and
// path), which the next request reuses once Write has returned.
type logRecorder struct {
	mu      sync.Mutex
	entries []logEntry
}

// take returns the entries so far and forgets them.
func (r *logRecorder) take() []logEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.entries
	r.entries = nil
	return out
}

// count returns how many entries so far match.
func (r *logRecorder) count(match func(logEntry) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.entries {
		if match(e) {
			n++
		}
	}
	return n
}

// withMessage returns the entries so far whose message is msg.
func (r *logRecorder) withMessage(msg string) []logEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []logEntry
	for _, e := range r.entries {
		if e.message == msg {
			out = append(out, e)
		}
	}
	return out
}

type recordingCore struct {
	rec *logRecorder
	ctx []zapcore.Field
}

func (c *recordingCore) Enabled(zapcore.Level) bool { return true }

func (c *recordingCore) With(fs []zapcore.Field) zapcore.Core {
	return &recordingCore{rec: c.rec, ctx: append(append([]zapcore.Field(nil), c.ctx...), fs...)}
}

func (c *recordingCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return ce.AddCore(e, c)
}

func (c *recordingCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(append([]zapcore.Field(nil), c.ctx...), fs...) {
		f.AddTo(enc)
	}
	c.rec.mu.Lock()
	c.rec.entries = append(c.rec.entries, logEntry{level: e.Level, message: e.Message, fields: enc.Fields})
	c.rec.mu.Unlock()
	return nil
}

func (c *recordingCore) Sync() error { return nil }

// recordingLogger is a logger at debug level that records every entry.
func recordingLogger() (*zap.Logger, *logRecorder) {
	rec := &logRecorder{}
	return zap.New(&recordingCore{rec: rec}), rec
}

// sseOutcome is how a streamed (SSE) response body ended.
type sseOutcome int

const (
	// sseComplete: the [DONE] event arrived and the body ended cleanly.
	sseComplete sseOutcome = iota
	// sseCut: reading the body failed: the client can see the stream was cut.
	sseCut
	// sseUnterminated: the body ended cleanly without [DONE]: it looks complete and is not
	// (a lost response).
	sseUnterminated
)

func (o sseOutcome) String() string {
	return [...]string{"complete", "cut", "unterminated"}[o]
}

// sseReader reads an SSE response body event by event and classifies how it ended. It is
// the one stream reader of the proxy tests.
type sseReader struct {
	br     *bufio.Reader
	events int  // data events other than [DONE]
	bytes  int  // body bytes read
	done   bool // the [DONE] event arrived
	err    error
	ended  bool
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{br: bufio.NewReader(r)} }

// next returns the payload of the next data event (after "data: "); ok is false once the
// body ended. The [DONE] event is not returned: reading goes on to the body's end.
func (s *sseReader) next() (data []byte, ok bool) {
	for !s.ended {
		line, err := s.br.ReadBytes('\n')
		s.bytes += len(line)
		if err != nil {
			s.ended = true
			if !errors.Is(err, io.EOF) {
				s.err = err
			}
			return nil, false // a line without its newline is not an event
		}
		payload, isData := bytes.CutPrefix(line, []byte("data: "))
		if !isData {
			continue
		}
		payload = bytes.TrimRight(payload, "\r\n")
		if bytes.Equal(payload, []byte("[DONE]")) {
			s.done = true
			continue
		}
		s.events++
		return payload, true
	}
	return nil, false
}

// drain reads to the end of the body and returns the outcome.
func (s *sseReader) drain() sseOutcome {
	for {
		if _, ok := s.next(); !ok {
			return s.outcome()
		}
	}
}

// outcome classifies the body once next returned false.
func (s *sseReader) outcome() sseOutcome {
	switch {
	case s.err != nil:
		return sseCut
	case s.done:
		return sseComplete
	}
	return sseUnterminated
}
