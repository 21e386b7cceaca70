package health

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

func repeat(o Outcome, n int) []Outcome { return slices.Repeat([]Outcome{o}, n) }

func seq(parts ...[]Outcome) []Outcome { return slices.Concat(parts...) }

func TestPassiveEjection(t *testing.T) {
	const (
		ok   = OutcomeOK
		conn = OutcomeConnectError
		e5xx = OutcomeServerError
		e4xx = OutcomeClientError
		busy = OutcomeBusy
		tout = OutcomeTimeout
	)
	tests := []struct {
		desc     string
		outcomes []Outcome
		ejected  bool
	}{
		{"5 x 5xx eject", repeat(e5xx, 5), true},
		{"4 x 5xx do not", repeat(e5xx, 4), false},
		{"connect errors count", repeat(conn, 5), true},
		{"header timeouts count", repeat(tout, 5), true},
		{"mixed failures count together", []Outcome{conn, e5xx, tout, e5xx, conn}, true},
		{"4xx x 100 never eject", repeat(e4xx, 100), false},
		{"429 x 100 never eject", repeat(busy, 100), false},
		{"a 2xx resets the count", seq(repeat(e5xx, 4), []Outcome{ok}, repeat(e5xx, 4)), false},
		{"a 4xx resets the count", seq(repeat(e5xx, 4), []Outcome{e4xx}, repeat(e5xx, 4)), false},
		{"a 429 neither counts nor resets", seq(repeat(e5xx, 4), repeat(busy, 10), []Outcome{e5xx}), true},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			c, _, _ := newTestChecker(t, Options{Disabled: true})
			bs := fakeBackends(t, 4)
			c.SetBackends(bs)
			for _, o := range tt.outcomes {
				c.Observe(bs[0], o)
			}
			if got := !bs[0].Healthy(); got != tt.ejected {
				t.Fatalf("ejected = %v, want %v; state %+v", got, tt.ejected, c.State(bs[0]))
			}
			for _, b := range bs[1:] {
				if !b.Healthy() {
					t.Fatalf("%s unhealthy, only %s failed", b.Name, bs[0].Name)
				}
			}
		})
	}
}

func TestEjectionDurationGrows(t *testing.T) {
	c, clk, logs := newTestChecker(t, Options{Disabled: true})
	bs := fakeBackends(t, 2)
	c.SetBackends(bs)
	b := bs[0]
	want := []time.Duration{30, 60, 90, 120, 150, 180, 210, 240, 270, 300, 300, 300}
	for i, w := range want {
		w *= time.Second
		e := b.Epoch()
		for range 5 {
			c.Observe(b, OutcomeServerError)
		}
		s := c.State(b)
		if b.Healthy() || s.Ejections != i+1 {
			t.Fatalf("ejection %d: healthy=%v ejections=%d", i+1, b.Healthy(), s.Ejections)
		}
		if got := s.EjectedUntil.Sub(clk.Now()); got != w {
			t.Fatalf("ejection %d lasts %v, want %v", i+1, got, w)
		}
		// More failures while ejected do not extend it.
		for range 20 {
			c.Observe(b, OutcomeConnectError)
		}
		if got := c.State(b).EjectedUntil.Sub(clk.Now()); got != w {
			t.Fatalf("ejection %d extended to %v", i+1, got)
		}
		clk.Add(w - time.Nanosecond)
		c.CheckOnce(bg) // Disabled: only ends expired ejections
		if b.Healthy() {
			t.Fatalf("ejection %d ended 1ns early", i+1)
		}
		clk.Add(time.Nanosecond)
		c.CheckOnce(bg)
		if !b.Healthy() {
			t.Fatalf("ejection %d did not end after %v", i+1, w)
		}
		if b.Epoch() != e+1 {
			t.Fatalf("return from ejection %d: epoch %d, want %d", i+1, b.Epoch(), e+1)
		}
	}
	// One line per ejection and one per return, nothing else.
	if n := logs.Count(func(e testutil.LogEntry) bool {
		return e.Message == "backend unhealthy" && e.Fields["reason"] == "ejected"
	}); n != len(want) || len(logs.Entries()) != 2*len(want) {
		t.Errorf("%d ejection lines of %d, want %d of %d", n, len(logs.Entries()), len(want), 2*len(want))
	}

	// The count forgets one ejection per MaxEjection spent in rotation.
	clk.Add(3*DefaultMaxEjection + time.Second)
	for range 5 {
		c.Observe(b, OutcomeServerError)
	}
	if s := c.State(b); s.Ejections != len(want)-3+1 {
		t.Fatalf("after 3 quiet max-ejection periods: ejections=%d, want %d", s.Ejections, len(want)-2)
	}
}

func TestMaxEjectedPercent(t *testing.T) {
	tests := []struct {
		backends, pct, wantEjected int
	}{
		{4, 50, 2},
		{3, 50, 1},
		{2, 50, 1},
		{1, 50, 0},
		{5, 50, 2},
		{4, 100, 4},
		{10, 10, 1},
	}
	for _, tt := range tests {
		c, _, logs := newTestChecker(t, Options{Disabled: true, MaxEjectedPercent: tt.pct})
		bs := fakeBackends(t, tt.backends)
		c.SetBackends(bs)
		for range 20 { // every backend fails over and over
			for _, b := range bs {
				c.Observe(b, OutcomeConnectError)
			}
		}
		ejected := 0
		for _, b := range bs {
			if !b.Healthy() {
				ejected++
			}
		}
		if ejected != tt.wantEjected {
			t.Errorf("%d backends, max %d%%: %d ejected, want %d", tt.backends, tt.pct, ejected, tt.wantEjected)
		}
		// Each backend left in logs "not ejected" once, not per failure.
		if n := countLogs(logs, "backend failing but not ejected: max ejected percent reached"); n != tt.backends-tt.wantEjected {
			t.Errorf("%d backends, max %d%%: %d cap lines, want %d", tt.backends, tt.pct, n, tt.backends-tt.wantEjected)
		}
	}
}

// Unhealthy by active checks counts against MaxEjectedPercent too.
func TestMaxEjectedPercentCountsActiveUnhealthy(t *testing.T) {
	srvs, bs := fakeServers(t, 4)
	c, _, _ := newTestChecker(t, Options{Rise: 1, Fall: 1})
	c.SetBackends(bs)
	srvs[0].healthStatus.Store(http.StatusServiceUnavailable)
	c.CheckOnce(bg)
	for range 5 {
		c.Observe(bs[1], OutcomeServerError)
		c.Observe(bs[2], OutcomeServerError)
	}
	if bs[0].Healthy() || bs[1].Healthy() || !bs[2].Healthy() || !bs[3].Healthy() {
		t.Fatalf("healthy = %v %v %v %v, want false false true true",
			bs[0].Healthy(), bs[1].Healthy(), bs[2].Healthy(), bs[3].Healthy())
	}
}

func TestEjectionWithActiveChecks(t *testing.T) {
	srv, other := newFakeServer(t), newFakeServer(t)
	b := srv.backend(t)
	c, clk, _ := newTestChecker(t, Options{})
	c.SetBackends([]*backend.Backend{b, other.backend(t)})
	c.CheckOnce(bg)
	c.CheckOnce(bg)
	if !b.Healthy() {
		t.Fatal("not healthy after rise passes")
	}

	// Passing checks do not end an ejection early: /health is green while generation fails.
	for range 5 {
		c.Observe(b, OutcomeServerError)
	}
	for range 5 {
		c.CheckOnce(bg)
	}
	if b.Healthy() {
		t.Fatal("a passing active check ended the ejection early")
	}
	// Checks kept passing during the ejection: it returns as soon as the time is up.
	clk.Add(DefaultBaseEjection)
	c.CheckOnce(bg)
	if !b.Healthy() {
		t.Fatalf("not back after the ejection with passing checks: %+v", c.State(b))
	}

	// Ejected again; this time the replica dies during the ejection.
	for range 5 {
		c.Observe(b, OutcomeConnectError)
	}
	srv.healthStatus.Store(http.StatusServiceUnavailable)
	for range 3 {
		c.CheckOnce(bg)
	}
	clk.Add(2 * DefaultBaseEjection)
	c.CheckOnce(bg)
	if b.Healthy() {
		t.Fatal("back after the ejection although active checks fail")
	}
	if s := c.State(b); !s.EjectedUntil.IsZero() {
		t.Fatalf("ejection not ended: %+v", s)
	}
	e := b.Epoch()
	srv.healthStatus.Store(http.StatusOK)
	c.CheckOnce(bg)
	if b.Healthy() {
		t.Fatal("back after one pass, rise is 2")
	}
	c.CheckOnce(bg)
	if !b.Healthy() || b.Epoch() != e+1 {
		t.Fatalf("after rise passes: healthy=%v epoch=%d, want true %d", b.Healthy(), b.Epoch(), e+1)
	}
}

func TestObserveIgnores(t *testing.T) {
	c, _, _ := newTestChecker(t, Options{Disabled: true})
	bs := fakeBackends(t, 2)
	for range 10 {
		c.Observe(bs[0], OutcomeServerError) // unknown backend
	}
	c2, _, _ := newTestChecker(t, Options{Disabled: true, ConsecutiveFailures: -1})
	c2.SetBackends(bs)
	for range 10 {
		c2.Observe(bs[0], OutcomeServerError)
	}
	if !bs[0].Healthy() {
		t.Fatal("ejected with passive ejection off")
	}
	if OutcomeBusy.String() != "busy" || Outcome(99).String() != "outcome(99)" {
		t.Fatal("Outcome.String")
	}
}

func BenchmarkObserveOK(b *testing.B) {
	c, _, _ := newTestChecker(b, Options{Disabled: true})
	bs := fakeBackends(b, 4)
	c.SetBackends(bs)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Observe(bs[1], OutcomeOK)
		}
	})
}
