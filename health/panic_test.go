package health

import (
	"net/http"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
)

const (
	panicEnter = "fewer than half the backends are healthy: routing to all of them (panic mode)"
	panicLeave = "half or more of the backends are healthy again: leaving panic mode"
)

// Scale-up: one replica up, two new ones still loading their weights (connection refused).
// The new ones are marked NeverPassed, so backend.Healthy routes only to the one that is up,
// and the Checker does not log panic mode for what is not an outage.
func TestNeverPassedOutsidePanic(t *testing.T) {
	up := newFakeServer(t)
	bs := []*backend.Backend{up.backend(t), deadBackend(t), deadBackend(t)}
	c, _, logs := newTestChecker(t, Options{Rise: 2, Fall: 3})
	c.SetBackends(bs)
	for _, b := range bs {
		if !b.NeverPassed() || b.Healthy() {
			t.Fatalf("%s before any check: never passed %v, healthy %v; want true, false", b.Name, b.NeverPassed(), b.Healthy())
		}
	}
	for range 5 {
		c.CheckOnce(bg)
	}
	if bs[0].NeverPassed() || !bs[0].Healthy() {
		t.Fatalf("the replica that is up: never passed %v, healthy %v", bs[0].NeverPassed(), bs[0].Healthy())
	}
	for _, b := range bs[1:] {
		if st := c.State(b); !b.NeverPassed() || !st.NeverPassed || st.ConsecutiveFails != 5 {
			t.Fatalf("%s: never passed %v, state %+v; want never passed after 5 failed checks", b.Name, b.NeverPassed(), st)
		}
	}
	got, panicMode := backend.Healthy(nil, bs)
	if panicMode || len(got) != 1 || got[0] != bs[0] {
		t.Fatalf("backend.Healthy = %d backends, panic %v; want only the replica that is up", len(got), panicMode)
	}
	if n := countLogs(logs, panicEnter); n != 0 {
		t.Errorf("panic mode logged %d times for a scale-up", n)
	}
}

// A replica that passed once and then failed is down, not new: panic mode still covers it.
func TestPassedThenFailedStillPanics(t *testing.T) {
	srvs := []*fakeServer{newFakeServer(t), newFakeServer(t), newFakeServer(t)}
	bs := []*backend.Backend{srvs[0].backend(t), srvs[1].backend(t), srvs[2].backend(t), deadBackend(t)}
	c, _, logs := newTestChecker(t, Options{Rise: 1, Fall: 1})
	c.SetBackends(bs)
	c.CheckOnce(bg)
	srvs[1].healthStatus.Store(http.StatusServiceUnavailable)
	srvs[2].healthStatus.Store(http.StatusServiceUnavailable)
	c.CheckOnce(bg)
	got, panicMode := backend.Healthy(nil, bs)
	if !panicMode || len(got) != 3 {
		t.Fatalf("1 of 3 passed replicas healthy: backend.Healthy = %d backends, panic %v; want the 3 that passed, panic", len(got), panicMode)
	}
	for _, b := range got {
		if b == bs[3] {
			t.Fatal("panic mode routes to the replica that never passed")
		}
	}
	if n := countLogs(logs, panicEnter); n != 1 {
		t.Fatalf("panic mode logged %d times, want 1", n)
	}
	srvs[1].healthStatus.Store(http.StatusOK)
	c.CheckOnce(bg)
	if n := countLogs(logs, panicLeave); n != 1 {
		t.Errorf("leaving panic mode logged %d times, want 1", n)
	}
}

// The max-ejected-percent cap counts as panic mode does: replicas that never passed do not
// use up the share, so a failing replica among those that are up is still ejected.
func TestEjectionCapIgnoresNeverPassed(t *testing.T) {
	srvs := []*fakeServer{newFakeServer(t), newFakeServer(t)}
	bs := []*backend.Backend{srvs[0].backend(t), srvs[1].backend(t), deadBackend(t), deadBackend(t)}
	c, _, _ := newTestChecker(t, Options{Rise: 1, Fall: 1, MaxEjectedPercent: 50})
	c.SetBackends(bs)
	c.CheckOnce(bg)
	for range DefaultConsecutiveFailures {
		c.Observe(bs[1], OutcomeServerError)
	}
	if bs[1].Healthy() {
		t.Fatalf("1 of 2 replicas that are up failing, 2 never passed: not ejected; state %+v", c.State(bs[1]))
	}
	if !bs[0].Healthy() {
		t.Fatal("the other replica is down too")
	}
}
