package health

import (
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

func TestDefaultOptions(t *testing.T) {
	o := DefaultOptions()
	want := Options{
		Path: "/health", Interval: 5 * time.Second, Timeout: 2 * time.Second, Rise: 2, Fall: 3,
		ConsecutiveFailures: 5, BaseEjection: 30 * time.Second, MaxEjection: 300 * time.Second,
		MaxEjectedPercent: 50, ScrapeInterval: time.Second, MetricsPath: "/metrics",
		ScrapeStaleAfter: 5 * time.Second, ModelsInterval: 30 * time.Second, ModelsPath: "/v1/models",
	}
	if o != want {
		t.Fatalf("DefaultOptions() = %+v, want %+v", o, want)
	}
	// Zero fields take the defaults, except ScrapeInterval (0 = off).
	got := New(Options{}, nil, nil)
	defer got.Close()
	want.ScrapeInterval = 0
	if got.Options() != want {
		t.Fatalf("New(Options{}).Options() = %+v, want %+v", got.Options(), want)
	}
}

func TestRiseFall(t *testing.T) {
	const P, F = http.StatusOK, http.StatusServiceUnavailable
	tests := []struct {
		desc       string
		rise, fall int
		steps      []int  // /health status of each check
		want       []bool // b.Healthy() after each check
	}{
		{"new backend healthy on its first pass (Envoy)", 2, 3,
			[]int{P, P, P}, []bool{true, true, true}},
		{"new backend unhealthy while it fails", 2, 3,
			[]int{F, F, P}, []bool{false, false, true}},
		{"unhealthy after fall failures", 2, 3,
			[]int{P, P, F, F, F, F}, []bool{true, true, true, true, false, false}},
		{"a pass restarts the fall count", 2, 3,
			[]int{P, P, F, F, P, F, F, F}, []bool{true, true, true, true, true, true, true, false}},
		{"back after rise passes", 2, 3,
			[]int{P, P, F, F, F, P, P}, []bool{true, true, true, true, false, false, true}},
		{"a failure restarts the rise count", 2, 3,
			[]int{P, F, F, F, P, F, P, P}, []bool{true, true, true, false, false, false, false, true}},
		{"any 2xx passes, 3xx and 4xx fail", 1, 1,
			[]int{204, 301, 299, 404, 200}, []bool{true, false, true, false, true}},
		{"rise 1 fall 1", 1, 1,
			[]int{F, P, F}, []bool{false, true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			srv := newFakeServer(t)
			b := srv.backend(t)
			c, _, _ := newTestChecker(t, Options{Rise: tt.rise, Fall: tt.fall})
			c.SetBackends([]*backend.Backend{b})
			if b.Healthy() {
				t.Fatal("new backend healthy before any check")
			}
			for i, status := range tt.steps {
				srv.healthStatus.Store(int32(status))
				c.CheckOnce(bg)
				if got := b.Healthy(); got != tt.want[i] {
					t.Fatalf("after check %d (status %d): healthy = %v, want %v; state %+v",
						i+1, status, got, tt.want[i], c.State(b))
				}
			}
		})
	}
}

func TestConnectionRefusedFails(t *testing.T) {
	b := deadBackend(t)
	c, _, _ := newTestChecker(t, Options{Rise: 1, Fall: 1})
	c.SetBackends([]*backend.Backend{b})
	c.CheckOnce(bg)
	s := c.State(b)
	if b.Healthy() || s.ConsecutiveFails != 1 || s.LastCheckError == "" {
		t.Fatalf("state after a refused check: %+v", s)
	}
}

func TestDisabledHealthyAtOnce(t *testing.T) {
	srv := newFakeServer(t)
	srv.healthStatus.Store(http.StatusServiceUnavailable)
	b := srv.backend(t)
	b.SetHealthy(false)
	c, _, _ := newTestChecker(t, Options{Disabled: true})
	c.SetBackends([]*backend.Backend{b})
	if !b.Healthy() {
		t.Fatal("Disabled: new backend not healthy at once")
	}
	c.CheckOnce(bg)
	if !b.Healthy() || srv.checks.Load() != 0 {
		t.Fatalf("Disabled: healthy=%v, checks=%d; want true, 0", b.Healthy(), srv.checks.Load())
	}
}

func TestReturnFromUnhealthyBumpsEpoch(t *testing.T) {
	srv := newFakeServer(t)
	b := srv.backend(t)
	c, _, logs := newTestChecker(t, Options{})
	c.SetBackends([]*backend.Backend{b})
	for range 10 {
		c.CheckOnce(bg)
	}
	if !b.Healthy() {
		t.Fatal("not healthy after 10 passes")
	}
	e := b.Epoch()
	srv.healthStatus.Store(http.StatusServiceUnavailable)
	for range 10 {
		c.CheckOnce(bg)
	}
	if b.Healthy() || b.Epoch() != e {
		t.Fatalf("after 10 failures: healthy=%v epoch=%d, want false %d", b.Healthy(), b.Epoch(), e)
	}
	srv.healthStatus.Store(http.StatusOK)
	c.CheckOnce(bg)
	if b.Epoch() != e {
		t.Fatalf("epoch bumped after one pass: %d, want %d", b.Epoch(), e)
	}
	c.CheckOnce(bg)
	if !b.Healthy() || b.Epoch() != e+1 {
		t.Fatalf("back after rise passes: healthy=%v epoch=%d, want true %d", b.Healthy(), b.Epoch(), e+1)
	}
	// One log line per state change, none per check.
	if n := countLogs(logs, "backend healthy"); n != 2 {
		t.Errorf("%d 'backend healthy' lines, want 2", n)
	}
	if n := countLogs(logs, "backend unhealthy"); n != 1 {
		t.Errorf("%d 'backend unhealthy' lines, want 1", n)
	}
}

func TestPanicModeLoggedOnce(t *testing.T) {
	srvs, bs := fakeServers(t, 4)
	c, _, logs := newTestChecker(t, Options{Rise: 1, Fall: 1})
	const enter = "fewer than half the backends are healthy: routing to all of them (panic mode)"
	const leave = "half or more of the backends are healthy again: leaving panic mode"
	c.SetBackends(bs) // unhealthy until checked, but unknown rather than down: no panic warning
	c.CheckOnce(bg)
	if countLogs(logs, enter) != 0 || countLogs(logs, leave) != 0 {
		t.Fatalf("startup: enter=%d leave=%d, want 0 0", countLogs(logs, enter), countLogs(logs, leave))
	}
	for _, s := range srvs[:3] {
		s.healthStatus.Store(http.StatusInternalServerError)
	}
	for range 3 {
		c.CheckOnce(bg)
	}
	if _, p := backend.Healthy(nil, bs); !p {
		t.Fatal("backend.Healthy not in panic mode with 1 of 4 healthy")
	}
	if countLogs(logs, enter) != 1 || countLogs(logs, leave) != 0 {
		t.Fatalf("3 of 4 down: enter=%d leave=%d, want 1 0", countLogs(logs, enter), countLogs(logs, leave))
	}
}

func TestSetBackendsKeepsAndDrops(t *testing.T) {
	s1, s2 := newFakeServer(t), newFakeServer(t)
	b1, b2 := s1.backend(t), s2.backend(t)
	c, _, _ := newTestChecker(t, Options{Rise: 1})
	c.SetBackends([]*backend.Backend{b1})
	c.CheckOnce(bg)
	if !b1.Healthy() {
		t.Fatal("b1 not healthy")
	}
	c.SetBackends([]*backend.Backend{b1, b2})
	if !b1.Healthy() || b2.Healthy() {
		t.Fatalf("after adding b2: b1=%v b2=%v, want true false", b1.Healthy(), b2.Healthy())
	}
	c.SetBackends([]*backend.Backend{b2})
	if c.State(b1).Tracked {
		t.Fatal("b1 still tracked after removal")
	}
	n1 := s1.checks.Load()
	c.CheckOnce(bg)
	if s1.checks.Load() != n1 || !b2.Healthy() {
		t.Fatalf("after removal: b1 checked %d more times, b2 healthy=%v", s1.checks.Load()-n1, b2.Healthy())
	}
}

// TestStartCloseGoroutines runs the real loops on short intervals and checks that Close
// stops every goroutine the Checker started. Real time, generous bounds.
func TestStartCloseGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	s1, s2 := newFakeServer(t), newFakeServer(t)
	s1.setMetricsFile(t, "testdata/vllm_metrics.txt")
	b1, b2 := s1.backend(t), s2.backend(t)
	c := New(Options{Interval: 5 * time.Millisecond, ScrapeInterval: 5 * time.Millisecond, Rise: 2}, nil, nil)
	c.SetBackends([]*backend.Backend{b1})
	c.Start()
	c.Start() // idempotent
	c.SetBackends([]*backend.Backend{b1, b2})
	waitFor(t, "both backends healthy and scraped", func() bool {
		_, fresh := c.Load(b1)
		return b1.Healthy() && b2.Healthy() && fresh && s2.scrapes.Load() > 0
	})
	c.SetBackends([]*backend.Backend{b1}) // stops b2's loops
	c.Close()
	c.Close()
	c.Start() // no effect after Close
	// A handler may still be finishing a request the Checker gave up on; the servers' Close
	// waits for those, so only the Checker's own goroutines could remain after it.
	s1.srv.Close()
	s2.srv.Close()
	waitFor(t, "goroutines gone", func() bool { return runtime.NumGoroutine() <= before })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if testutil.Poll(10*time.Second, 10*time.Millisecond, cond) {
		return
	}
	buf := make([]byte, 1<<16)
	t.Fatalf("timed out waiting for %s; goroutines:\n%s", what, buf[:runtime.Stack(buf, true)])
}

func TestOnceAfterClose(t *testing.T) {
	srv := newFakeServer(t)
	b := srv.backend(t)
	c, _, _ := newTestChecker(t, Options{})
	c.SetBackends([]*backend.Backend{b})
	c.Close()
	// A backend's loop may have sent a check or a scrape before Close stopped it; Close
	// cancels it, but the fake server may still count it a moment later. Only what comes
	// after counts: wait (at most 2 s) until the server's counts hold still for 60 ms.
	n0, m0 := srv.checks.Load(), srv.scrapes.Load()
	still := 0
	testutil.Poll(2*time.Second, 20*time.Millisecond, func() bool {
		n, m := srv.checks.Load(), srv.scrapes.Load()
		if n == n0 && m == m0 {
			still++
		} else {
			n0, m0, still = n, m, 0
		}
		return still > 3 // the first look, then 3 more 20 ms apart
	})
	c.CheckOnce(bg)
	c.scrapeAll(bg)
	if n, m := srv.checks.Load(), srv.scrapes.Load(); n != n0 || m != m0 {
		t.Fatalf("after Close: %d checks, %d scrapes; want none (%d, %d before)", n-n0, m-m0, n0, m0)
	}
}
