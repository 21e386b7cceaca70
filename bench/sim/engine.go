package sim

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Engine is the continuous-batching model of one vLLM engine (V1 scheduler), with no I/O and no
// clock of its own: the driver asks Schedule for the next step and its duration, lets that much
// model time pass (a sleep in a Replica, an addition in a test), then calls Complete with the
// model time at the end of the step. Requests arriving or aborted meanwhile join the next step.
//
// One step, as vLLM V1 schedules it:
//   - running requests first, in admission order: one still in prefill takes the next chunk of
//     its prompt (at most the remaining token budget: chunked prefill), a decoding one takes
//     one token of the budget;
//   - then waiting requests, first come first served, while the budget, MaxNumSeqs and the KV
//     cache allow: on admission the request's longest cached prefix (full blocks) is pinned and
//     skipped, and blocks for the rest of its prompt plus max_tokens are reserved. The first
//     waiting request that does not fit blocks those behind it (no preemption: it waits).
//   - duration = StepBase + PrefillPerToken × prefill tokens + PrefillPerTokenPerKContext ×
//     Σ prefill token × its context/1000 + DecodePerSeq × decoding sequences +
//     DecodePerContextToken × Σ decoding sequences' context lengths.
//
// A request's first token comes out of the step that finishes its prefill; each later step adds
// one token, until exactly max_tokens. Blocks are registered in the prefix cache as soon as all
// their tokens' KV is computed (prompt and generated tokens alike), and released when the
// request finishes or is aborted.
//
// An Engine is not safe for concurrent use; Replica serialises it with a mutex.
type Engine struct {
	cfg     Config
	kv      *kvCache
	waiting []*Request // FCFS; aborted entries are skipped lazily
	whead   int
	nwait   int
	running []*Request

	plan     []planItem
	planDur  time.Duration
	planned  bool
	hitsBuf  []int32
	stats    Stats
	maxBlock int // blocks one request may need at most
}

type planItem struct {
	r       *Request
	prefill int // prompt tokens computed in this step; 0 = one decode token
}

type reqState int32

const (
	stateNew reqState = iota
	stateWaiting
	stateRunning
	stateFinished
	stateAborted
)

// Request is one generation request. Create it with NewRequest, hand it to Engine.Add; the
// engine publishes progress through the atomic accessors (Generated, Done, CachedTokens), which
// any goroutine may read, and signals Ready.
type Request struct {
	tokens     []uint32 // prompt ids, then generated ids (appended by the engine)
	promptLen  int
	maxTokens  int
	seed       uint64 // chain seed of block hashes (model + cache_salt)
	outSeed    uint64 // picks the output words
	leadSpace  bool   // the first output word has a leading space
	notifyEach bool
	ready      chan struct{}

	// Owned by the engine.
	state        reqState
	arrival      time.Duration
	computed     int // prompt tokens whose KV exists (cached + prefilled)
	cached       int
	gen          int
	blocks       []int32
	hashes       []uint64 // chained hashes of blocks 0..len-1
	nreg         int      // blocks registered in the cache so far
	firstTokenAt time.Duration
	finishedAt   time.Duration
	triedAt      uint64 // kv.version at the last failed admission, +1 (0 = never tried)

	pubGen    atomic.Int32
	pubCached atomic.Int32
	pubDone   atomic.Bool
}

// NewRequest makes a request for prompt (token ids; the engine takes ownership of the slice),
// generating exactly maxTokens tokens. seed starts the chain of block hashes: requests only share
// cached blocks when their seeds are equal (same model and cache_salt; see ChainSeed).
// leadSpace says whether the first generated word starts with a space (true for completions,
// where it continues the prompt's text; false for chat, where it starts the message).
// notifyEach makes the engine signal Ready after every token rather than only at the end.
func NewRequest(prompt []uint32, maxTokens int, seed uint64, leadSpace, notifyEach bool) *Request {
	if need := len(prompt) + maxTokens; cap(prompt) < need {
		p := make([]uint32, len(prompt), need)
		copy(p, prompt)
		prompt = p
	}
	return &Request{
		tokens:     prompt,
		promptLen:  len(prompt),
		maxTokens:  maxTokens,
		seed:       seed,
		outSeed:    outputSeed(seed, prompt),
		leadSpace:  leadSpace,
		notifyEach: notifyEach,
		ready:      make(chan struct{}, 1),
	}
}

// ChainSeed is the hash-chain seed for a model name and cache_salt.
func ChainSeed(model, cacheSalt string) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString(model)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(cacheSalt)
	return d.Sum64()
}

// outputSeed makes the generated text a deterministic function of the prompt (like greedy
// decoding): identical requests get identical answers, so a conversation replayed turn by turn
// echoes text whose KV blocks the engine already cached.
func outputSeed(seed uint64, prompt []uint32) uint64 {
	h := seed ^ uint64(len(prompt))*0x9E3779B97F4A7C15
	if n := len(prompt); n > 0 {
		h ^= uint64(prompt[n-1]) << 32
		h ^= uint64(prompt[n/2])
	}
	return h
}

// PromptTokens is the prompt length in the sim's tokens.
func (r *Request) PromptTokens() int { return r.promptLen }

// MaxTokens is the number of tokens the request generates.
func (r *Request) MaxTokens() int { return r.maxTokens }

// Generated is the number of tokens generated so far.
func (r *Request) Generated() int { return int(r.pubGen.Load()) }

// CachedTokens is the prompt tokens found in the prefix cache at admission (valid once
// Generated() > 0).
func (r *Request) CachedTokens() int { return int(r.pubCached.Load()) }

// Done reports that the request finished (all tokens generated) or was aborted. Read Done
// before Generated: once Done is true, Generated is final.
func (r *Request) Done() bool { return r.pubDone.Load() }

// Ready is signalled (capacity 1, never closed) after progress: every token if notifyEach,
// otherwise at the first token and at the end.
func (r *Request) Ready() <-chan struct{} { return r.ready }

// TTFT is the model time from Add to the first token. Only the engine's goroutine may read it.
func (r *Request) TTFT() time.Duration { return r.firstTokenAt - r.arrival }

// Latency is the model time from Add to the last token. Only the engine's goroutine may read it.
func (r *Request) Latency() time.Duration { return r.finishedAt - r.arrival }

// OutputWord returns the text of generated token i (0-based). Each word is exactly one of the
// sim's tokens, so re-tokenizing the generated text gives back the generated ids.
func (r *Request) OutputWord(i int) string {
	return outputWords[outputWordIndex(r.outSeed, i)][b2i(i > 0 || r.leadSpace)]
}

func (r *Request) outputID(i int) uint32 {
	return outputIDs[outputWordIndex(r.outSeed, i)][b2i(i > 0 || r.leadSpace)]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ErrTooLong is returned by Add for a request that can never run.
var ErrTooLong = errors.New("request too long")

// NewEngine returns an idle engine with an empty KV cache. cfg must be valid.
func NewEngine(cfg Config) *Engine {
	return &Engine{
		cfg:      cfg,
		kv:       newKVCache(cfg.NumGPUBlocks, cfg.BlockSize),
		maxBlock: cfg.NumGPUBlocks,
	}
}

// Add queues r, arrived at model time now. It fails with ErrTooLong when the prompt plus
// max_tokens exceeds MaxModelLen or the whole KV cache.
func (e *Engine) Add(r *Request, now time.Duration) error {
	if r.state != stateNew {
		return errors.New("sim: request added twice")
	}
	total := r.promptLen + r.maxTokens
	if total > e.cfg.MaxModelLen {
		return fmt.Errorf("%w: this model's maximum context length is %d tokens, but %d were requested (%d in the prompt, %d in the completion)",
			ErrTooLong, e.cfg.MaxModelLen, total, r.promptLen, r.maxTokens)
	}
	if e.blocksFor(total) > e.maxBlock {
		return fmt.Errorf("%w: %d tokens do not fit in the KV cache (%d tokens)", ErrTooLong, total, e.cfg.KVCacheTokens())
	}
	if r.promptLen == 0 || r.maxTokens <= 0 {
		return errors.New("sim: empty prompt or max_tokens < 1")
	}
	if e.nwait == 0 && len(e.waiting) > 0 { // only aborted leftovers
		clear(e.waiting)
		e.waiting, e.whead = e.waiting[:0], 0
	}
	r.state = stateWaiting
	r.arrival = now
	e.waiting = append(e.waiting, r)
	e.nwait++
	e.stats.RequestsAdded++
	return nil
}

// Abort removes r: a waiting request leaves the queue, a running one frees its slot and its
// blocks. It may be called between Schedule and Complete; finished requests are left alone.
func (e *Engine) Abort(r *Request) {
	switch r.state {
	case stateWaiting:
		e.nwait--
	case stateRunning:
		for i, x := range e.running {
			if x == r {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
		e.releaseBlocks(r)
	default:
		return
	}
	r.state = stateAborted
	e.stats.RequestsAborted++
	r.pubDone.Store(true)
	notify(r)
}

// Idle reports that nothing is waiting or running.
func (e *Engine) Idle() bool { return e.nwait == 0 && len(e.running) == 0 }

// Schedule plans the next step and returns its model duration; ok is false when there is
// nothing to do (idle, or the queue head waits for KV blocks that no running request will free).
// Calling it again before Complete returns the same plan.
func (e *Engine) Schedule() (d time.Duration, ok bool) {
	if e.planned {
		return e.planDur, true
	}
	cfg := &e.cfg
	budget := cfg.MaxNumBatchedTokens
	e.plan = e.plan[:0]
	var prefill, decodeSeqs int
	var prefillCtx, decodeCtx float64

	for _, r := range e.running {
		if budget == 0 {
			break
		}
		if r.computed < r.promptLen {
			chunk := min(r.promptLen-r.computed, budget)
			budget -= chunk
			prefill += chunk
			prefillCtx += float64(chunk) * (float64(r.computed) + float64(chunk)/2)
			e.plan = append(e.plan, planItem{r: r, prefill: chunk})
		} else {
			budget--
			decodeSeqs++
			decodeCtx += float64(r.promptLen + r.gen)
			e.plan = append(e.plan, planItem{r: r})
		}
	}
	for budget > 0 && len(e.running) < cfg.MaxNumSeqs && e.nwait > 0 {
		r := e.peekWaiting()
		if !e.admit(r) {
			break
		}
		e.popWaiting()
		e.running = append(e.running, r)
		chunk := min(r.promptLen-r.computed, budget)
		budget -= chunk
		prefill += chunk
		prefillCtx += float64(chunk) * (float64(r.computed) + float64(chunk)/2)
		e.plan = append(e.plan, planItem{r: r, prefill: chunk})
	}
	if len(e.plan) == 0 {
		return 0, false
	}
	d = cfg.StepBase +
		time.Duration(prefill)*cfg.PrefillPerToken +
		time.Duration(prefillCtx/1000*float64(cfg.PrefillPerTokenPerKContext)) +
		time.Duration(decodeSeqs)*cfg.DecodePerSeq +
		time.Duration(decodeCtx*float64(cfg.DecodePerContextToken))
	e.planDur, e.planned = d, true
	e.stats.Steps++
	e.stats.BatchedPrefillTokens += uint64(prefill)
	return d, true
}

// Complete applies the planned step, which ended at model time now: prefill progress, one token
// per decoding request and per request whose prefill finished, finished requests leave.
func (e *Engine) Complete(now time.Duration) {
	if !e.planned {
		return
	}
	e.planned = false
	finished := false
	for _, it := range e.plan {
		r := it.r
		if r.state != stateRunning {
			continue // aborted during the step
		}
		if it.prefill > 0 {
			r.computed += it.prefill
			e.registerBlocks(r)
			if r.computed < r.promptLen {
				continue
			}
		}
		if e.emit(r, now) {
			finished = true
		}
	}
	clear(e.plan) // drop references to finished requests
	e.plan = e.plan[:0]
	if finished {
		n := 0
		for _, r := range e.running {
			if r.state == stateRunning {
				e.running[n] = r
				n++
			}
		}
		clear(e.running[n:])
		e.running = e.running[:n]
	}
}

// emit produces the next token of r; it reports whether r finished.
func (e *Engine) emit(r *Request, now time.Duration) bool {
	i := r.gen
	r.tokens = append(r.tokens, r.outputID(i))
	r.gen++
	e.stats.GenerationTokens++
	if r.gen == 1 {
		r.firstTokenAt = now
		e.stats.PromptTokens += uint64(r.promptLen)
		e.stats.TTFT.observe(r.TTFT().Seconds())
		r.pubCached.Store(int32(r.cached))
	}
	e.registerBlocks(r)
	r.pubGen.Store(int32(r.gen))
	if r.gen < r.maxTokens {
		if r.notifyEach || r.gen == 1 {
			notify(r)
		}
		return false
	}
	r.finishedAt = now
	r.state = stateFinished
	e.releaseBlocks(r)
	e.stats.RequestsFinished++
	e.stats.E2E.observe(r.Latency().Seconds())
	r.pubDone.Store(true)
	notify(r)
	return true
}

func notify(r *Request) {
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

// Stats returns a copy of the counters and gauges.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Running = len(e.running)
	s.Waiting = e.nwait
	s.UsedBlocks = e.kv.numUsed()
	s.TotalBlocks = e.kv.numBlocks()
	s.CachedBlocks = len(e.kv.byHash)
	return s
}

func (e *Engine) blocksFor(tokens int) int {
	return (tokens + e.cfg.BlockSize - 1) / e.cfg.BlockSize
}

// admit tries to give r its cached prefix and the blocks for the rest; false if they do not fit.
func (e *Engine) admit(r *Request) bool {
	if r.triedAt != 0 && r.triedAt == e.kv.version+1 {
		return false // no block was freed or cached since the last attempt
	}
	bs := e.cfg.BlockSize
	// Like vLLM, at least the last prompt token is always computed (its logits are needed), so
	// at most (promptLen-1)/bs full blocks can hit.
	maxHit := (r.promptLen - 1) / bs
	hits := e.hitsBuf[:0]
	pinnedFree := 0
	for k := 0; k < maxHit; k++ {
		b, ok := e.kv.lookup(e.hashOf(r, k))
		if !ok {
			break
		}
		hits = append(hits, b)
		if e.kv.blocks[b].ref == 0 {
			pinnedFree++
		}
	}
	e.hitsBuf = hits
	need := e.blocksFor(r.promptLen+r.maxTokens) - len(hits)
	if e.kv.numFree()-pinnedFree < need {
		r.triedAt = e.kv.version + 1
		return false
	}
	r.blocks = make([]int32, 0, len(hits)+need)
	for _, b := range hits {
		e.kv.touch(b)
		r.blocks = append(r.blocks, b)
	}
	for range need {
		r.blocks = append(r.blocks, e.kv.allocate())
	}
	r.cached = len(hits) * bs
	r.computed = r.cached
	r.nreg = len(hits)
	r.state = stateRunning
	e.stats.PrefixQueries += uint64(r.promptLen)
	e.stats.PrefixHits += uint64(r.cached)
	return true
}

// hashOf returns the chained hash of r's block k, computing and remembering it if needed.
func (e *Engine) hashOf(r *Request, k int) uint64 {
	bs := e.cfg.BlockSize
	for len(r.hashes) <= k {
		j := len(r.hashes)
		parent := r.seed
		if j > 0 {
			parent = r.hashes[j-1]
		}
		r.hashes = append(r.hashes, blockHash(parent, r.tokens[j*bs:(j+1)*bs]))
	}
	return r.hashes[k]
}

// registerBlocks publishes every block of r whose tokens' KV is now all computed. The KV of a
// generated token exists once it was fed back, i.e. one step after it was emitted.
func (e *Engine) registerBlocks(r *Request) {
	kvTokens := r.computed
	if r.gen > 0 {
		kvTokens = r.promptLen + r.gen - 1
	}
	bs := e.cfg.BlockSize
	for full := kvTokens / bs; r.nreg < full && r.nreg < len(r.blocks); r.nreg++ {
		h := e.hashOf(r, r.nreg)
		if e.kv.register(r.blocks[r.nreg], h) && e.kv.ev != nil {
			e.kv.ev.stored(r, r.nreg, h, bs)
		}
	}
}

func (e *Engine) releaseBlocks(r *Request) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		e.kv.release(r.blocks[i])
	}
	r.blocks = nil
	r.hashes = nil
}

func (e *Engine) peekWaiting() *Request {
	for e.waiting[e.whead].state != stateWaiting {
		e.waiting[e.whead] = nil
		e.whead++
	}
	return e.waiting[e.whead]
}

func (e *Engine) popWaiting() {
	e.waiting[e.whead] = nil
	e.whead++
	e.nwait--
	if e.whead > 64 && e.whead*2 > len(e.waiting) {
		n := copy(e.waiting, e.waiting[e.whead:])
		clear(e.waiting[n:])
		e.waiting = e.waiting[:n]
		e.whead = 0
	}
}
