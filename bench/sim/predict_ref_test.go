package sim

import "time"

// predictRef is the request-by-request walk Predict made before walk (every running request
// at every step, admissionHits over every running and finished request): the reference the
// fast walk must agree with exactly (TestPredictFastMatchesReference).
func (e *Engine) predictRef(q Pending, stepLeft time.Duration, pending []Pending) Prediction {
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
	plan := make([]int, 0, cap(running)) // per running request: tokens computed, -1 decode
	for step := 0; step < maxPredictSteps; step++ {
		budget := cfg.MaxNumBatchedTokens
		plan = plan[:0]
		var prefill, decodeSeqs int
		var prefillCtx, decodeCtx float64
		preempted := false
		for i := 0; i < len(running) && budget > 0; i++ {
			r := &running[i]
			n := min(r.seqLen()-r.computed, budget)
			need := e.blocksFor(r.computed+n) - r.nblocks
			self := false
			for free < need {
				last := len(running) - 1
				v := running[last]
				running = running[:last]
				free += v.owned
				done = append(done, v) // its registered blocks stay cached
				v.hits = min(v.computed/bs, (v.seqLen()-1)/bs, e.hashable(&v))
				v.pinnedFree = min(v.hits, v.owned)
				v.computed, v.nblocks, v.owned, v.preempted = 0, 0, 0, true
				waiting = append(waiting, vreq{})
				copy(waiting[1:], waiting)
				waiting[0] = v
				preempted = true
				if last == i {
					self = true
					break
				}
			}
			if self {
				break
			}
			free -= need
			r.nblocks += need
			r.owned += need
			budget -= n
			if n == 1 && r.gen > 0 {
				decodeSeqs++
				decodeCtx += float64(r.seqLen())
				plan = append(plan, -1)
			} else {
				prefill += n
				prefillCtx += float64(n) * (float64(r.computed) + float64(n)/2)
				plan = append(plan, n)
			}
		}
		for !preempted && budget > 0 && len(running) < cfg.MaxNumSeqs && len(waiting) > 0 {
			r := waiting[0]
			hits, fromDone := e.admissionHits(&r, running, done)
			pinned := r.pinnedFree + fromDone
			if free-pinned < e.blocksFor(r.seqLen())-hits {
				break
			}
			r.computed = hits * bs
			if r.target && !r.preempted {
				p.CachedTokens = r.computed
			}
			n := min(r.seqLen()-r.computed, budget)
			nb := e.blocksFor(r.computed+n) - hits
			free -= pinned + nb
			r.nblocks, r.owned = hits+nb, pinned+nb
			waiting = waiting[1:]
			running = append(running, r)
			budget -= n
			prefill += n
			prefillCtx += float64(n) * (float64(r.computed) + float64(n)/2)
			plan = append(plan, n)
		}
		if len(plan) == 0 {
			return p // blocked: nothing runs and the queue head does not fit
		}
		now += cfg.StepBase +
			time.Duration(prefill)*cfg.PrefillPerToken +
			time.Duration(prefillCtx/1000*float64(cfg.PrefillPerTokenPerKContext)) +
			time.Duration(decodeSeqs)*cfg.DecodePerSeq +
			time.Duration(decodeCtx*float64(cfg.DecodePerContextToken))
		for i, n := range plan {
			r := &running[i]
			r.computed += max(n, 1)
			if r.computed < r.seqLen() {
				continue
			}
			r.gen++
			if r.target && r.gen == 1 {
				p.TTFT, p.OK = now, true
				return p
			}
		}
		running, done, free = finish(running, done, free)
	}
	return p
}
