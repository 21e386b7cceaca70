package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// panicTestRequests is how many requests each panic-mode test sends.
const panicTestRequests = 30

// healthWait bounds waiting for active checks (100 ms apart) to change a backend's state.
const healthWait = 10 * time.Second

// switchableReplica is a model server on 127.0.0.1 that answers every request with a small
// completion and /health with 200 or, once failing is set, 503.
type switchableReplica struct {
	srv     *httptest.Server
	failing atomic.Bool
	served  atomic.Int64
}

func newSwitchableReplica(t *testing.T) *switchableReplica {
	t.Helper()
	r := &switchableReplica{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/health" {
			if r.failing.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		r.served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// activeChecks turns the proxy's active checks on, 100 ms apart, rise 2 / fall 3; scraping
// and model discovery off.
func activeChecks(o *Options) {
	checksOn(o)
	o.Health.Interval, o.Health.Timeout, o.Health.ScrapeInterval = 100*time.Millisecond, 100*time.Millisecond, 0
}

// postCompletions sends n completion requests and returns the status and x-prefixlb-backend
// of each.
func postCompletions(t *testing.T, base string, n int) (statuses []int, servedBy []string) {
	t.Helper()
	cl := testClient()
	for i := range n {
		resp, err := cl.Post(base+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"m","prompt":"request `+string(rune('a'+i%26))+`"}`))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
		servedBy = append(servedBy, resp.Header.Get(HeaderBackend))
	}
	return statuses, servedBy
}

// Scale-up: one replica up and two new pods whose model servers are not listening yet. The
// new ones never passed a check, so they are outside panic mode (routing set and count): every
// request goes to the one that is up. Before, 1 of 3 healthy meant panic mode, and requests
// routed to the refusing ports came back 502 when the retry landed on the other one too.
func TestPanicModeSkipsNeverPassedBackends(t *testing.T) {
	up := newSwitchableReplica(t)
	s, base := startProxy(t, "round-robin", []string{up.srv.URL, deadURL(t), deadURL(t)}, activeChecks)
	bs := s.Backends()
	eventually(t, healthWait, "the replica that is up passes its first check", bs[0].Healthy)
	statuses, _ := postCompletions(t, base, panicTestRequests)
	bad := 0
	for _, st := range statuses {
		if st != http.StatusOK {
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d requests failed (statuses %v); the backends that never passed must take no traffic", bad, len(statuses), statuses)
	}
	if got := up.served.Load(); got != panicTestRequests {
		t.Errorf("the replica that is up served %d of %d", got, panicTestRequests)
	}
	for _, b := range bs[1:] {
		if !b.NeverPassed() || b.Served() != 0 {
			t.Errorf("%s: never passed %v, served %d; want true, 0", b.Name, b.NeverPassed(), b.Served())
		}
	}
}

// Panic mode still holds for replicas that passed once and then failed their checks (a
// /health that flaps while generation works): below half healthy, they take traffic again.
func TestPanicModeCoversBackendsThatPassedOnce(t *testing.T) {
	rs := []*switchableReplica{newSwitchableReplica(t), newSwitchableReplica(t), newSwitchableReplica(t)}
	s, base := startProxy(t, "round-robin", []string{rs[0].srv.URL, rs[1].srv.URL, rs[2].srv.URL}, activeChecks)
	bs := s.Backends()
	eventually(t, healthWait, "all three replicas pass their first check", func() bool {
		return bs[0].Healthy() && bs[1].Healthy() && bs[2].Healthy()
	})
	rs[1].failing.Store(true)
	rs[2].failing.Store(true)
	eventually(t, healthWait, "two replicas fail three checks in a row", func() bool {
		return !bs[1].Healthy() && !bs[2].Healthy()
	})
	statuses, servedBy := postCompletions(t, base, panicTestRequests)
	byUnhealthy := 0
	for i, st := range statuses {
		if st != http.StatusOK {
			t.Fatalf("request %d: status %d", i, st)
		}
		if servedBy[i] == bs[1].Name || servedBy[i] == bs[2].Name {
			byUnhealthy++
		}
	}
	if byUnhealthy == 0 {
		t.Fatalf("1 of 3 healthy and no request went to the 2 unhealthy replicas: panic mode is off (served by %v)", servedBy)
	}
	if bs[1].NeverPassed() || bs[2].NeverPassed() {
		t.Error("replicas that passed once are marked never passed")
	}
}
