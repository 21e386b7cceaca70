package peers

import (
	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// DefaultDynamoOverlapWeight is Dynamo's --kv-overlap-score-weight default, 1.0: a prefill
// block costs as much as an active decode block.
const DefaultDynamoOverlapWeight = 1.0

// DynamoOptions tune the dynamo peer; zero fields take the defaults.
type DynamoOptions struct {
	// Prefix sizes the approximate index (chunk size, capacity), as prefix mode's.
	Prefix router.PrefixOptions
	// OverlapWeight is overlap_score_weight (0: DefaultDynamoOverlapWeight).
	OverlapWeight float64
}

// Dynamo is NVIDIA Dynamo's KV router with its approximate indexer (--no-kv-events):
// lowest cost = OverlapWeight × prefill blocks + decode blocks, temperature 0. Source:
// ai-dynamo/dynamo docs/router/kv_cache_routing.md (the cost function, overlap_score_weight
// default 1.0, router_temperature default 0, ApproxKvIndexer); summarised in
// ../shared/research/other-routers.md §C.
//
// A block is a prefixlb chunk (key.DefaultChunkTokens tokens at the default; Dynamo's block
// is the engine's KV block). Per candidate:
//
//   - prefill blocks = the prompt's tokens the candidate does not hold ÷ chunk tokens, the
//     held part from prefixlb's approximate index (Dynamo's ApproxKvIndexer likewise
//     predicts the cache from its own routing decisions; it expires them after 120 s where
//     this index evicts by capacity, least recently used first);
//   - decode blocks = the candidate's Load (this proxy's in-flight count, or the replica's
//     scraped running + waiting requests when higher) × the mean prompt blocks of the
//     requests this policy has routed. Dynamo counts each worker's active blocks
//     (prompt and generated) exactly; a proxy knows neither the generated length nor which
//     requests hold which blocks, so active requests × typical blocks stands in for it. The
//     new request's own blocks, which Dynamo adds to every worker alike, do not change the
//     choice and are left out.
//
// Ties break by a rotating start (Dynamo picks at random among equal costs). The reason is
// router.ReasonMatch when the chosen candidate holds part of the prompt, else
// router.ReasonLeastLoad.
type Dynamo struct {
	tree
	weight float64
	mean   router.RunningMean // prompt blocks per request
	rot    rotor
}

// NewDynamo returns a dynamo policy; call SetBackends before use.
func NewDynamo(o DynamoOptions) *Dynamo {
	if o.OverlapWeight <= 0 {
		o.OverlapWeight = DefaultDynamoOverlapWeight
	}
	return &Dynamo{tree: newTree(o.Prefix), weight: o.OverlapWeight}
}

// Pick returns the candidate of lowest cost.
func (p *Dynamo) Pick(k *key.Key, cs []*backend.Backend) router.Decision { return p.pick(k, cs, true) }

// Preview is Pick without folding the prompt into the running mean or turning the rotation.
func (p *Dynamo) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, false)
}

func (p *Dynamo) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	n := len(cs)
	if n == 0 {
		return router.Decision{}
	}
	prompt := 0
	if k != nil {
		prompt = k.PromptTokens
	}
	blocks := float64(prompt) / float64(p.chunkTokens)
	mean := observe(&p.mean, blocks, commit)
	matched := p.match(k, cs)
	j := argmin(n, p.rot.startAt(commit), func(j int) float64 {
		held := 0
		if k != nil {
			held = p.heldTokens(k, matched[j])
		}
		prefill := float64(prompt-held) / float64(p.chunkTokens)
		return p.weight*prefill + float64(cs[j].Load())*mean
	})
	r := router.ReasonLeastLoad
	if matched[j] > 0 {
		r = router.ReasonMatch
	}
	return router.Decision{Backend: cs[j], Reason: r, MatchedChunks: matched[j]}
}

var (
	_ router.Policy    = (*Dynamo)(nil)
	_ router.Fleet     = (*Dynamo)(nil)
	_ router.Learner   = (*Dynamo)(nil)
	_ router.Inspector = (*Dynamo)(nil)
)
