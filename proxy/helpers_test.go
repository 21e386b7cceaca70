package proxy

// Shared test scaffolding: every wait in a proxy test is bounded and fails with a message.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
)

// The generic helpers are internal/testutil's, under the names the proxy tests use.
const testTimeout = testutil.Timeout

var (
	testClient      = testutil.Client
	eventually      = testutil.Eventually
	freeAddr        = testutil.FreeAddr
	deadURL         = testutil.DeadURL
	statusBackend   = testutil.StatusBackend
	recordingLogger = testutil.RecordingLogger
)

type (
	logEntry    = testutil.LogEntry
	logRecorder = testutil.LogRecorder
)

// recvWithin receives one value from ch, failing the test with what after limit.
func recvWithin[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	return testutil.RecvWithin(t, ch, limit, what)
}

// waitInFlightZero waits (bounded) until nothing is in flight on s's backends.
func waitInFlightZero(t testing.TB, s *Server) {
	t.Helper()
	testutil.WaitInFlightZero(t, s.Backends)
}

// startProxy is how a proxy test starts a proxy: a Server in mode in front of urls
// (testOptions) with active checks and scraping off (checksOn turns them on), mutate applied
// to its Options (nil: none; o.Log = a recordingLogger's to read its log), and hooks run on
// the Server before it starts (test hooks, fasthttp settings, backend changes). It serves
// (Server.Start) on an ephemeral 127.0.0.1 port until the test ends or stopProxy, and
// startProxy returns the server and its base URL.
func startProxy(t testing.TB, mode string, urls []string, mutate func(*Options), hooks ...func(*Server)) (*Server, string) {
	t.Helper()
	o := testOptions(t, mode, urls...)
	noHealthChecks(&o)
	if mutate != nil {
		mutate(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		h(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sv := s.Start(context.Background(), ln)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
			defer cancel()
			_ = sv.Stop(ctx)
		})
	}
	stops.Store(s, stop)
	t.Cleanup(func() {
		stop()
		stops.Delete(s)
	})
	return s, sv.URL()
}

// stops holds the stop of each proxy startProxy started, until its test ends.
var stops sync.Map // *Server → func()

// stopProxy stops s, which startProxy started, now (its test's end then stops nothing): what
// a Stop does at the end (the traces' export) can then be checked.
func stopProxy(t testing.TB, s *Server) {
	t.Helper()
	stop, ok := stops.Load(s)
	if !ok {
		t.Fatal("stopProxy: not a proxy of startProxy's, or already ended")
	}
	stop.(func())()
}

// testOptions are the Options of a test proxy in mode in front of urls: the defaults, the
// health checker's included (active checks and scraping on, as prefixlb serve runs).
func testOptions(t testing.TB, mode string, urls ...string) Options {
	t.Helper()
	pol, err := router.NewPolicy(mode, router.PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return Options{Mode: mode, Policy: pol, Backends: testBackends(t, urls...), Health: testHealth()}
}

// testHealth are the health checker's defaults, with model discovery off: the proxy's fake
// backends are no model servers and count what reaches them (health and app test discovery,
// on simulated replicas).
func testHealth() health.Options {
	ho := health.DefaultOptions()
	ho.ModelsInterval = -1
	return ho
}

// testBackends builds a backend per URL (default KV capacity and weight).
func testBackends(t testing.TB, urls ...string) []*backend.Backend {
	t.Helper()
	bs := make([]*backend.Backend, 0, len(urls))
	for _, u := range urls {
		b, err := backend.New(u, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	return bs
}

// noHealthChecks turns active checks and scraping off: backends take traffic unless
// passively ejected.
func noHealthChecks(o *Options) {
	o.Health.Disabled = true
	o.Health.ScrapeInterval = 0
}

// logTo sets the proxy's logger (a mutate of startProxy's; recordingLogger's to read it).
func logTo(log *zap.Logger) func(*Options) { return func(o *Options) { o.Log = log } }

// checksOn turns active checks and scraping on, at the defaults (a mutate of startProxy's;
// prefixlb serve runs them).
func checksOn(o *Options) { o.Health = testHealth() }

// stopGrace bounds a test proxy's shutdown when its test ends.
const stopGrace = 5 * time.Second

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
