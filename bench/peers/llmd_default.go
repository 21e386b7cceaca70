package peers

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// Weights of the llm-d default scheduling profile: llm-d/llm-d-router
// pkg/epp/config/loader/defaults.go (loadDefaultConfig), the same as GIE's chart
// config/charts/epplib/templates/_config.yaml.
const (
	// DefaultLLMDQueueWeight is queue-scorer's weight, 2.
	DefaultLLMDQueueWeight = 2
	// DefaultLLMDKVWeight is kv-cache-utilization-scorer's weight, 2.
	DefaultLLMDKVWeight = 2
	// DefaultLLMDPrefixWeight is prefix-cache-scorer's weight, 3.
	DefaultLLMDPrefixWeight = 3
)

// DefaultLLMDRefreshInterval is how often llm-d's endpoint picker scrapes each replica's
// metrics: --refresh-metrics-interval, default (and minimum) 50 ms (llm-d-router
// pkg/epp/server/options.go, MinRefreshMetricsInterval). It is model time: the bench runs it
// --speedup times faster (Options.Wall).
const DefaultLLMDRefreshInterval = 50 * time.Millisecond

// LLMDDefaultOptions tune the llm-d-default peer; zero fields take the defaults above.
type LLMDDefaultOptions struct {
	// Prefix sizes the approximate index (chunk size, capacity), as prefix mode's.
	Prefix                              router.PrefixOptions
	QueueWeight, KVWeight, PrefixWeight float64
	// Refresh is the wall-time interval between two scrapes of a replica's metrics
	// (0: DefaultLLMDRefreshInterval, as at --speedup 1).
	Refresh time.Duration
}

// LLMDDefault is the llm-d endpoint picker in its default scheduling profile, the one it
// runs without a config file: prefix-cache-scorer ×3, queue-scorer ×2,
// kv-cache-utilization-scorer ×2, max-score-picker. llm-d's guides deploy the optimized
// baseline instead (LLMD). Sources: llm-d/llm-d-router pkg/epp/config/loader/defaults.go,
// pkg/epp/framework/plugins/scheduling/scorer/{queuedepth/queue.go,
// kvcacheutilization/kvcache_utilization.go}, pkg/epp/server/options.go (metric names, the
// 50 ms refresh); ../shared/research/llm-d-gie.md §1.
//
// Each scorer gives a candidate a score in [0, 1]; the candidate of the highest weighted sum
// wins, ties at random (here: a rotating start).
//
//   - prefix: matched blocks ÷ the prompt's blocks, from prefixlb's approximate index (the
//     approximate prefix-cache producer likewise records each request's blocks for the pod
//     it was sent to, with an LRU per pod); a block is a prefixlb chunk, counted by the
//     tokens it spans (key.PrefixTokens), as llm-d's blocks are all one size and prefixlb's
//     head chunks are smaller (key.HeadChunks: a 4-token match is not a block's score).
//   - queue: (max q − q) ÷ (max q − min q) over the candidates, 1 when all are equal, where
//     q is the replica's vllm:num_requests_waiting as last scraped.
//   - kv-cache-utilization: 1 − the replica's vllm:kv_cache_usage_perc as last scraped.
//
// The policy scrapes those two metrics itself from each backend's /metrics (its URL +
// "/metrics") every Refresh, one goroutine per backend, as llm-d's data layer does; a replica
// not yet scraped reads 0 for both, as a new endpoint's metrics do in llm-d. Close stops the
// scrapes.
//
// The reason is router.ReasonMatch when the chosen candidate holds part of the prompt, else
// router.ReasonLeastLoad.
type LLMDDefault struct {
	tree
	o       LLMDDefaultOptions
	rot     rotor
	metrics *scraper
}

// NewLLMDDefault returns an llm-d default-profile policy; call SetBackends to start its
// scrapes and Close to stop them.
func NewLLMDDefault(o LLMDDefaultOptions) *LLMDDefault {
	if o.QueueWeight <= 0 {
		o.QueueWeight = DefaultLLMDQueueWeight
	}
	if o.KVWeight <= 0 {
		o.KVWeight = DefaultLLMDKVWeight
	}
	if o.PrefixWeight <= 0 {
		o.PrefixWeight = DefaultLLMDPrefixWeight
	}
	if o.Refresh <= 0 {
		o.Refresh = DefaultLLMDRefreshInterval
	}
	t := newTree(o.Prefix)
	o.Prefix.ChunkTokens = t.chunkTokens
	return &LLMDDefault{tree: t, o: o, metrics: newScraper(o.Refresh)}
}

// SetBackends registers every configured backend with the index and scrapes exactly those.
func (p *LLMDDefault) SetBackends(all []*backend.Backend) {
	p.tree.SetBackends(all)
	p.metrics.setBackends(all)
}

// Close stops the metrics scrapes and waits for them to end. It always returns nil.
func (p *LLMDDefault) Close() error {
	p.metrics.close()
	return nil
}

// Pick returns the candidate of the highest weighted score.
func (p *LLMDDefault) Pick(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, true)
}

// Preview is Pick without turning the rotation.
func (p *LLMDDefault) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, false)
}

func (p *LLMDDefault) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	n := len(cs)
	if n == 0 {
		return router.Decision{}
	}
	chunked := 0
	if k != nil {
		chunked = key.PrefixTokens(len(k.Chunks), p.chunkTokens)
	}
	matched := p.match(k, cs)
	q := make([]float64, n)
	kv := make([]float64, n)
	for j, b := range cs {
		if m := p.metrics.get(b); m != nil {
			q[j], kv[j] = m.Waiting, m.KVUsage
		}
	}
	lo, hi := q[0], q[0]
	for _, v := range q {
		lo, hi = min(lo, v), max(hi, v)
	}
	j := argmin(n, p.rot.startAt(commit), func(j int) float64 {
		var s float64
		if chunked > 0 {
			s += p.o.PrefixWeight * float64(key.PrefixTokens(matched[j], p.chunkTokens)) / float64(chunked)
		}
		queue := 1.0
		if hi > lo {
			queue = (hi - q[j]) / (hi - lo)
		}
		s += p.o.QueueWeight * queue
		s += p.o.KVWeight * (1 - kv[j])
		return -s
	})
	r := router.ReasonLeastLoad
	if matched[j] > 0 {
		r = router.ReasonMatch
	}
	return router.Decision{Backend: cs[j], Reason: r, MatchedChunks: matched[j]}
}

var (
	_ router.Policy    = (*LLMDDefault)(nil)
	_ router.Fleet     = (*LLMDDefault)(nil)
	_ router.Learner   = (*LLMDDefault)(nil)
	_ router.Inspector = (*LLMDDefault)(nil)
)
