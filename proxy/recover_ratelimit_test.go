package proxy

// A client that can make serving panic again and again does not flood the log with stacks:
// each site's panic logs its full stack at most once per panicStackEvery, the others a short
// line counting the stacks left out, and the counters count every panic.

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a clock that tests move by hand.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// Panics at one site, the clock moved between them: a full stack at the first and at the
// first after each panicStackEvery; short lines between, each counting the stacks left out
// since the last full one, which the next full one reports too.
func TestPanicStacksRateLimited(t *testing.T) {
	type step struct {
		after      time.Duration // the clock moves this much before the panic
		stack      bool          // the line has the full stack
		suppressed int           // its stacks_suppressed field (0: absent)
	}
	steps := []step{
		{0, true, 0},
		{time.Second, false, 1},
		{time.Second, false, 2},
		{panicStackEvery - 2*time.Second - time.Nanosecond, false, 3},
		{time.Nanosecond, true, 3}, // panicStackEvery after the first full stack
		{panicStackEvery - time.Nanosecond, false, 1},
		{10 * panicStackEvery, true, 1},
		{0, false, 1},
	}
	for _, c := range []struct {
		name    string
		stage   panicStage
		line    string
		status  int
		counter string
	}{
		{"key build", stageKey, logKeyPanic, http.StatusOK, "prefixlb_key_panics_total"},
		{"handler", stagePick, logHandlerPanic, http.StatusInternalServerError, "prefixlb_handler_panics_total"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newPanicReplica(t)
			log, rec := recordingLogger()
			clock := newFakeClock()
			armed := &atomic.Bool{}
			s, base := startProxy(t, "prefix", []string{r.srv.URL}, logTo(log), func(s *Server) {
				setPanicClock(s, clock.now)
				s.testPanic = func(at panicStage) { // here: the test checks that the stack names this file
					if at == c.stage && armed.CompareAndSwap(true, false) {
						panic(panicMarker)
					}
				}
			})
			cl := testClient()
			for i, st := range steps {
				clock.advance(st.after)
				armed.Store(true)
				resp, err := cl.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(panicChatBody(fmt.Sprint("request ", i))))
				if err != nil {
					t.Fatalf("panic %d: %v", i, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != c.status || armed.Load() {
					t.Fatalf("panic %d: status %d (want %d), fired %v", i, resp.StatusCode, c.status, !armed.Load())
				}
				checkReleased(t, s)
				errs := errorLines(rec.Take())
				if len(errs) != 1 || errs[0].Message != c.line {
					t.Fatalf("panic %d: error lines %v, want one %q", i, errs, c.line)
				}
				e := errs[0]
				stack, hasStack := e.Fields["stack"]
				if hasStack != st.stack {
					t.Errorf("panic %d: stack logged %v, want %v", i, hasStack, st.stack)
				}
				if hasStack && !strings.Contains(fmt.Sprint(stack), "recover_ratelimit_test.go") {
					t.Errorf("panic %d: the stack does not name the panic's site", i)
				}
				if got := fmt.Sprint(e.Fields["stacks_suppressed"]); st.suppressed == 0 && got != "<nil>" || st.suppressed != 0 && got != fmt.Sprint(st.suppressed) {
					t.Errorf("panic %d: stacks_suppressed %s, want %d", i, got, st.suppressed)
				}
				if got := fmt.Sprint(e.Fields["panic"]); got != panicMarker {
					t.Errorf("panic %d: panic field %q", i, got)
				}
				if site := fmt.Sprint(e.Fields["panic_site"]); !strings.Contains(site, "proxy/recover_ratelimit_test.go:") {
					t.Errorf("panic %d: panic_site %q, want the line that panicked", i, site)
				}
			}
			if m := metricsText(s); !strings.Contains(m, fmt.Sprintf("%s %d\n", c.counter, len(steps))) {
				t.Errorf("%s does not count all %d panics", c.counter, len(steps))
			}
		})
	}
}

// The limit is per site: where the panic was contained and the code that panicked. A site
// whose stack was just logged does not hold back another's.
func TestPanicStackLimiterSites(t *testing.T) {
	clock := newFakeClock()
	l := newPanicLimiter(clock.now)
	type want struct {
		full       bool
		suppressed int
	}
	for i, c := range []struct {
		site  string
		after time.Duration
		want
	}{
		{"handler|a.go:1", 0, want{true, 0}},
		{"handler|b.go:2", 0, want{true, 0}},
		{"relay|a.go:1", 0, want{true, 0}},
		{"handler|a.go:1", time.Second, want{false, 1}},
		{"handler|b.go:2", 0, want{false, 1}},
		{"handler|a.go:1", 0, want{false, 2}},
		{"handler|a.go:1", panicStackEvery, want{true, 2}},
		{"handler|b.go:2", 0, want{true, 1}},
	} {
		clock.advance(c.after)
		if full, n := l.allow(c.site); full != c.full || n != c.suppressed {
			t.Errorf("step %d (%s): full %v, suppressed %d; want %v, %d", i, c.site, full, n, c.full, c.suppressed)
		}
	}
	// Past maxPanicSites sites, the new ones share one entry: the map stays bounded.
	for i := range 3 * maxPanicSites {
		l.allow(fmt.Sprint("site ", i))
	}
	if n := l.size(); n > maxPanicSites+1 {
		t.Errorf("%d sites held, want at most %d", n, maxPanicSites+1)
	}
}

// setPanicClock makes s's panic limiter read now (before s serves).
func setPanicClock(s *Server, now func() time.Time) { s.panicLog.now = now }
