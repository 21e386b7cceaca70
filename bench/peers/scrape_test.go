package peers

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// metricsServer is a 127.0.0.1 replica whose /metrics serves body() and counts its scrapes.
type metricsServer struct {
	*httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	body string
}

func newMetricsServer(t *testing.T, body string) *metricsServer {
	t.Helper()
	m := &metricsServer{body: body}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		m.hits.Add(1)
		m.mu.Lock()
		b := m.body
		m.mu.Unlock()
		if b == "" {
			http.Error(w, "no metrics", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, b)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *metricsServer) set(body string) {
	m.mu.Lock()
	m.body = body
	m.mu.Unlock()
}

// vllmMetrics is a vLLM exposition with waiting requests and KV usage (one engine).
func vllmMetrics(waiting int, kv float64) string {
	return fmt.Sprintf(`# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} %g
`, waiting, kv)
}

// backendAt is a backend for url.
func backendAt(t *testing.T, url string) *backend.Backend {
	t.Helper()
	b, err := backend.New(url, 400_000, 1)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitScraped waits (bounded: testutil.Timeout) until s has a scrape of b that satisfies ok.
func waitScraped(t *testing.T, s *scraper, b *backend.Backend, ok func(*replicaMetrics) bool) *replicaMetrics {
	t.Helper()
	var m *replicaMetrics
	if !testutil.Poll(testutil.Timeout, time.Millisecond, func() bool { m = s.get(b); return m != nil && ok(m) }) {
		t.Fatalf("no scrape of %s within %v (last %+v)", b.Name, testutil.Timeout, m)
	}
	return m
}

func TestParseReplicaMetrics(t *testing.T) {
	for _, tc := range []struct {
		name        string
		body        string
		waiting, kv float64
		err         bool
	}{
		{"one engine", vllmMetrics(3, 0.25), 3, 0.25, false},
		{"two engines: waiting summed, usage averaged",
			"vllm:num_requests_waiting{engine=\"0\"} 2\nvllm:num_requests_waiting{engine=\"1\"} 5\n" +
				"vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.25\n", 7, 0.375, false},
		{"queue only", "vllm:num_requests_waiting 4\n", 4, 0, false},
		{"neither metric", "vllm:num_requests_running 4\n", 0, 0, true},
		{"not an exposition", "{\"error\":1}\n", 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseReplicaMetrics(strings.NewReader(tc.body))
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if err == nil && (m.Waiting != tc.waiting || m.KVUsage != tc.kv) {
				t.Fatalf("waiting %v, usage %v; want %v, %v", m.Waiting, m.KVUsage, tc.waiting, tc.kv)
			}
		})
	}
}

// TestScraperReadsTheSim: the scraper reads bench/sim's real exposition over HTTP: the
// metric names llm-d reads are the ones the sim exports.
func TestScraperReadsTheSim(t *testing.T) {
	c, err := sim.StartCluster(sim.DefaultConfig(), 1, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := backendAt(t, c.URLs()[0])
	s := newScraper(time.Millisecond)
	defer s.close()
	s.setBackends([]*backend.Backend{b})
	m := waitScraped(t, s, b, func(*replicaMetrics) bool { return true })
	if m.Waiting != 0 || m.KVUsage != 0 || m.At.IsZero() {
		t.Fatalf("an idle sim scraped as %+v, want no queue, no KV in use", m)
	}
}

// TestScraperFollowsAndStops: values follow the replica at the interval; a failed scrape
// keeps the last good one; a backend dropped by setBackends, and every backend after close,
// is scraped no more (close waits for its scrapes); setBackends after close starts nothing.
func TestScraperFollowsAndStops(t *testing.T) {
	a, z := newMetricsServer(t, vllmMetrics(1, 0.1)), newMetricsServer(t, vllmMetrics(2, 0.2))
	ba, bz := backendAt(t, a.URL), backendAt(t, z.URL)
	s := newScraper(time.Millisecond)
	rt := &countingTransport{inner: s.client.Transport}
	s.client.Transport = rt // the scrapes as the scraper makes them (a server may see a cancelled one late)
	s.setBackends([]*backend.Backend{ba, bz})
	waitScraped(t, s, ba, func(m *replicaMetrics) bool { return m.Waiting == 1 && m.KVUsage == 0.1 })
	waitScraped(t, s, bz, func(m *replicaMetrics) bool { return m.Waiting == 2 })
	a.set(vllmMetrics(9, 0.9))
	waitScraped(t, s, ba, func(m *replicaMetrics) bool { return m.Waiting == 9 && m.KVUsage == 0.9 })
	a.set("") // 500s from now on
	n := a.hits.Load() + 3
	testutil.Eventually(t, testutil.Timeout, "three failed scrapes", func() bool { return a.hits.Load() >= n })
	if m := s.get(ba); m == nil || m.Waiting != 9 {
		t.Fatalf("after failed scrapes: %+v, want the last good one (9 waiting)", m)
	}

	s.setBackends([]*backend.Backend{ba}) // z dropped
	if s.get(bz) != nil {
		t.Fatal("a dropped backend still has metrics")
	}
	s.close()
	if n := rt.inFlight.Load(); n != 0 {
		t.Fatalf("%d scrapes in flight after close returned", n)
	}
	started := rt.started.Load()
	s.setBackends([]*backend.Backend{ba, bz}) // closed: starts nothing
	if s.get(ba) != nil || s.get(bz) != nil {
		t.Fatal("setBackends after close took backends to scrape")
	}
	time.Sleep(20 * time.Millisecond) // the point: 20 intervals in which a scrape outliving close, or started after it, would begin
	if got := rt.started.Load(); got != started {
		t.Fatalf("%d scrapes began after close", got-started)
	}
}

// countingTransport counts the requests begun through it and those not yet answered.
type countingTransport struct {
	inner             http.RoundTripper
	started, inFlight atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.started.Add(1)
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	return c.inner.RoundTrip(r)
}

// CloseIdleConnections is the inner transport's, which the scraper's close calls.
func (c *countingTransport) CloseIdleConnections() {
	if ci, ok := c.inner.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

func TestOptionsWall(t *testing.T) {
	for _, tc := range []struct {
		speedup float64
		want    time.Duration
	}{
		{0, 50 * time.Millisecond}, {1, 50 * time.Millisecond}, {8, 6250 * time.Microsecond},
		{1000, time.Millisecond}, // floored
	} {
		if got := (Options{Speedup: tc.speedup}).Wall(DefaultLLMDRefreshInterval); got != tc.want {
			t.Errorf("speedup %g: %v, want %v", tc.speedup, got, tc.want)
		}
	}
}

// BenchmarkScrapeSim is one scrape of a bench/sim replica over 127.0.0.1: the cost
// llm-d-default pays per replica every refresh interval (50 ms ÷ speedup).
func BenchmarkScrapeSim(b *testing.B) {
	c, err := sim.StartCluster(sim.DefaultConfig(), 1, "127.0.0.1", 0)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s := newScraper(time.Hour)
	defer s.close()
	url := c.URLs()[0] + "/metrics"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.scrape(b.Context(), url); err != nil {
			b.Fatal(err)
		}
	}
}
