package peers

import (
	"sync"
	"sync/atomic"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
)

// DynamoDefaults are Dynamo's KV router defaults (lib/kv-router/src/scheduling/config.rs,
// KvRouterConfig::default): overlap_score_credit 1.0, prefill_load_scale 1.0,
// router_temperature 0 (lowest cost, exact ties broken at random; no softmax sampling),
// overlap_score_credit_decay 0, decode_active_request_weight 0, router_track_active_blocks
// true, router_track_output_blocks false, router_assume_kv_reuse true,
// router_track_prefill_tokens true.
const (
	DefaultDynamoOverlapCredit    = 1.0
	DefaultDynamoPrefillLoadScale = 1.0
)

// dynamoActive is what Dynamo's router tracks of the requests it routed and that have not
// finished, per worker (lib/kv-router/src/sequences: single.rs, prompt_registry.rs):
//
//   - active prefill tokens: each request's prompt tokens not cached on its worker when it
//     was routed (ISL − overlap), from routing until its first token (mark_prefill_completed);
//   - active blocks: the distinct full prompt blocks of the worker's requests, a prefix that
//     several requests share counted once, from routing until the request ends (free).
//
// A block is named by a key (a hash) and weighs some tokens (a sim block: block_size; a
// prefixlb chunk: its width), so that both of the bench's Dynamo arms count in tokens and
// divide by their block size. Safe for concurrent use.
type dynamoActive struct {
	mu      sync.Mutex
	next    router.Learned
	reqs    map[router.Learned]*activeReq
	workers map[*backend.Backend]*workerActive
}

type activeReq struct {
	b       *backend.Backend
	keys    []uint64
	weights []int32
	prefill int64 // 0 once the first token arrived
	stamp   router.Learned
}

type workerActive struct {
	prefillTokens int64
	blocks        map[uint64]int32 // key → active requests holding it
	blockTokens   int64            // Σ weight of the distinct keys in blocks
}

// workerLoad is one worker's load as the cost sees it for one request.
type workerLoad struct {
	prefillTokens int64 // active prefill tokens
	activeTokens  int64 // distinct active block tokens
	newTokens     int64 // the request's block tokens not already active there
}

func newDynamoActive() dynamoActive {
	return dynamoActive{reqs: map[router.Learned]*activeReq{}, workers: map[*backend.Backend]*workerActive{}}
}

// loads fills out[j] with cs[j]'s load for a request of keys (weights).
func (a *dynamoActive) loads(cs []*backend.Backend, keys []uint64, weights []int32, out []workerLoad) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for j, b := range cs {
		out[j] = workerLoad{}
		w := a.workers[b]
		if w == nil {
			for _, x := range weights {
				out[j].newTokens += int64(x)
			}
			continue
		}
		out[j].prefillTokens, out[j].activeTokens = w.prefillTokens, w.blockTokens
		for i, k := range keys {
			if w.blocks[k] == 0 {
				out[j].newTokens += int64(weights[i])
			}
		}
	}
}

// add records a request routed to b with prefill active prefill tokens; stamp is what the
// arm's index learned (given back by remove). It returns the request's id (never 0).
func (a *dynamoActive) add(b *backend.Backend, keys []uint64, weights []int32, prefill int64, stamp router.Learned) router.Learned {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.workers[b]
	if w == nil {
		w = &workerActive{blocks: map[uint64]int32{}}
		a.workers[b] = w
	}
	a.next++
	r := &activeReq{b: b, keys: keys, weights: weights, prefill: max(prefill, 0), stamp: stamp}
	a.reqs[a.next] = r
	w.prefillTokens += r.prefill
	for i, k := range keys {
		if w.blocks[k] == 0 {
			w.blockTokens += int64(weights[i])
		}
		w.blocks[k]++
	}
	return a.next
}

// prefilled ends request l's prefill (its first token arrived).
func (a *dynamoActive) prefilled(l router.Learned) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.reqs[l]; r != nil {
		a.workers[r.b].prefillTokens -= r.prefill
		r.prefill = 0
	}
}

// remove ends request l and returns the stamp add was given (0: unknown request).
func (a *dynamoActive) remove(l router.Learned) router.Learned {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.reqs[l]
	if r == nil {
		return 0
	}
	delete(a.reqs, l)
	w := a.workers[r.b]
	w.prefillTokens -= r.prefill
	for i, k := range r.keys {
		if w.blocks[k]--; w.blocks[k] <= 0 {
			delete(w.blocks, k)
			w.blockTokens -= int64(r.weights[i])
		}
	}
	return r.stamp
}

// dynamoCost is Dynamo's default worker cost in blocks (selector/default.rs, worker_logit,
// with the request's inputs from selector/mod.rs):
//
//	raw_prefill_blocks = (active_prefill_tokens + ISL) / block_size
//	cost = prefill_load_scale × max(raw_prefill_blocks − overlap_score_credit × overlap_blocks, 0)
//	     + active_blocks + the request's blocks not already active on the worker
//
// overlapTokens is the prompt the worker holds cached (overlap_blocks × block_size).
func dynamoCost(credit, scale float64, blockTokens int, isl int, overlapTokens int, l workerLoad) float64 {
	bs := float64(blockTokens)
	raw := float64(l.prefillTokens+int64(isl)) / bs
	prefill := max(raw-credit*float64(overlapTokens)/bs, 0)
	return scale*prefill + float64(l.activeTokens+l.newTokens)/bs
}

// tieBreaker draws the random tie-breaks of successive picks: pick i's draws are a hash of i
// and the draw's range, so that a Preview (which reads i without taking it) draws what the
// next Pick will.
type tieBreaker struct{ next atomic.Uint64 }

// draw returns the tie-break function of the next pick, taking its turn when commit is set.
// fixed, when not nil, replaces it (tests).
func (t *tieBreaker) draw(commit bool, fixed func(n int) int) func(n int) int {
	if fixed != nil {
		return fixed
	}
	i := t.next.Load()
	if commit {
		i = t.next.Add(1) - 1
	}
	return func(n int) int {
		x := (i*0x9E3779B97F4A7C15 + uint64(n)) * 0xBF58476D1CE4E5B9
		x ^= x >> 31
		return int(x % uint64(n))
	}
}

// pickMin returns the index of the least cost, exact ties broken by rnd (reservoir sampling,
// as Dynamo's minimum_cost_index: the k-th tied candidate replaces the pick when rnd(k) == 0);
// rnd nil keeps the first.
func pickMin(costs []float64, rnd func(n int) int) int {
	best, ties := 0, 1
	for j := 1; j < len(costs); j++ {
		switch {
		case costs[j] < costs[best]:
			best, ties = j, 1
		case costs[j] == costs[best]:
			ties++
			if rnd != nil && rnd(ties) == 0 {
				best = j
			}
		}
	}
	return best
}
