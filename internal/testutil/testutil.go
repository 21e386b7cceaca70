// Package testutil is the scaffolding shared by the tests of the proxy, its wiring (package
// app) and the packages beside it (health, peering, discovery): every wait is bounded and
// fails with a message, clients have their own pools and timeouts, and log entries are
// recorded with their fields (RecordingLogger, the one log recorder of the tests).
package testutil

import (
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

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/prefixlb/prefixlb/backend"
)

// Timeout bounds one request of a test client, and the waits for a proxy to start or stop:
// a proxy that stops answering fails the test with a message instead of hanging the package
// until go test's own timeout.
const Timeout = 30 * time.Second

// pollEvery is how often Eventually looks at its condition.
const pollEvery = 2 * time.Millisecond

// inFlightLimit bounds WaitInFlightZero: requests finish within this once their clients
// have their responses.
const inFlightLimit = 5 * time.Second

// Client is an HTTP client with its own connection pool and a total timeout per request.
func Client() *http.Client {
	return &http.Client{
		Timeout:   Timeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
	}
}

// Eventually polls cond every 2 ms until it holds, and fails the test with what if it does
// not within limit.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(limit, pollEvery, cond) {
		t.Fatalf("not within %v: %s", limit, what)
	}
}

// Poll calls cond every every until it holds or limit has passed, and reports whether it
// held: Eventually for a caller that reports the failure itself (or goes on without it).
func Poll(limit, every time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
	return true
}

// RecvWithin receives one value from ch, failing the test with what after limit.
func RecvWithin[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
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

// FreeAddr is a 127.0.0.1 host:port that was just listened on and closed: nothing listens
// there (until someone else takes the port, which on loopback within a test is unlikely).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	_ = ln.Close()
	return a
}

// DeadURL is the URL of a 127.0.0.1 port where connecting is refused until the test ends:
// the port stays bound to a socket that never listens (deadAddr), so that no other test
// process takes it meanwhile (a port listened on and closed can be taken by a parallel
// package's listener, and a request to it then hangs instead of failing).
func DeadURL(t testing.TB) string {
	t.Helper()
	return "http://" + deadAddr(t)
}

// StatusBackend answers every request with status and body, and counts the requests. The
// health checker's model-list reads (GET /v1/models with User-Agent prefixlb-health) are
// answered 404, as by a server without the endpoint, and not counted: the count is of the
// requests routed to it and the checks the test turned on. It is closed when the test ends.
func StatusBackend(t testing.TB, status int, body string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/models" && r.UserAgent() == "prefixlb-health" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		hits.Add(1)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(ts.Close)
	return ts, &hits
}

// PostJSON posts the JSON body to url with a Client of its own, reads the whole response and
// returns its status; a failed request fails the test.
func PostJSON(t testing.TB, url, body string) int {
	t.Helper()
	resp, err := Client().Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("reading the response of %s: %v", url, err)
	}
	return resp.StatusCode
}

// WaitInFlightZero waits (bounded) until no request is in flight on the backends, failing
// the test if one still is, or if a backend counts prefill tokens with nothing in flight.
func WaitInFlightZero(t testing.TB, backends func() []*backend.Backend) {
	t.Helper()
	deadline := time.Now().Add(inFlightLimit)
	for time.Now().Before(deadline) {
		total := int64(0)
		for _, b := range backends() {
			total += b.InFlight()
			if b.PrefillTokens() != 0 && b.InFlight() == 0 {
				t.Fatalf("%s: prefill tokens %d with nothing in flight", b.Name, b.PrefillTokens())
			}
		}
		if total == 0 {
			return
		}
		time.Sleep(10 * pollEvery)
	}
	for _, b := range backends() {
		t.Errorf("%s: in-flight %d, want 0", b.Name, b.InFlight())
	}
}

// LogEntry is one recorded log entry, its fields encoded when it was written.
type LogEntry struct {
	Level   zapcore.Level
	Message string
	Fields  map[string]any
}

// Text is everything the entry carries, for "never logged" checks.
func (e LogEntry) Text() string {
	var sb strings.Builder
	sb.WriteString(e.Message)
	for k, v := range e.Fields {
		fmt.Fprintf(&sb, " %s=%v", k, v)
	}
	return sb.String()
}

// LogRecorder keeps every entry of a RecordingLogger. Unlike zaptest/observer it encodes the
// fields inside Write: the proxy logs pooled buffers (zap.ByteString of a flow's method and
// path), which the next request reuses once Write has returned.
type LogRecorder struct {
	mu      sync.Mutex
	entries []LogEntry
}

// Take returns the entries so far and forgets them.
func (r *LogRecorder) Take() []LogEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.entries
	r.entries = nil
	return out
}

// Entries returns the entries so far; they stay recorded.
func (r *LogRecorder) Entries() []LogEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]LogEntry(nil), r.entries...)
}

// Text is every entry so far (its Text), one a line, for "never logged" checks.
func (r *LogRecorder) Text() string {
	var sb strings.Builder
	for _, e := range r.Entries() {
		sb.WriteString(e.Text())
		sb.WriteByte('\n')
	}
	return sb.String()
}

// Count returns how many entries so far match.
func (r *LogRecorder) Count(match func(LogEntry) bool) int {
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

// WithMessage returns the entries so far whose message is msg.
func (r *LogRecorder) WithMessage(msg string) []LogEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []LogEntry
	for _, e := range r.entries {
		if e.Message == msg {
			out = append(out, e)
		}
	}
	return out
}

type recordingCore struct {
	rec *LogRecorder
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
	c.rec.entries = append(c.rec.entries, LogEntry{Level: e.Level, Message: e.Message, Fields: enc.Fields})
	c.rec.mu.Unlock()
	return nil
}

func (c *recordingCore) Sync() error { return nil }

// RecordingLogger is a logger at debug level that records every entry.
func RecordingLogger() (*zap.Logger, *LogRecorder) {
	rec := &LogRecorder{}
	return zap.New(&recordingCore{rec: rec}), rec
}

// ServeRaw listens on an ephemeral 127.0.0.1 port and hands each accepted connection to serve
// in its own goroutine, until the test ends (the listener is closed in t.Cleanup). It is the
// accept loop of the raw-socket backends that misbehave in ways net/http would not.
func ServeRaw(t testing.TB, serve func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln
}
