package sim

import (
	"time"
)

// walk is Predict's scheduler walk (see Engine.Predict) from the state PredictPending built:
// the engine's running and waiting requests, the pending ones and the target as vreqs.
//
// It applies Schedule's rules step by step, but does not touch every running request at every
// step: under overload most of them are plain decoders (one token a step, a block every
// BlockSize tokens, finished at max_tokens) whose step is known in advance. Those at the front
// of the running list are kept lazy (vreq.lazy): their count, context sum and the steps at
// which they take a block or finish are kept in aggregates, so a step costs O(1) plus the
// running requests that are not plain decoders (prefills, at the tail) and the events due in
// it. A step where the blocks might not suffice (a preemption), where the lazy decoders alone
// exhaust the token budget, or after such a step, is done request by request as before
// (materialize, then exactStep). A waiting head's admission reads the prefix it can gain from
// the walk's running and finished requests through headCache, which compares hashes only for
// the requests that share the head's first uncached block. It predicts exactly what the
// request-by-request walk predicts (TestPredictFastMatchesReference, on saturated states).
type walk struct {
	e       *Engine
	bs      int
	running []vreq // running[:lazyEnd] are lazy (or dead) decoders; running[lazyEnd:] the tail
	waiting []vreq
	done    []vreq // finished or preempted in the walk: their computed blocks stay findable
	free    int
	now     time.Duration
	step    int
	p       *Prediction

	lazyEnd int
	nLazy   int     // live lazy decoders
	nDead   int     // dead entries in running[:lazyEnd]
	lazyK   int     // Σ over live lazy decoders of computed−anchor+1: their Σ seqLen at step s is lazyK + nLazy·s
	alloc   []int   // by (computed−anchor) mod bs: live lazy decoders that take a block in the steps s where that + s ≡ 0
	fin     finHeap // live lazy decoders by the step at whose end they finish
	plan    []int   // per running request from lazyEnd (or 0 in an exact step): tokens computed
	head    headCache
	nextID  int32

	// blk: the waiting head that did not fit in the last fast step, and what its admission
	// depended on; while none of it changed (the same head, no more free blocks, no request
	// finished, no running one that can still add to its hits) it still does not fit.
	blk struct {
		valid            bool
		id               int32
		free, done, dead int
	}

	// Finished requests by frontier key (vreq.fkey): indexed up to doneIdx.
	doneBy   map[uint64][]int32
	doneWild []int32
	doneIdx  int
}

// finHeap orders lazy decoders (running indices) by their last step: a binary min-heap.
type finHeap []finAt

type finAt struct{ step, i int }

func (h *finHeap) push(x finAt) {
	*h = append(*h, x)
	a := *h
	for j := len(a) - 1; j > 0; {
		p := (j - 1) / 2
		if a[p].step <= a[j].step {
			break
		}
		a[p], a[j] = a[j], a[p]
		j = p
	}
}

func (h *finHeap) pop() finAt {
	a := *h
	x := a[0]
	n := len(a) - 1
	a[0] = a[n]
	a = a[:n]
	for j := 0; ; {
		c := 2*j + 1
		if c >= n {
			break
		}
		if c+1 < n && a[c+1].step < a[c].step {
			c++
		}
		if a[j].step <= a[c].step {
			break
		}
		a[j], a[c] = a[c], a[j]
		j = c
	}
	*h = a
	return x
}

func mod(a, b int) int {
	if a %= b; a < 0 {
		a += b
	}
	return a
}

func (w *walk) run() Prediction {
	for i := range w.running {
		w.running[i].id = w.newID()
	}
	for i := range w.waiting {
		w.waiting[i].id = w.newID()
	}
	w.frontiers()
	if n := len(w.running) + len(w.waiting) + len(w.done); cap(w.done) < n {
		w.done = append(make([]vreq, 0, n), w.done...) // each request finishes or is preempted at most about once
	}
	w.alloc = make([]int, w.bs)
	w.plan = make([]int, 0, len(w.running)+len(w.waiting))
	for ; w.step < maxPredictSteps; w.step++ {
		if w.nDead > 32 && w.nDead > w.nLazy {
			w.materialize() // drop the dead; the decoders turn lazy again
		}
		w.promote()
		ok, blocked, first := w.fastStep()
		if !ok {
			w.materialize()
			blocked, first = w.exactStep()
		}
		if blocked || first {
			return *w.p
		}
	}
	return *w.p
}

func (w *walk) newID() int32 { w.nextID++; return w.nextID }

// promote makes the tail's leading plain decoders lazy, as they stand at the start of the
// step.
func (w *walk) promote() {
	e, s := w.e, w.step
	for w.lazyEnd < len(w.running) {
		v := &w.running[w.lazyEnd]
		if v.target || v.gen == 0 || v.gen >= v.max || v.computed != v.seqLen()-1 || v.nblocks != e.blocksFor(v.computed) {
			return
		}
		v.lazy, v.anchor = true, s
		w.alloc[mod(v.computed-s, w.bs)]++
		w.lazyK += v.computed - s + 1
		w.nLazy++
		w.fin.push(finAt{step: s + v.max - v.gen - 1, i: w.lazyEnd})
		w.lazyEnd++
	}
}

// current sets a lazy decoder's fields to what they are at the start of step s (its blocks
// allocated as far as its computed tokens need).
func (w *walk) current(v *vreq, s int) {
	d := s - v.anchor
	v.computed += d
	v.gen += d
	nb := w.e.blocksFor(v.computed)
	v.owned += nb - v.nblocks
	v.nblocks = nb
	v.anchor = s
}

// materialize turns the lazy decoders back into plain running requests, as at the start of
// the current step, and drops the dead.
func (w *walk) materialize() {
	if w.lazyEnd == 0 {
		return
	}
	n := 0
	for i := range w.running {
		v := w.running[i]
		if i < w.lazyEnd {
			if v.dead {
				continue
			}
			w.current(&v, w.step)
			v.lazy = false
		}
		w.running[n] = v
		n++
	}
	clear(w.running[n:])
	w.running = w.running[:n]
	w.lazyEnd, w.nLazy, w.nDead, w.lazyK = 0, 0, 0, 0
	clear(w.alloc)
	w.fin = w.fin[:0]
	w.head.valid = false
	w.blk.valid = false
}

// fastStep runs step w.step with the lazy decoders in aggregate. ok is false, with nothing
// changed, when the step needs the request-by-request walk: the lazy decoders do not all fit
// in the token budget, or the blocks might not suffice without a preemption.
func (w *walk) fastStep() (ok, blocked, first bool) {
	e, cfg, s := w.e, &w.e.cfg, w.step
	budget := cfg.MaxNumBatchedTokens - w.nLazy
	if budget < 0 {
		return false, false, false
	}
	take := w.alloc[mod(-s, w.bs)]
	// Dry run of the tail: every block it takes must be free (then, taken in order, none
	// preempts).
	free, b := w.free-take, budget
	if free < 0 {
		return false, false, false
	}
	for i := w.lazyEnd; i < len(w.running) && b > 0; i++ {
		r := &w.running[i]
		n := min(r.seqLen()-r.computed, b)
		need := e.blocksFor(r.computed+n) - r.nblocks
		if free < need {
			return false, false, false
		}
		free -= need
		b -= n
	}

	w.free -= take
	st := stepLoad{decodeSeqs: w.nLazy, decodeCtx: float64(w.lazyK + w.nLazy*s)}
	w.plan = w.plan[:0]
	for i := w.lazyEnd; i < len(w.running) && budget > 0; i++ {
		r := &w.running[i]
		n := min(r.seqLen()-r.computed, budget)
		need := e.blocksFor(r.computed+n) - r.nblocks
		budget -= n
		w.schedule(&st, r, n, need)
	}
	for budget > 0 && len(w.running)-w.nDead < cfg.MaxNumSeqs && len(w.waiting) > 0 {
		if b := &w.blk; b.valid && b.id == w.waiting[0].id && w.free <= b.free && len(w.done) == b.done && w.nDead == b.dead {
			break
		}
		n, ok := w.admit(&budget, w.headHits)
		if !ok {
			b := &w.blk
			b.valid = !w.waiting[0].gain || w.head.settled
			b.id, b.free, b.done, b.dead = w.waiting[0].id, w.free, len(w.done), w.nDead
			break
		}
		st.prefill(n, w.running[len(w.running)-1].computed)
		w.plan = append(w.plan, n)
	}
	if w.nLazy == 0 && len(w.plan) == 0 {
		return true, true, false // blocked: nothing runs and the queue head does not fit
	}
	w.now += w.duration(&st)
	for j, n := range w.plan {
		r := &w.running[w.lazyEnd+j]
		r.computed += max(n, 1)
		if r.computed < r.seqLen() {
			continue
		}
		r.gen++
		if r.target && r.gen == 1 {
			w.p.TTFT, w.p.OK = w.now, true
			return true, false, true
		}
	}
	// Finished at the end of this step: lazy decoders due now, then the tail's.
	for len(w.fin) > 0 && w.fin[0].step == s {
		i := w.fin.pop().i
		v := &w.running[i]
		w.alloc[mod(v.computed-v.anchor, w.bs)]--
		w.lazyK -= v.computed - v.anchor + 1
		w.nLazy--
		w.nDead++
		u := *v
		w.current(&u, s+1)
		u.lazy = false
		w.free += u.owned
		w.done = append(w.done, u)
		v.dead = true
	}
	tail := len(w.running) - w.lazyEnd
	var t []vreq
	t, w.done, w.free = finish(w.running[w.lazyEnd:], w.done, w.free)
	if len(t) < tail {
		clear(w.running[w.lazyEnd+len(t):])
		w.running = w.running[:w.lazyEnd+len(t)]
		w.head.valid, w.blk.valid = false, false // tail indices moved
	}
	return true, false, false
}

// exactStep is step w.step request by request, with nothing lazy: Schedule's rules as
// Engine.Predict describes them.
func (w *walk) exactStep() (blocked, first bool) {
	e, cfg := w.e, &w.e.cfg
	bs := w.bs
	budget := cfg.MaxNumBatchedTokens
	w.plan = w.plan[:0]
	var st stepLoad
	preempted := false
	for i := 0; i < len(w.running) && budget > 0; i++ {
		r := &w.running[i]
		n := min(r.seqLen()-r.computed, budget)
		need := e.blocksFor(r.computed+n) - r.nblocks
		self := false
		for w.free < need {
			last := len(w.running) - 1
			v := w.running[last]
			w.running = w.running[:last]
			w.free += v.owned
			w.done = append(w.done, v) // its registered blocks stay cached
			v.hits = min(v.computed/bs, (v.seqLen()-1)/bs, e.hashable(&v))
			v.pinnedFree = min(v.hits, v.owned)
			v.computed, v.nblocks, v.owned, v.preempted = 0, 0, 0, true
			v.id, v.gain = w.newID(), true
			w.waiting = append(w.waiting, vreq{})
			copy(w.waiting[1:], w.waiting)
			w.waiting[0] = v
			preempted = true
			if last == i {
				self = true
				break
			}
		}
		if self {
			break
		}
		budget -= n
		w.schedule(&st, r, n, need)
	}
	w.head.valid = false
	w.blk.valid = false
	for !preempted && budget > 0 && len(w.running) < cfg.MaxNumSeqs && len(w.waiting) > 0 {
		n, ok := w.admit(&budget, func(v *vreq) (int, int) { return e.admissionHits(v, w.running, w.done) })
		if !ok {
			break
		}
		st.prefill(n, w.running[len(w.running)-1].computed)
		w.plan = append(w.plan, n)
	}
	if len(w.plan) == 0 {
		return true, false // blocked: nothing runs and the queue head does not fit
	}
	w.now += w.duration(&st)
	for i, n := range w.plan {
		r := &w.running[i]
		r.computed += max(n, 1)
		if r.computed < r.seqLen() {
			continue
		}
		r.gen++
		if r.target && r.gen == 1 {
			w.p.TTFT, w.p.OK = w.now, true
			return false, true
		}
	}
	w.running, w.done, w.free = finish(w.running, w.done, w.free)
	return false, false
}

// admit admits the waiting head if its whole sequence fits beside the prefix hits gives it,
// with blocks for its first chunk (at most *budget tokens, which it takes); it returns the
// chunk.
func (w *walk) admit(budget *int, hits func(*vreq) (int, int)) (int, bool) {
	e, bs := w.e, w.bs
	h, fromDone := hits(&w.waiting[0])
	r := w.waiting[0]
	pinned := r.pinnedFree + fromDone
	if w.free-pinned < e.blocksFor(r.seqLen())-h {
		return 0, false
	}
	r.computed = h * bs
	if r.target && !r.preempted {
		w.p.CachedTokens = r.computed
	}
	n := min(r.seqLen()-r.computed, *budget)
	nb := e.blocksFor(r.computed+n) - h
	w.free -= pinned + nb
	r.nblocks, r.owned = h+nb, pinned+nb
	w.waiting = w.waiting[1:]
	w.running = append(w.running, r)
	*budget -= n
	w.head.valid = false
	w.blk.valid = false
	return n, true
}

// stepLoad is what one step of the walk runs, as Schedule's step cost counts it: prefill
// tokens and their context, decoding sequences and theirs.
type stepLoad struct {
	prefillTokens, decodeSeqs int
	prefillCtx, decodeCtx     float64
}

// prefill counts n prompt tokens computed after computed others.
func (st *stepLoad) prefill(n, computed int) {
	st.prefillTokens += n
	st.prefillCtx += float64(n) * (float64(computed) + float64(n)/2)
}

// schedule takes running request r for n tokens of this step (one and generating: a decode)
// with the need blocks they take, and plans it.
func (w *walk) schedule(st *stepLoad, r *vreq, n, need int) {
	w.free -= need
	r.nblocks += need
	r.owned += need
	if n == 1 && r.gen > 0 {
		st.decodeSeqs++
		st.decodeCtx += float64(r.seqLen())
		w.plan = append(w.plan, -1)
		return
	}
	st.prefill(n, r.computed)
	w.plan = append(w.plan, n)
}

// duration is Schedule's step duration for st.
func (w *walk) duration(st *stepLoad) time.Duration {
	cfg := &w.e.cfg
	return cfg.StepBase +
		time.Duration(st.prefillTokens)*cfg.PrefillPerToken +
		time.Duration(st.prefillCtx/1000*float64(cfg.PrefillPerTokenPerKContext)) +
		time.Duration(st.decodeSeqs)*cfg.DecodePerSeq +
		time.Duration(st.decodeCtx*float64(cfg.DecodePerContextToken))
}
