package proxy

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// Start checks every backend once before it serves: a backend that never passed a check takes
// no traffic, so without that round the first requests after a start get 503 no backend (the
// bench's first requests did).
func TestStartChecksBackendsFirst(t *testing.T) {
	be, _ := statusBackend(t, http.StatusOK, `{"choices":[]}`)
	s, url := startProxy(t, "round-robin", []string{be.URL}, func(o *Options) {
		checksOn(o)
		o.Health.Interval = time.Hour // no check but Start's before the request below
		o.Health.ScrapeInterval = 0
	})
	if !s.Backends()[0].Healthy() {
		t.Fatal("serving before the backend's first check")
	}
	if status := testutil.PostJSON(t, url+"/v1/completions", `{"model":"m","prompt":"x"}`); status != http.StatusOK {
		t.Errorf("first request after Start: %d, want 200", status)
	}
}

// Stop right after Start returns once Serve has: Shutdown alone misses a listener that Serve
// has not registered yet, and Serve would accept on it forever.
func TestStopRightAfterStart(t *testing.T) {
	for i := range 20 {
		o := testOptions(t, "round-robin", deadURL(t))
		noHealthChecks(&o)
		s, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		sv := s.Start(context.Background(), ln)
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
			defer cancel()
			stopped <- sv.Stop(ctx)
		}()
		if err := recvWithin(t, stopped, testTimeout, "Stop returns right after Start"); err != nil {
			t.Fatalf("start %d: Stop: %v", i, err)
		}
		if err := sv.Err(); err != nil {
			t.Errorf("start %d: Serve: %v", i, err)
		}
	}
}
