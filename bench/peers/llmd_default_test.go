package peers

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
)

// TestLLMDDefaultRules: each scorer of llm-d's default profile on hand-made candidate sets,
// the queue and KV usage scraped over HTTP from each backend's /metrics. score = 3 × matched
// tokens/528 + 2 × queue + 2 × (1 − KV usage). The cases marked "old" were decided wrongly
// before, when the queue was the proxy's Load (in-flight, or scraped running + waiting) and
// the usage an estimate from it.
func TestLLMDDefaultRules(t *testing.T) {
	conv := chain("conv", 10) // 528 tokens
	tests := []struct {
		name     string
		held     map[int]int // backend → leading chunks of conv it holds
		waiting  []int       // scraped vllm:num_requests_waiting per backend
		kv       []float64   // scraped vllm:kv_cache_usage_perc (nil: 0)
		inFlight []int       // this proxy's in-flight requests (nil: none)
		want     int
		reason   router.Reason
	}{
		{"prefix scorer: equal queues, the deeper holder", map[int]int{0: 4, 1: 9}, []int{1, 1, 1}, nil, nil, 1, router.ReasonMatch},
		{"queue scorer: nobody holds it, the shortest waiting queue", nil, []int{3, 1, 2}, nil, nil, 1, router.ReasonLeastLoad},
		{"a full match (3) outweighs the longest queue (0 against 2)", map[int]int{0: 10}, []int{4, 0}, nil, nil, 0, router.ReasonMatch},
		{"five of ten chunks (208 of 528 tokens: 1.2) do not", map[int]int{0: 5}, []int{4, 0}, nil, nil, 1, router.ReasonLeastLoad},
		{"kv-cache-utilization scorer: a 3-chunk match at 90% use loses",
			map[int]int{0: 3}, []int{0, 0}, []float64{0.9, 0}, nil, 1, router.ReasonLeastLoad},
		{"old: running requests and the proxy's own in-flight are not the waiting queue",
			nil, []int{0, 1}, nil, []int{5, 0}, 0, router.ReasonLeastLoad},
		{"old: the replica's reported usage, not an estimate from load (idle, 60% in use)",
			map[int]int{0: 4}, []int{0, 0}, []float64{0.6, 0}, nil, 1, router.ReasonLeastLoad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var bs []*backend.Backend
			for i, w := range tc.waiting {
				kv := 0.0
				if tc.kv != nil {
					kv = tc.kv[i]
				}
				bs = append(bs, backendAt(t, newMetricsServer(t, vllmMetrics(w, kv)).URL))
			}
			p := NewLLMDDefault(LLMDDefaultOptions{Refresh: time.Millisecond})
			defer p.Close()
			p.SetBackends(bs)
			for i, b := range bs {
				w, kv := float64(tc.waiting[i]), 0.0
				if tc.kv != nil {
					kv = tc.kv[i]
				}
				waitScraped(t, p.metrics, b, func(m *replicaMetrics) bool { return m.Waiting == w && m.KVUsage == kv })
			}
			for b, n := range tc.held {
				p.Learn(keyOf(conv[:n]), bs[b], 0)
			}
			loads(t, bs, tc.inFlight...)
			d := p.Pick(keyOf(conv), bs)
			if d.Backend != bs[tc.want] || d.Reason != tc.reason {
				t.Fatalf("picked %s (%v), want %s (%v)", d.Backend.Name, d.Reason, bs[tc.want].Name, tc.reason)
			}
		})
	}
}

// TestLLMDDefaultUnscraped: a replica not yet scraped (its /metrics failing) reads no queue
// and no KV in use, as a new endpoint does in llm-d; ties rotate.
func TestLLMDDefaultUnscraped(t *testing.T) {
	bs := []*backend.Backend{backendAt(t, newMetricsServer(t, "").URL), backendAt(t, newMetricsServer(t, "").URL)}
	p := NewLLMDDefault(LLMDDefaultOptions{Refresh: time.Millisecond})
	defer p.Close()
	p.SetBackends(bs)
	seen := map[string]bool{}
	for range 2 {
		seen[p.Pick(keyOf(chain("cold", 4)), bs).Backend.Name] = true
	}
	if len(seen) != 2 {
		t.Fatalf("two picks among unscraped equals went to %v, want each once", seen)
	}
}
