package peers

import (
	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// Defaults of the sglang peer: the SGLang router's command-line defaults (sglang
// sgl-model-gateway/src/main.rs, the same in smg), which is what `python -m
// sglang_router.launch_router` runs with. CacheAwareConfig::default() in the library has
// 0.5 / 32 / 1.1 instead; see ../shared/research/sglang-router.md §1.
const (
	// DefaultSGLangCacheThreshold is --cache-threshold 0.3: a match must cover more than 30%
	// of the prompt to decide.
	DefaultSGLangCacheThreshold = 0.3
	// DefaultSGLangBalanceAbs is --balance-abs-threshold 64 requests.
	DefaultSGLangBalanceAbs = 64
	// DefaultSGLangBalanceRel is --balance-rel-threshold 1.5.
	DefaultSGLangBalanceRel = 1.5
)

// SGLangOptions tune the sglang peer; zero fields take the defaults above.
type SGLangOptions struct {
	// Prefix sizes the approximate tree (chunk size, capacity), as prefix mode's index.
	Prefix router.PrefixOptions
	// CacheThreshold is the match ratio (matched ÷ prompt tokens) a match must exceed.
	CacheThreshold float64
	// BalanceAbs and BalanceRel decide imbalance: max − min > BalanceAbs and
	// max > BalanceRel × min, over the candidates' in-flight counts.
	BalanceAbs int64
	BalanceRel float64
	// SmallestTree makes a balanced miss go to the candidate with the fewest index entries,
	// as the router did before sglang PR #14650 (2025-12-09); false, the default, takes the
	// least loaded, as it does since.
	SmallestTree bool
}

// SGLang is the SGLang router's cache_aware policy. Source: sglang
// sgl-model-gateway/src/policies/cache_aware.rs (select_worker) and src/main.rs (defaults),
// lightseekorg/smg model_gateway/src/policies/cache_aware.rs; summarised in
// ../shared/research/sglang-router.md §1.
//
// The router keeps one approximate radix tree of the text it sent to each worker. Here that
// tree is prefixlb's approximate index (matched leading chunks per backend, learned from
// where each request was sent, as the router inserts the text for the chosen worker); it is
// chunk-level where SGLang's is character-level. Load is this proxy's in-flight count, as
// SGLang counts its own in-flight requests per worker. Per request:
//
//  1. Imbalanced (max − min > BalanceAbs and max > BalanceRel × min): the least loaded
//     candidate (router.ReasonLeastLoad).
//  2. Else, if the deepest match covers more than CacheThreshold of the prompt: the
//     candidate holding it (router.ReasonMatch); among several, the least loaded, where
//     SGLang takes the first tenant of the deepest node.
//  3. Else the least loaded candidate (router.ReasonCold), or with SmallestTree the one with
//     the fewest index entries.
//
// Ties break by a rotating start, as SGLang breaks them at random (PR #33138).
type SGLang struct {
	tree
	o   SGLangOptions
	rot rotor
}

// NewSGLang returns an sglang policy; call SetBackends before use.
func NewSGLang(o SGLangOptions) *SGLang {
	if o.CacheThreshold <= 0 {
		o.CacheThreshold = DefaultSGLangCacheThreshold
	}
	if o.BalanceAbs <= 0 {
		o.BalanceAbs = DefaultSGLangBalanceAbs
	}
	if o.BalanceRel <= 0 {
		o.BalanceRel = DefaultSGLangBalanceRel
	}
	return &SGLang{tree: newTree(o.Prefix), o: o}
}

// Pick applies the cache_aware rules above.
func (p *SGLang) Pick(k *key.Key, cs []*backend.Backend) router.Decision { return p.pick(k, cs, true) }

// Preview is Pick without turning the rotation.
func (p *SGLang) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, false)
}

func (p *SGLang) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	n := len(cs)
	if n == 0 {
		return router.Decision{}
	}
	loads := make([]int64, n)
	lo, hi := cs[0].InFlight(), cs[0].InFlight()
	for j, b := range cs {
		loads[j] = b.InFlight()
		lo, hi = min(lo, loads[j]), max(hi, loads[j])
	}
	matched := p.match(k, cs)
	start := p.rot.startAt(commit)
	least := func() int { return argmin(n, start, func(j int) float64 { return float64(loads[j]) }) }
	if hi-lo > p.o.BalanceAbs && float64(hi) > p.o.BalanceRel*float64(lo) {
		j := least()
		return router.Decision{Backend: cs[j], Reason: router.ReasonLeastLoad, MatchedChunks: matched[j]}
	}
	best := 0
	for _, m := range matched {
		best = max(best, m)
	}
	if k != nil && k.PromptTokens > 0 && best > 0 &&
		float64(p.heldTokens(k, best)) > p.o.CacheThreshold*float64(k.PromptTokens) {
		j := argmin(n, start, func(j int) float64 {
			if matched[j] < best {
				return float64(1 << 62)
			}
			return float64(loads[j])
		})
		return router.Decision{Backend: cs[j], Reason: router.ReasonMatch, MatchedChunks: matched[j]}
	}
	j := least()
	if p.o.SmallestTree {
		j = p.smallest(cs, start)
	}
	return router.Decision{Backend: cs[j], Reason: router.ReasonCold, MatchedChunks: matched[j]}
}

// smallest returns the candidate with the fewest index entries.
func (p *SGLang) smallest(cs []*backend.Backend, start uint64) int {
	entries := make(map[string]int64, len(cs))
	for _, s := range p.idx.Stats(make([]index.BackendStats, 0, len(cs))) {
		entries[s.Name] = s.Entries
	}
	return argmin(len(cs), start, func(j int) float64 { return float64(entries[cs[j].Name]) })
}

var (
	_ router.Policy    = (*SGLang)(nil)
	_ router.Fleet     = (*SGLang)(nil)
	_ router.Learner   = (*SGLang)(nil)
	_ router.Inspector = (*SGLang)(nil)
)
