package proxy

// Fault injection: a backend that accepts and never answers.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

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
	setTimeout := func(o *Options) { o.Timeouts.ResponseHeader = headerTimeout }

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
		s, url := startProxy(t, "round-robin", []string{stall.URL()}, func(o *Options) {
			o.Timeouts.Idle = headerTimeout
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
