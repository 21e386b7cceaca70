// Package peers holds bench-only routing policies that follow other LLM routers' published
// algorithms (KubeAI, SGLang router, NVIDIA Dynamo, llm-d), written here from their public
// documentation, so that `prefixlb bench compare --modes` can run them beside prefixlb's own
// modes on the same replicas. They are not modes of `prefixlb serve`.
//
// Each policy sees exactly what prefixlb's prefix policy sees: the request's key (its chained
// chunk hashes and approximate prompt tokens), prefixlb's approximate prefix index (learned
// from where requests were sent, router/index), and each backend's load as backend.Backend
// reports it (this proxy's in-flight count, pending prefill tokens, the replica's scraped
// running + waiting requests). None reads a simulator's internals. A peer that reads replica
// metrics the proxy does not keep (llm-d-default: the waiting queue and KV usage, every
// 50 ms) scrapes them itself over HTTP, as the real router does, and implements io.Closer:
// close it when its proxy stops.
package peers

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// Options are what the bench gives every peer it builds.
type Options struct {
	// Prefix is the proxy's prefix section (chunk size, index capacity), so that a peer's
	// index is sized as prefix mode's would be.
	Prefix router.PrefixOptions
	// Speedup is how many model seconds pass per wall second (the bench's --speedup; 0 or
	// less: 1). A peer's intervals that stand for a deployment's timing (a metrics refresh)
	// are model time and run Speedup times shorter in wall time (Options.Wall).
	Speedup float64
	// KVEvents connects the KV-event peer (dynamo-kv) to its replicas (nil: that peer cannot
	// be built).
	KVEvents *KVEventsOptions
}

// Wall is model-time interval d in wall time at o.Speedup, at least a millisecond.
func (o Options) Wall(d time.Duration) time.Duration {
	s := o.Speedup
	if s <= 0 || math.IsNaN(s) || math.IsInf(s, 0) {
		s = 1
	}
	return max(time.Duration(float64(d)/s), time.Millisecond)
}

// peer is one bench-only policy: its name in --modes and how it is built.
type peer struct {
	name      string
	newPolicy func(Options) (router.Policy, error)
}

// NeedsKVEvents reports whether the peer name reads the replicas' KV events (the bench then
// starts its sims with events on and fills Options.KVEvents).
func NeedsKVEvents(name string) bool { return name == DynamoKVName }

// DynamoKVName is the name of the KV-event Dynamo peer.
const DynamoKVName = "dynamo-kv"

// peers is the table of bench-only policies, in the order Names lists them.
var peers = [...]peer{
	{"chwbl", func(o Options) (router.Policy, error) { return NewCHWBL(CHWBLOptions{}), nil }},
	{"sglang", func(o Options) (router.Policy, error) { return NewSGLang(SGLangOptions{Prefix: o.Prefix}), nil }},
	{"dynamo", func(o Options) (router.Policy, error) { return NewDynamo(DynamoOptions{Prefix: o.Prefix}), nil }},
	{DynamoKVName, func(o Options) (router.Policy, error) {
		if o.KVEvents == nil {
			return nil, fmt.Errorf("%s needs the replicas' KV events (simulated replicas started with them)", DynamoKVName)
		}
		return NewDynamoKV(DynamoOptions{}, *o.KVEvents)
	}},
	{"llm-d", func(o Options) (router.Policy, error) { return NewLLMD(LLMDOptions{Prefix: o.Prefix}), nil }},
	{"llm-d-default", func(o Options) (router.Policy, error) {
		return NewLLMDDefault(LLMDDefaultOptions{Prefix: o.Prefix, Refresh: o.Wall(DefaultLLMDRefreshInterval)}), nil
	}},
}

// Names returns the names of the peer policies.
func Names() []string {
	out := make([]string, len(peers))
	for i, p := range peers {
		out[i] = p.name
	}
	return out
}

// Is reports whether name is a peer policy.
func Is(name string) bool { return slices.Contains(Names(), name) }

// New returns a new peer policy by name, built from o. The error names the peers there are,
// or what the peer lacks. A policy that holds resources (llm-d-default's metrics scrapes,
// dynamo-kv's subscriptions) is an io.Closer; the caller closes it when its proxy stops.
func New(name string, o Options) (router.Policy, error) {
	for _, p := range peers {
		if p.name == name {
			return p.newPolicy(o)
		}
	}
	return nil, fmt.Errorf("unknown peer policy %q (one of %s)", name, strings.Join(Names(), ", "))
}

// tree is the approximate per-backend prefix state the cache-aware peers share: prefixlb's
// own index, learned from where each request was sent, as prefix mode learns it. It gives a
// peer the abilities router.Fleet, router.Learner and router.Inspector.
type tree struct {
	chunkTokens int
	defaultKV   int64 // a backend's KV capacity in tokens when it has none of its own
	idx         *index.Index
	clock       func() time.Time
}

func newTree(o router.PrefixOptions) tree {
	if o.ChunkTokens <= 0 {
		o.ChunkTokens = key.DefaultChunkTokens
	}
	if o.DefaultKVCacheTokens <= 0 {
		o.DefaultKVCacheTokens = index.DefaultKVCacheTokens
	}
	return tree{
		chunkTokens: o.ChunkTokens,
		defaultKV:   o.DefaultKVCacheTokens,
		clock:       time.Now,
		idx: index.New(index.Options{ChunkTokens: o.ChunkTokens, DefaultKVCacheTokens: o.DefaultKVCacheTokens,
			MaxEntries: o.MaxIndexEntries, CoarseWeight: key.CoarseFactor}),
	}
}

// SetBackends registers every configured backend with the index.
func (t *tree) SetBackends(all []*backend.Backend) { t.idx.SetBackends(all) }

// ModelsChanged: the peers keep no state per model pool.
func (t *tree) ModelsChanged(*backend.Backend) {}

// Index is the peer's prefix index.
func (t *tree) Index() *index.Index { return t.idx }

// Explain: the peers show no estimates (/debug/route shows their decision alone).
func (t *tree) Explain(*key.Key, []*backend.Backend) []router.CandidateEstimate { return nil }

// ShadowStats: the peers run no shadow.
func (t *tree) ShadowStats() (router.ShadowStats, bool) { return router.ShadowStats{}, false }

// Correct: the peers' trees do not correct themselves from reported cached tokens.
func (t *tree) Correct(*key.Key, *backend.Backend, router.Learned, router.CacheReport) int { return 0 }

// Learn records that b now holds k's prompt (the peers all insert the routed prompt for the
// chosen worker).
func (t *tree) Learn(k *key.Key, b *backend.Backend, held int) router.Learned {
	if k == nil || !k.Routed || !k.OK || b == nil {
		return 0
	}
	return router.Learned(t.idx.RecordHeld(k.Chunks, b, t.clock(), held))
}

// Unlearn withdraws what Learn added when b refused the request.
func (t *tree) Unlearn(k *key.Key, b *backend.Backend, l router.Learned) {
	if k == nil || l == 0 || b == nil {
		return
	}
	t.idx.Forget(k.Chunks, b, index.Stamp(l))
}

// match returns, per candidate, the leading chunks of k's prompt it holds (nil key: zeros).
func (t *tree) match(k *key.Key, cs []*backend.Backend) []int {
	out := make([]int, len(cs))
	if k != nil {
		t.idx.Match(k.Chunks, cs, out)
	}
	return out
}

// heldTokens is how many approximate prompt tokens the first n chunks cover, at most the
// prompt's length.
func (t *tree) heldTokens(k *key.Key, n int) int {
	return min(key.PrefixTokens(n, t.chunkTokens), k.PromptTokens)
}

// argmin returns the index of the candidate with the least f, scanning from start mod n so
// that ties do not always favour the first candidate (the peers break ties at random).
func argmin(n int, start uint64, f func(j int) float64) int {
	s := int(start % uint64(n))
	best, bv := s, f(s)
	for i := 1; i < n; i++ {
		j := (s + i) % n
		if v := f(j); v < bv {
			best, bv = j, v
		}
	}
	return best
}

// rotor hands out rotating start positions for argmin.
type rotor struct{ next atomic.Uint64 }

func (r *rotor) start() uint64 { return r.next.Add(1) - 1 }

// startAt is start when commit is set, else the position start would hand out, left in place
// (a policy's Preview).
func (r *rotor) startAt(commit bool) uint64 {
	if commit {
		return r.start()
	}
	return r.next.Load()
}

// observe is m.Observe(v) when commit is set, else what it would return (m.With).
func observe(m *router.RunningMean, v float64, commit bool) float64 {
	if commit {
		return m.Observe(v)
	}
	return m.With(v)
}
