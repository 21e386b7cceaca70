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
// A request's sequence is its prompt then the tokens generated so far; each step computes the
// KV of some of the tokens not yet computed, as vLLM's scheduler does (no prefill or decode
// phase, just num_computed_tokens catching up with num_tokens). One step:
//   - running requests first, in admission order: each takes its next tokens to compute, at
//     most the remaining token budget (a prompt chunk: chunked prefill; one token when
//     decoding). KV blocks are allocated as those tokens need them. When a running request
//     cannot get a block, the most recently admitted running request (the last of the running
//     list) is preempted, again until the block fits or the request preempted itself; that
//     request is then not scheduled and the running pass stops;
//   - then, only if nothing was preempted in this step, waiting requests in queue order while
//     the budget, MaxNumSeqs and the KV cache allow: a request is admitted only if its whole
//     sequence (prompt, plus the tokens generated before a preemption) fits in the free
//     blocks beside its longest cached prefix (full blocks, pinned and skipped); blocks are then
//     allocated for its first chunk only. The first waiting request that does not fit blocks
//     those behind it. Nothing is reserved for the tokens still to generate: that is what
//     preemption pays for.
//   - duration = StepBase + PrefillPerToken × prefill tokens + PrefillPerTokenPerKContext ×
//     Σ prefill token × its context/1000 + DecodePerSeq × decoding sequences +
//     DecodePerContextToken × Σ decoding sequences' context lengths.
//
// Preemption is vLLM's recompute (V1 has no swap): the request's blocks are released (the
// registered ones stay in the prefix cache, evictable), its computed tokens reset to 0, and it
// goes back to the front of the waiting queue; on readmission it finds what is still cached of
// its prompt and generated tokens and recomputes the rest as a prefill, whose last step yields
// its next token. Its tokens already streamed stay streamed. Each preemption counts in
// Stats.Preemptions (vllm:num_preemptions).
//
// A request's first token comes out of the step that finishes its prefill; each later step adds
// one token, until exactly max_tokens. Blocks are registered in the prefix cache as soon as all
// their tokens' KV is computed (prompt and generated tokens alike), and released when the
// request finishes, is preempted or is aborted.
//
// Sources (vllm-project/vllm, main, 2026): vllm/v1/core/sched/scheduler.py (Scheduler.schedule:
// the running pass with allocate_slots and, for the FCFS policy, self.running.pop() as the
// victim; no waiting admission in a step with preemptions; _preempt_request: free the blocks,
// num_computed_tokens = 0, num_preemptions += 1, waiting.prepend_request);
// vllm/v1/core/kv_cache_manager.py (allocate_slots: blocks for num_computed + num_new +
// num_lookahead tokens; full_sequence_must_fit for waiting requests, from
// SchedulerConfig.scheduler_reserve_full_isl, default True; watermark, default 0.0, applied to
// waiting admissions only; get_computed_blocks: at most num_tokens-1 tokens hit);
// vllm/v1/metrics/loggers.py (counter vllm:num_preemptions). Lookahead slots are 0 without
// speculative decoding and the watermark is 0 by default, so the sim models neither.
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
	prefill int // tokens computed in this step as a prefill (prompt or recompute); 0 = one decode token
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
	computed     int // tokens (prompt, then generated) whose KV exists: cached + computed
	cached       int // prompt tokens found cached at the first admission
	gen          int
	preemptions  int
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
// Calling it again before Complete returns the same plan. Planning may preempt running
// requests (see Engine).
func (e *Engine) Schedule() (d time.Duration, ok bool) {
	if e.planned {
		return e.planDur, true
	}
	cfg := &e.cfg
	budget := cfg.MaxNumBatchedTokens
	e.plan = e.plan[:0]
	var prefill, decodeSeqs int
	var prefillCtx, decodeCtx float64
	preemptions := e.stats.Preemptions

	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		n := min(r.seqLen()-r.computed, budget)
		if !e.grow(r, n) {
			break // r preempted itself, and every request after it before that
		}
		budget -= n
		if n == 1 && r.gen > 0 {
			decodeSeqs++
			decodeCtx += float64(r.seqLen())
			e.plan = append(e.plan, planItem{r: r})
		} else {
			prefill += n
			prefillCtx += float64(n) * (float64(r.computed) + float64(n)/2)
			e.plan = append(e.plan, planItem{r: r, prefill: n})
		}
	}
	for e.stats.Preemptions == preemptions && budget > 0 && len(e.running) < cfg.MaxNumSeqs && e.nwait > 0 {
		r := e.peekWaiting()
		n, ok := e.admit(r, budget)
		if !ok {
			break
		}
		e.popWaiting()
		e.running = append(e.running, r)
		budget -= n
		prefill += n
		prefillCtx += float64(n) * (float64(r.computed) + float64(n)/2)
		e.plan = append(e.plan, planItem{r: r, prefill: n})
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

// Complete applies the planned step, which ended at model time now: computed tokens advance, a
// request whose sequence is then all computed gets its next token, finished requests leave.
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
		} else {
			r.computed++
		}
		e.registerBlocks(r)
		if r.computed < r.seqLen() {
			continue // a prefill chunk that is not the last
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

// admit tries to admit waiting request r into a step with budget tokens left: it finds r's
// longest cached prefix and, if r's whole sequence fits beside it in the free blocks (vLLM's
// full_sequence_must_fit admission), pins that prefix and allocates blocks for r's first chunk,
// which it returns. false: r does not fit and stays waiting.
func (e *Engine) admit(r *Request, budget int) (chunk int, ok bool) {
	if r.triedAt != 0 && r.triedAt == e.kv.version+1 {
		return 0, false // no block was freed or cached since the last attempt
	}
	bs := e.cfg.BlockSize
	seq := r.seqLen()
	// Like vLLM, at least the last token is always computed (its logits are needed), so at most
	// (seq-1)/bs full blocks can hit.
	maxHit := (seq - 1) / bs
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
	if e.kv.numFree()-pinnedFree < e.blocksFor(seq)-len(hits) {
		r.triedAt = e.kv.version + 1
		return 0, false
	}
	if cap(r.blocks) == 0 {
		r.blocks = make([]int32, 0, e.blocksFor(r.promptLen+r.maxTokens))
	}
	for _, b := range hits {
		e.kv.touch(b)
		r.blocks = append(r.blocks, b)
	}
	r.computed = len(hits) * bs
	r.nreg = len(hits)
	r.state = stateRunning
	r.triedAt = 0
	if r.preemptions == 0 {
		// vLLM counts a resumed request's lookup apart (preempted_queries), not in
		// vllm:prefix_cache_queries, and reports the first admission's cached tokens.
		r.cached = r.computed
		e.stats.PrefixQueries += uint64(r.promptLen)
		e.stats.PrefixHits += uint64(r.cached)
	}
	chunk = min(seq-r.computed, budget)
	for range e.blocksFor(r.computed+chunk) - len(r.blocks) {
		r.blocks = append(r.blocks, e.kv.allocate())
	}
	return chunk, true
}

// grow allocates the blocks running request r needs to compute its next n tokens. When the
// free blocks do not suffice it preempts the last running request, again and again; it reports
// false when r itself was preempted.
func (e *Engine) grow(r *Request, n int) bool {
	need := e.blocksFor(r.computed+n) - len(r.blocks)
	for e.kv.numFree() < need {
		v := e.running[len(e.running)-1]
		e.running[len(e.running)-1] = nil
		e.running = e.running[:len(e.running)-1]
		e.preempt(v)
		if v == r {
			return false
		}
	}
	for range need {
		r.blocks = append(r.blocks, e.kv.allocate())
	}
	return true
}

// preempt sends running request r (already off the running list) back to the front of the
// waiting queue to be recomputed: its blocks are released (the registered ones stay cached).
func (e *Engine) preempt(r *Request) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		e.kv.release(r.blocks[i])
	}
	r.blocks = r.blocks[:0]
	r.computed, r.nreg = 0, 0
	r.state = stateWaiting
	r.preemptions++
	e.stats.Preemptions++
	if e.whead == 0 {
		e.waiting = append(e.waiting, nil)
		copy(e.waiting[1:], e.waiting)
		e.whead = 1
	}
	e.whead--
	e.waiting[e.whead] = r
	e.nwait++
}

// seqLen is r's sequence length: prompt and generated tokens.
func (r *Request) seqLen() int { return r.promptLen + r.gen }

// hashOf returns the chained hash of r's block k, computing and remembering it if needed. A
// block past the tokens generated so far is hashed with the tokens r will generate (they are
// a function of its prompt), so Predict can follow a request's blocks ahead of the engine;
// k < (promptLen+maxTokens)/BlockSize.
func (e *Engine) hashOf(r *Request, k int) uint64 {
	bs := e.cfg.BlockSize
	for len(r.hashes) <= k {
		j := len(r.hashes)
		parent := r.seed
		if j > 0 {
			parent = r.hashes[j-1]
		}
		ids := r.tokens[min(j*bs, len(r.tokens)):min((j+1)*bs, len(r.tokens))]
		if len(ids) < bs {
			ids = append(make([]uint32, 0, bs), ids...)
			for i := j*bs + len(ids) - r.promptLen; len(ids) < bs; i++ {
				ids = append(ids, r.outputID(i))
			}
		}
		r.hashes = append(r.hashes, blockHash(parent, ids))
	}
	return r.hashes[k]
}

// registerBlocks publishes every block of r whose tokens' KV is now all computed. The KV of a
// generated token exists once it was fed back, i.e. one step after it was emitted.
func (e *Engine) registerBlocks(r *Request) {
	bs := e.cfg.BlockSize
	for full := r.computed / bs; r.nreg < full && r.nreg < len(r.blocks); r.nreg++ {
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
