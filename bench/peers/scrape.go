package peers

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/prefixlb/prefixlb/backend"
)

// Metric names an llm-d endpoint picker reads from a vLLM replica (llm-d-router
// pkg/epp/server/options.go: TotalQueuedRequestsMetric, KVCacheUsagePercentageMetric).
const (
	metricWaiting = "vllm:num_requests_waiting"
	metricKVUsage = "vllm:kv_cache_usage_perc"
)

// scrapeMaxBytes bounds one metrics body (vLLM's full exposition is 50–300 KB).
const scrapeMaxBytes = 4 << 20

// replicaMetrics is what one scrape of a replica read. It is immutable once stored.
type replicaMetrics struct {
	// Waiting is vllm:num_requests_waiting summed over its series (requests).
	Waiting float64
	// KVUsage is vllm:kv_cache_usage_perc averaged over its series, 0..1.
	KVUsage float64
	// At is when the scrape finished.
	At time.Time
}

// scraper GETs each backend's Prometheus endpoint (its URL + "/metrics") every interval, one
// goroutine per backend as llm-d's data layer runs one collector per endpoint, and keeps the
// last good result per backend. A failed scrape keeps the previous values (llm-d's collector
// leaves the endpoint's metrics as they were). It starts scraping a backend when SetBackends
// first lists it and stops when a later list drops it or Close is called.
type scraper struct {
	interval time.Duration
	client   *http.Client

	mu      sync.Mutex
	closed  bool
	targets map[uint64]*scrapeTarget // by backend ID
	wg      sync.WaitGroup
}

type scrapeTarget struct {
	url    string
	cancel context.CancelFunc
	last   atomic.Pointer[replicaMetrics]
}

// newScraper returns a scraper that scrapes every interval (wall time); call setBackends to
// start it and close to stop it.
func newScraper(interval time.Duration) *scraper {
	return &scraper{
		interval: max(interval, time.Millisecond),
		// One connection per backend, kept alive between scrapes; a scrape that outlasts
		// a second is a failed one.
		client:  &http.Client{Timeout: time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2, DisableCompression: true}},
		targets: map[uint64]*scrapeTarget{},
	}
}

// setBackends scrapes exactly the backends of all from now on.
func (s *scraper) setBackends(all []*backend.Backend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	keep := make(map[uint64]bool, len(all))
	for _, b := range all {
		keep[b.ID] = true
		if _, ok := s.targets[b.ID]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		t := &scrapeTarget{url: b.Name + "/metrics", cancel: cancel}
		s.targets[b.ID] = t
		s.wg.Add(1)
		go s.run(ctx, t)
	}
	for id, t := range s.targets {
		if !keep[id] {
			t.cancel()
			delete(s.targets, id)
		}
	}
}

// get is b's last good scrape (nil: none yet).
func (s *scraper) get(b *backend.Backend) *replicaMetrics {
	s.mu.Lock()
	t := s.targets[b.ID]
	s.mu.Unlock()
	if t == nil {
		return nil
	}
	return t.last.Load()
}

// close stops every scrape and waits for them to end.
func (s *scraper) close() {
	s.mu.Lock()
	s.closed = true
	for id, t := range s.targets {
		t.cancel()
		delete(s.targets, id)
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.client.CloseIdleConnections()
}

func (s *scraper) run(ctx context.Context, t *scrapeTarget) {
	defer s.wg.Done()
	tick := time.NewTicker(s.interval)
	defer tick.Stop()
	for {
		if m, err := s.scrape(ctx, t.url); err == nil {
			t.last.Store(m)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// scrape GETs url and reads the waiting queue and KV usage from its Prometheus text body.
func (s *scraper) scrape(ctx context.Context, url string) (*replicaMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, scrapeMaxBytes))
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	m, err := parseReplicaMetrics(io.LimitReader(resp.Body, scrapeMaxBytes))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	m.At = time.Now()
	return m, nil
}

// parseReplicaMetrics reads vllm:num_requests_waiting (summed over series) and
// vllm:kv_cache_usage_perc (averaged) from a Prometheus text exposition. A body with
// neither is an error. Only those two families' lines reach the parser: a vLLM exposition
// is mostly histograms, which would cost the parser twenty times as much at every refresh.
func parseReplicaMetrics(r io.Reader) (*replicaMetrics, error) {
	var keep bytes.Buffer
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		if line := sc.Bytes(); wanted(line) {
			keep.Write(line)
			keep.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&keep)
	if err != nil {
		return nil, err
	}
	var m replicaMetrics
	w, okW := sumGauge(fams[metricWaiting])
	u, n := 0.0, 0
	if f := fams[metricKVUsage]; f != nil {
		for _, s := range f.GetMetric() {
			if v, ok := value(s); ok {
				u += v
				n++
			}
		}
	}
	if !okW && n == 0 {
		return nil, fmt.Errorf("neither %s nor %s in the exposition", metricWaiting, metricKVUsage)
	}
	m.Waiting = w
	if n > 0 {
		m.KVUsage = u / float64(n)
	}
	return &m, nil
}

// wanted reports whether an exposition line belongs to one of the families read: a sample
// of it, or its # HELP or # TYPE line.
func wanted(line []byte) bool {
	if rest, ok := bytes.CutPrefix(line, []byte("# HELP ")); ok {
		line = rest
	} else if rest, ok := bytes.CutPrefix(line, []byte("# TYPE ")); ok {
		line = rest
	}
	for _, name := range [...]string{metricWaiting, metricKVUsage} {
		if rest, ok := bytes.CutPrefix(line, []byte(name)); ok && len(rest) > 0 && (rest[0] == '{' || rest[0] == ' ' || rest[0] == '\t') {
			return true
		}
	}
	return false
}

// sumGauge sums f's samples; ok is false when f has none.
func sumGauge(f *dto.MetricFamily) (sum float64, ok bool) {
	if f == nil {
		return 0, false
	}
	for _, s := range f.GetMetric() {
		if v, has := value(s); has {
			sum += v
			ok = true
		}
	}
	return sum, ok
}

// value is a gauge's or an untyped sample's value.
func value(s *dto.Metric) (float64, bool) {
	switch {
	case s.GetGauge() != nil:
		return s.GetGauge().GetValue(), true
	case s.GetUntyped() != nil:
		return s.GetUntyped().GetValue(), true
	}
	return 0, false
}
