package peers

import (
	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// DynamoOptions tune the dynamo peer; zero fields take Dynamo's defaults.
type DynamoOptions struct {
	// Prefix sizes the approximate index (chunk size, capacity), as prefix mode's.
	Prefix router.PrefixOptions
	// OverlapCredit is overlap_score_credit (0: DefaultDynamoOverlapCredit).
	OverlapCredit float64
	// PrefillLoadScale is prefill_load_scale (0: DefaultDynamoPrefillLoadScale).
	PrefillLoadScale float64
	// Rand breaks exact ties: Rand(n) is in [0, n) (nil: a pseudo-random draw per pick, which
	// Preview sees as Pick will).
	Rand func(n int) int
}

// Dynamo is NVIDIA Dynamo's KV router in its no-KV-events mode (--no-kv-events: the
// ApproxKvIndexer, an approximate index of what the router itself routed), with Dynamo's
// default cost (ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/default.rs, inputs
// from selector/mod.rs, defaults from scheduling/config.rs; see dynamoCost and
// DynamoDefaults):
//
//	cost = prefill_load_scale × max((active_prefill_tokens + ISL)/block − overlap_score_credit × overlap, 0)
//	     + active blocks (shared prefixes once) + the request's blocks not already active there
//
// the lowest cost wins, exact ties at random (router_temperature 0). The router tracks its
// own active prefill tokens and active blocks per worker (dynamoActive, after
// sequences/prompt_registry.rs): a request's uncached prompt tokens count from routing to its
// first token, its prompt blocks from routing until it ends (router.Tracker).
//
// What it reads: ISL is the key's approximate prompt tokens; a block is a prefixlb chunk
// (key.DefaultChunkTokens tokens at the default, where Dynamo's is the engine's KV block: the
// cost counts tokens ÷ block size in every term, so the unit moves no decision but rounding);
// overlap is the chunks prefixlb's approximate index says the worker holds, learned from where
// this policy routed (Dynamo's ApproxKvIndexer likewise records its routing decisions, and
// expires them after router_ttl_secs 120 where this index evicts by capacity, least recently
// used first). Dynamo's router queue (router_queue_threshold 16 × max_num_batched_tokens of
// active prefill per worker before requests wait at the router) is not modelled: the bench's
// loads stay below it.
//
// The reason is router.ReasonMatch when the chosen worker holds part of the prompt, else
// router.ReasonLeastLoad.
type Dynamo struct {
	tree
	credit, scale float64
	rnd           func(n int) int // nil: ties
	ties          tieBreaker
	act           dynamoActive
}

// NewDynamo returns a dynamo policy; call SetBackends before use.
func NewDynamo(o DynamoOptions) *Dynamo {
	if o.OverlapCredit <= 0 {
		o.OverlapCredit = DefaultDynamoOverlapCredit
	}
	if o.PrefillLoadScale <= 0 {
		o.PrefillLoadScale = DefaultDynamoPrefillLoadScale
	}
	return &Dynamo{tree: newTree(o.Prefix), credit: o.OverlapCredit, scale: o.PrefillLoadScale, rnd: o.Rand,
		act: newDynamoActive()}
}

// Pick returns the candidate of lowest cost.
func (p *Dynamo) Pick(k *key.Key, cs []*backend.Backend) router.Decision { return p.pick(k, cs, true) }

// Preview is the decision Pick would make now, recording nothing.
func (p *Dynamo) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, false)
}

// blocks returns k's chunks as active-block keys with their widths in tokens.
func (p *Dynamo) blocks(k *key.Key) ([]uint64, []int32) {
	if k == nil {
		return nil, nil
	}
	w := make([]int32, len(k.Chunks))
	for i := range w {
		w[i] = int32(key.PrefixTokens(i+1, p.chunkTokens) - key.PrefixTokens(i, p.chunkTokens))
	}
	return k.Chunks, w
}

func (p *Dynamo) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	n := len(cs)
	if n == 0 {
		return router.Decision{}
	}
	isl := 0
	if k != nil {
		isl = k.PromptTokens
	}
	keys, weights := p.blocks(k)
	matched := p.match(k, cs)
	loads := make([]workerLoad, n)
	p.act.loads(cs, keys, weights, loads)
	costs := make([]float64, n)
	for j := range cs {
		held := 0
		if k != nil {
			held = p.heldTokens(k, matched[j])
		}
		costs[j] = dynamoCost(p.credit, p.scale, p.chunkTokens, isl, held, loads[j])
	}
	j := pickMin(costs, p.ties.draw(commit, p.rnd))
	r := router.ReasonLeastLoad
	if matched[j] > 0 {
		r = router.ReasonMatch
	}
	return router.Decision{Backend: cs[j], Reason: r, MatchedChunks: matched[j]}
}

// Learn records k's request as active on b (its uncached prompt as active prefill tokens,
// its chunks as active blocks) and teaches the approximate index that b holds its prompt.
func (p *Dynamo) Learn(k *key.Key, b *backend.Backend, held int) router.Learned {
	if k == nil || !k.Routed || !k.OK || b == nil {
		return 0
	}
	cached := p.heldTokens(k, p.match(k, []*backend.Backend{b})[0])
	stamp := p.tree.Learn(k, b, held)
	keys, weights := p.blocks(k)
	return p.act.add(b, append([]uint64(nil), keys...), weights, int64(k.PromptTokens-cached), stamp)
}

// Unlearn withdraws a request b refused: it is no longer active, and the index forgets it.
func (p *Dynamo) Unlearn(k *key.Key, b *backend.Backend, l router.Learned) {
	p.tree.Unlearn(k, b, p.act.remove(l))
}

// Prefilled ends the active prefill of request l (its first token arrived).
func (p *Dynamo) Prefilled(_ *key.Key, _ *backend.Backend, l router.Learned) { p.act.prefilled(l) }

// Finished ends request l: its blocks are no longer active (the index keeps them).
func (p *Dynamo) Finished(_ *key.Key, _ *backend.Backend, l router.Learned) { p.act.remove(l) }

var (
	_ router.Policy    = (*Dynamo)(nil)
	_ router.Fleet     = (*Dynamo)(nil)
	_ router.Tracker   = (*Dynamo)(nil)
	_ router.Inspector = (*Dynamo)(nil)
)
