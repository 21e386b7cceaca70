package sim

import (
	"time"
)

// Prediction is what an engine's own model predicts for a request that arrives now.
type Prediction struct {
	// TTFT is the model time from now to the request's first token; valid when OK.
	TTFT time.Duration
	// OK is false when the request would not start within maxPredictSteps engine steps (its
	// KV blocks do not fit until requests finish that the walk cannot see finishing).
	OK bool
	// CachedTokens is the prompt prefix (full blocks) the prefix cache holds now.
	CachedTokens int
	// QueuedPrefill is the prompt tokens of running and waiting requests still to prefill
	// ahead of this one; Decoding is the running requests past their prefill.
	QueuedPrefill int
	Decoding      int
}

// maxPredictSteps bounds Predict's walk: a million engine steps is hours of model time, far
// past any TTFT a router compares.
const maxPredictSteps = 1 << 20

// Pending is a request described for Predict: its prompt length, max_tokens and the block
// chain of its prompt, hashed once (NewPending) so a router asking several replicas, or one
// replica under its lock, does not re-hash a long prompt per question. It is both the request
// PredictPending predicts and the requests on their way to the engine (routed to it, not yet
// added) that Predict queues ahead of it.
type Pending struct {
	prompt, max int
	bs          int      // the block size chain was cut with
	chain       []uint64 // block hashes of the prompt's full blocks that can hit
	fp          uint64   // Fingerprint
}

// NewPending describes a request (the sim's token ids, ChainSeed seed, max_tokens) for
// Predict and PredictPending, for an engine of the given block size: it hashes the prompt's
// block chain (≈0.18 ms for 100k tokens, BenchmarkBlockChain100k) and its Fingerprint.
func NewPending(prompt []uint32, seed uint64, maxTokens, blockSize int) Pending {
	return Pending{prompt: len(prompt), max: maxTokens, bs: blockSize,
		chain: blockChain(prompt, seed, blockSize), fp: Fingerprint(prompt, seed, maxTokens)}
}

// Fingerprint is the request's Fingerprint, as its replica logs it on arrival (ArrivalsSince).
func (q Pending) Fingerprint() uint64 { return q.fp }

// blockChain is the chained hashes of the full blocks of prompt that admission can find
// ((len-1)/blockSize: the last prompt token is always computed).
func blockChain(prompt []uint32, seed uint64, bs int) []uint64 {
	if len(prompt) == 0 {
		return nil
	}
	out := make([]uint64, 0, (len(prompt)-1)/bs)
	parent := seed
	for k := 0; k < (len(prompt)-1)/bs; k++ {
		parent = blockHash(parent, prompt[k*bs:(k+1)*bs])
		out = append(out, parent)
	}
	return out
}

// vreq is one request in Predict's walk: only what the step-cost model and the block
// accounting read.
type vreq struct {
	prompt, computed int // prompt tokens; tokens (prompt, then generated) whose KV exists
	gen, max         int
	hits             int // full blocks cached now (waiting requests and the target)
	pinnedFree       int // of those, blocks on the free list that admission pins
	nblocks          int // blocks in its block table
	owned            int // of those, blocks only it pins: freed when it finishes or is preempted
	preempted        bool
	req              *Request
	chain            []uint64 // block hashes when req is nil (pending requests, the target)
	target           bool

	// The walk's bookkeeping (walk): id names the request while it waits (the head's cache);
	// a lazy running request is a decoder whose computed and gen are as at the start of step
	// anchor and advance one a step since; dead: a lazy one that finished (now in done).
	// gain: a waiting request that may find more of its prefix than is cached now, computed
	// meanwhile by another request of the walk; fk and fkey: the frontier key it is filed by
	// (walk.frontiers).
	id               int32
	lazy, dead, gain bool
	anchor           int
	fk               uint8
	fkey             uint64
}

// vreq.fk: how a request relates to the frontier keys of the walk's waiting requests.
const (
	fkNone   = iota // extends no waiting request's cached prefix
	fkOwn           // fkey is its own frontier block (a waiting request)
	fkShares        // a running request with fkey at some waiting request's frontier
	fkWild          // a running request matching several: looked at for every head
)

func (v *vreq) seqLen() int { return v.prompt + v.gen }

// vhash is the chained hash of v's block k; k < v.hashable().
func (e *Engine) vhash(v *vreq, k int) uint64 {
	if v.req == nil {
		return v.chain[k]
	}
	return e.hashOf(v.req, k)
}

// hashable is how many of v's full blocks the walk can hash: a request of the engine's, all
// (hashOf knows the tokens it will generate); a pending one or the target, its prompt's.
func (e *Engine) hashable(v *vreq) int {
	if v.req == nil {
		return len(v.chain)
	}
	return (v.req.promptLen + v.req.maxTokens) / e.cfg.BlockSize
}

// Predict walks the engine's scheduler forward from its current state, without changing its
// schedule, until a request with prompt (the sim's token ids; seed: ChainSeed of model and
// cache_salt) and maxTokens, added now, gets its first token, and returns that time. stepLeft
// is the model time left in the step in flight (the driver knows when it ends; 0 when none is
// planned). The walk applies Schedule's rules step by step (running requests first, each
// taking its next tokens within MaxNumBatchedTokens and the blocks they need, preempting the
// last running request when none is free; then, in a step without preemption, waiting ones in
// queue order while the budget, MaxNumSeqs and free KV blocks allow, each finding at admission
// the prefix cached now or computed meanwhile by a request ahead of it) and Schedule's step
// duration, so with no other arrival it gives the engine's TTFT exactly as long as the blocks
// it counts are the engine's.
//
// What it does not model: requests that arrive after this one (they join behind it, but
// their decode and prefill tokens lengthen its steps, and their blocks can preempt it before
// its first token); evictions during the walk (a preempted request is assumed to find all its
// computed blocks again, where the engine may already have given the deepest ones away); and
// which blocks requests share beyond what the cache shows when the walk starts (a request
// frees the blocks only it pinned then, or allocated in the walk). Under KV pressure these
// make it optimistic: it sees fewer preemptions and shorter recomputes than the engine will.
func (e *Engine) Predict(prompt []uint32, seed uint64, maxTokens int, stepLeft time.Duration, pending []Pending) Prediction {
	if len(prompt) == 0 || maxTokens < 1 {
		return Prediction{}
	}
	return e.PredictPending(NewPending(prompt, seed, maxTokens, e.cfg.BlockSize), stepLeft, pending)
}

// PredictPending is Predict for a request already hashed by NewPending: only the walk, no
// hashing of its prompt. A q made for another block size (or empty) predicts nothing (OK
// false).
func (e *Engine) PredictPending(q Pending, stepLeft time.Duration, pending []Pending) Prediction {
	cfg := &e.cfg
	bs := cfg.BlockSize
	var p Prediction
	if q.prompt == 0 || q.max < 1 || q.bs != bs {
		return p
	}
	// The new request's block hashes (as many as can hit) and its cached prefix now.
	target := e.chainReq(q.prompt, q.max, q.chain)
	target.target = true
	p.CachedTokens = target.hits * bs

	running := make([]vreq, 0, len(e.running)+e.nwait+len(pending)+1)
	for _, r := range e.running {
		v := vreq{prompt: r.promptLen, computed: r.computed, gen: r.gen, max: r.maxTokens, req: r,
			nblocks: len(r.blocks), preempted: r.preemptions > 0}
		for _, b := range r.blocks {
			if e.kv.blocks[b].ref == 1 {
				v.owned++
			}
		}
		running = append(running, v)
	}
	waiting := make([]vreq, 0, e.nwait+len(pending)+1)
	for i := e.whead; i < len(e.waiting); i++ {
		r := e.waiting[i]
		if r == nil || r.state != stateWaiting {
			continue
		}
		v := vreq{prompt: r.promptLen, gen: r.gen, max: r.maxTokens, req: r, preempted: r.preemptions > 0}
		for k := 0; k < (r.seqLen()-1)/bs; k++ {
			b, ok := e.kv.lookup(e.hashOf(r, k))
			if !ok {
				break
			}
			v.hits++
			if e.kv.blocks[b].ref == 0 {
				v.pinnedFree++
			}
		}
		waiting = append(waiting, v)
	}
	for _, v := range running {
		if v.gen == 0 || v.computed < v.seqLen()-1 {
			p.QueuedPrefill += v.seqLen() - v.computed
		} else {
			p.Decoding++
		}
	}
	for _, q := range pending {
		waiting = append(waiting, e.chainReq(q.prompt, q.max, q.chain))
	}
	for _, v := range waiting {
		p.QueuedPrefill += v.seqLen() - v.hits*bs
	}
	waiting = append(waiting, target)

	free := e.kv.numFree()
	now := time.Duration(0)
	var done []vreq // finished or preempted in the walk: their computed blocks stay findable
	if e.planned {
		// The step in flight: its plan (and its blocks) are fixed; the new request joins the
		// next one.
		now = max(stepLeft, 0)
		at := make(map[*Request]int, len(e.running))
		for i, r := range e.running {
			at[r] = i
		}
		for _, it := range e.plan {
			i, ok := at[it.r]
			if !ok {
				continue // aborted during the step
			}
			r := &running[i]
			r.computed += max(it.prefill, 1)
			if r.computed == r.seqLen() {
				r.gen++
			}
		}
		running, done, free = finish(running, done, free)
	}
	w := walk{e: e, bs: bs, running: running, waiting: waiting, done: done, free: free, now: now, p: &p}
	return w.run()
}

// chainReq is a walk request known by its block hashes, with the prefix cached now.
func (e *Engine) chainReq(prompt, maxTokens int, chain []uint64) vreq {
	v := vreq{prompt: prompt, max: maxTokens, chain: chain}
	for _, h := range chain {
		b, ok := e.kv.lookup(h)
		if !ok {
			break
		}
		v.hits++
		if e.kv.blocks[b].ref == 0 {
			v.pinnedFree++
		}
	}
	return v
}

// admissionHits is how many leading full blocks of v's sequence admission would find: those
// cached when the walk began, or computed since by a request in the walk whose sequence shares
// them (hashes are chained, so equal hashes at block k mean equal prefixes up to k). fromDone
// counts the blocks found only with a request that finished or was preempted in the walk:
// blocks on the free list, which admission takes off it.
func (e *Engine) admissionHits(v *vreq, running, done []vreq) (hits, fromDone int) {
	maxHit := min((v.seqLen()-1)/e.cfg.BlockSize, e.hashable(v))
	hits = v.hits
	for j, list := range [2][]vreq{running, done} {
		for i := range list {
			u := &list[i]
			if u.req != nil && u.req == v.req {
				continue
			}
			reg := min(u.computed/e.cfg.BlockSize, e.hashable(u))
			for hits < min(reg, maxHit) && e.vhash(u, hits) == e.vhash(v, hits) {
				hits++
				if j == 1 {
					fromDone++
				}
			}
		}
	}
	return hits, fromDone
}

// finish moves the requests that generated all their tokens to done and returns the blocks
// they freed.
func finish(running, done []vreq, free int) ([]vreq, []vreq, int) {
	n := 0
	for _, r := range running {
		if r.gen >= r.max {
			free += r.owned
			done = append(done, r)
			continue
		}
		running[n] = r
		n++
	}
	return running[:n], done, free
}

// Predict is Engine.Predict on the replica's engine now, with the time left in the step in
// flight taken from the replica's clock. It is how the bench's oracle policy reads a replica's
// true state; nothing else should. It hashes prompt under the replica's lock: a router asking
// several replicas should hash once with NewPending and call PredictPending.
func (r *Replica) Predict(prompt []uint32, seed uint64, maxTokens int, pending []Pending) Prediction {
	if len(prompt) == 0 || maxTokens < 1 {
		return Prediction{}
	}
	return r.PredictPending(NewPending(prompt, seed, maxTokens, r.cfg.BlockSize), pending)
}

// PredictPending is Engine.PredictPending on the replica's engine now: the replica's lock
// (which its engine loop needs for every step) is held for the walk only.
func (r *Replica) PredictPending(q Pending, pending []Pending) Prediction {
	if r.eng == nil {
		return Prediction{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	left := time.Duration(r.stepDue.Load()) - r.modelNow()
	return r.eng.PredictPending(q, left, pending)
}

// ParsePrompt reads a /v1/chat/completions (chat) or /v1/completions body as the replica
// would serve it: the prompt's token ids after the sim's chat template, the hash-chain seed
// (model and cache_salt) and max_tokens. The error is the replica's 4xx message.
func (r *Replica) ParsePrompt(body []byte, chat bool) (tokens []uint32, seed uint64, maxTokens int, err error) {
	ep := epCompletions
	if chat {
		ep = epChat
	}
	return r.parsePrompt(body, ep)
}

// ParseMessagesPrompt is ParsePrompt for a /v1/messages body.
func (r *Replica) ParseMessagesPrompt(body []byte) (tokens []uint32, seed uint64, maxTokens int, err error) {
	return r.parsePrompt(body, epMessages)
}

func (r *Replica) parsePrompt(body []byte, ep endpoint) (tokens []uint32, seed uint64, maxTokens int, err error) {
	var scratch []byte
	ar, aerr := parseRequest(body, ep, &r.cfg, &scratch)
	if aerr != nil {
		return nil, 0, 0, aerr
	}
	return ar.tokens, ar.seed, ar.maxTokens, nil
}
