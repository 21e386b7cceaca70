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

// waitScraped waits (at most 5 s) until s has a scrape of b that satisfies ok.
func waitScraped(t *testing.T, s *scraper, b *backend.Backend, ok func(*replicaMetrics) bool) *replicaMetrics {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if m := s.get(b); m != nil && ok(m) {
			return m
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no scrape of %s within 5 s (last %+v)", b.Name, s.get(b))
	return nil
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
// is scraped no more (close waits for its goroutines).
func TestScraperFollowsAndStops(t *testing.T) {
	a, z := newMetricsServer(t, vllmMetrics(1, 0.1)), newMetricsServer(t, vllmMetrics(2, 0.2))
	ba, bz := backendAt(t, a.URL), backendAt(t, z.URL)
	s := newScraper(time.Millisecond)
	s.setBackends([]*backend.Backend{ba, bz})
	waitScraped(t, s, ba, func(m *replicaMetrics) bool { return m.Waiting == 1 && m.KVUsage == 0.1 })
	waitScraped(t, s, bz, func(m *replicaMetrics) bool { return m.Waiting == 2 })
	a.set(vllmMetrics(9, 0.9))
	waitScraped(t, s, ba, func(m *replicaMetrics) bool { return m.Waiting == 9 && m.KVUsage == 0.9 })
	a.set("") // 500s from now on
	for n := a.hits.Load() + 3; a.hits.Load() < n; {
		time.Sleep(time.Millisecond)
	}
	if m := s.get(ba); m == nil || m.Waiting != 9 {
		t.Fatalf("after failed scrapes: %+v, want the last good one (9 waiting)", m)
	}

	s.setBackends([]*backend.Backend{ba}) // z dropped
	if s.get(bz) != nil {
		t.Fatal("a dropped backend still has metrics")
	}
	s.close()
	time.Sleep(10 * time.Millisecond) // a GET cancelled by close may still reach its handler
	ha, hz := a.hits.Load(), z.hits.Load()
	time.Sleep(20 * time.Millisecond) // 20 intervals
	if a.hits.Load() != ha || z.hits.Load() != hz {
		t.Fatalf("scrapes after close: %d → %d and %d → %d", ha, a.hits.Load(), hz, z.hits.Load())
	}
	s.setBackends([]*backend.Backend{ba, bz}) // closed: starts nothing
	time.Sleep(5 * time.Millisecond)
	if a.hits.Load() != ha {
		t.Fatal("setBackends after close started scraping")
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
