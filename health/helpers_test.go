package health

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// fakeClock is a settable clock for the Checker.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

func (f *fakeClock) Add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

// fakeServer is a model server on 127.0.0.1 whose /health status and /metrics body the test
// sets.
type fakeServer struct {
	srv           *httptest.Server
	healthStatus  atomic.Int32
	metricsStatus atomic.Int32
	metrics       atomic.Pointer[string]
	checks        atomic.Int64
	scrapes       atomic.Int64
	onMetrics     atomic.Pointer[func()] // run while a /metrics request is served, before its body
}

func newFakeServer(t testing.TB) *fakeServer {
	t.Helper()
	f := &fakeServer{}
	f.healthStatus.Store(http.StatusOK)
	f.metricsStatus.Store(http.StatusOK)
	empty := ""
	f.metrics.Store(&empty)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			f.checks.Add(1)
			w.WriteHeader(int(f.healthStatus.Load()))
		case "/metrics":
			f.scrapes.Add(1)
			if fn := f.onMetrics.Load(); fn != nil {
				(*fn)()
			}
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			w.WriteHeader(int(f.metricsStatus.Load()))
			_, _ = w.Write([]byte(*f.metrics.Load()))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeServer) setMetrics(s string) { f.metrics.Store(&s) }

func (f *fakeServer) setMetricsFile(t testing.TB, name string) {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	f.setMetrics(string(data))
}

func (f *fakeServer) backend(t testing.TB) *backend.Backend {
	t.Helper()
	b, err := backend.New(f.srv.URL, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeServers returns n fake model servers and a backend for each.
func fakeServers(t testing.TB, n int) ([]*fakeServer, []*backend.Backend) {
	t.Helper()
	srvs := make([]*fakeServer, n)
	bs := make([]*backend.Backend, n)
	for i := range srvs {
		srvs[i] = newFakeServer(t)
		bs[i] = srvs[i].backend(t)
	}
	return srvs, bs
}

// deadBackend returns a backend on a 127.0.0.1 port nothing listens on.
func deadBackend(t testing.TB) *backend.Backend {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	b, err := backend.New(url, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeBackends returns n backends that are never dialled (passive-only tests).
func fakeBackends(t testing.TB, n int) []*backend.Backend {
	t.Helper()
	bs := make([]*backend.Backend, n)
	for i := range bs {
		b, err := backend.New(fmt.Sprintf("http://127.0.0.1:%d", 1+i), 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
	}
	return bs
}

// newTestChecker returns a Checker with a fake clock and a recording logger.
func newTestChecker(t testing.TB, o Options) (*Checker, *fakeClock, *testutil.LogRecorder) {
	t.Helper()
	log, logs := testutil.RecordingLogger()
	clk := newFakeClock()
	c := New(o, log, clk.Now)
	t.Cleanup(c.Close)
	return c, clk, logs
}

func countLogs(logs *testutil.LogRecorder, msg string) int {
	return len(logs.WithMessage(msg))
}

var bg = context.Background()

// scrapeAll scrapes every tracked backend's metrics once, concurrently, and returns when all
// scrapes are done or ctx ends. It scrapes even when ScrapeInterval is 0; not after Close.
func (c *Checker) scrapeAll(ctx context.Context) {
	c.each(ctx, c.scrapeOne)
}
