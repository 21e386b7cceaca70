package sim

// How a waiting head finds its prefix in Predict's walk: frontier keys, the head's cache,
// and the prefix comparisons (walk.headHits is admissionHits for the fast step).

// headCache is what admissionHits needs for the waiting head (id), computed once per head:
// the running requests that may share the head's first block past its cached prefix (rel:
// only they can add to its hits as they compute), and the finished ones scanned so far with
// the longest prefix they give (doneMax). When the head's frontier key is known (vreq.fkey),
// only requests of the same key (or that match several, wild) are looked at, finished ones
// through walk.doneBy; otherwise every finished request, from doneN. Valid while running only
// grows at its tail or loses lazy decoders (marked dead, not moved).
type headCache struct {
	valid        bool
	id           int32
	base, maxHit int
	rel          []relReq
	keyed        bool
	nKey, nWild  int // doneBy[key] and doneWild scanned (keyed)
	doneN        int // done scanned (not keyed)
	doneMax      int
	guess        int  // the last lcp found (requests of a group mostly share as much)
	settled      bool // at the last call no running request in rel could give more as it computes
}

// relReq is a running request (index) that shares the head's prefix past its base, up to
// lcp blocks (at most the head's maxHit): it gives min(lcp, its registered blocks).
type relReq struct{ i, lcp int }

// frontiers marks the waiting requests (vreq.gain) whose hits a request of the walk may
// extend, and files every request by its frontier key (vreq.fk, fkey). A waiting request v's
// cached prefix ends at its frontier F (its first block not in the cache now); another
// request u can extend it only by computing v's block F, so u's blocks before F are v's,
// cached, and u's own frontier is F too, with the same hash. So v can gain only if its
// frontier block's hash is another waiting request's frontier block hash, or a block at that
// position of a request running now, and only from those; the rest admit with exactly the
// prefix cached now (v.hits), with no scan of the walk's requests. A request preempted in the
// walk is marked again (exactStep): its hits are its own computed prefix, past its frontier.
func (w *walk) frontiers() {
	e := w.e
	type front struct {
		n      int32 // waiting requests with this frontier block
		shared bool  // a running request has it too
	}
	fronts := make(map[uint64]*front, len(w.waiting))
	at := make(map[int]bool) // frontier positions
	for i := range w.waiting {
		v := &w.waiting[i]
		f, lim := v.hits, e.hashable(v)
		for f < lim {
			if _, ok := e.kv.lookup(e.vhash(v, f)); !ok {
				break
			}
			f++
		}
		if f >= lim {
			continue // everything it could share is cached: no frontier
		}
		v.fk, v.fkey = fkOwn, e.vhash(v, f)
		if fr := fronts[v.fkey]; fr != nil {
			fr.n++
		} else {
			fronts[v.fkey] = &front{n: 1}
		}
		at[f] = true
	}
	for i := range w.running {
		u := &w.running[i]
		for f := range at {
			if f >= e.hashable(u) {
				continue
			}
			h := e.vhash(u, f)
			fr := fronts[h]
			if fr == nil {
				continue
			}
			fr.shared = true
			if u.fk == fkNone {
				u.fk, u.fkey = fkShares, h
			} else if u.fkey != h {
				u.fk = fkWild
			}
		}
	}
	for i := range w.waiting {
		if v := &w.waiting[i]; v.fk == fkOwn {
			fr := fronts[v.fkey]
			v.gain = fr.n > 1 || fr.shared
		}
	}
	w.doneBy = make(map[uint64][]int32)
}

// headHits is admissionHits for the waiting head v with lazy decoders in running: the same
// answer (the longest prefix running requests give, then finished ones), from headCache.
func (w *walk) headHits(v *vreq) (hits, fromDone int) {
	e, hc := w.e, &w.head
	if !v.gain {
		return v.hits, 0
	}
	keyed := v.fk == fkOwn
	related := func(u *vreq) bool {
		return !keyed || u.fk == fkWild || u.fk != fkNone && u.fkey == v.fkey
	}
	if !hc.valid || hc.id != v.id {
		hc.valid, hc.id, hc.keyed = true, v.id, keyed
		hc.base = v.hits
		hc.maxHit = min((v.seqLen()-1)/w.bs, e.hashable(v))
		hc.rel, hc.doneN, hc.nKey, hc.nWild, hc.doneMax = hc.rel[:0], 0, 0, 0, hc.base
		if hc.base < hc.maxHit {
			hv := e.vhash(v, hc.base)
			for i := range w.running {
				u := &w.running[i]
				if u.dead || !related(u) || u.req != nil && u.req == v.req || hc.base >= e.hashable(u) {
					continue
				}
				if e.vhash(u, hc.base) == hv {
					lcp := w.lcp(u, v, hc.base+1, min(hc.maxHit, e.hashable(u)), hc.guess)
					hc.guess = lcp
					hc.rel = append(hc.rel, relReq{i: i, lcp: min(lcp, hc.maxHit)})
				}
			}
		}
	}
	hits = hc.base
	hc.settled = true
	for _, r := range hc.rel {
		u := &w.running[r.i]
		if u.dead {
			continue // finished: in done
		}
		computed := u.computed
		if u.lazy {
			computed += w.step - u.anchor
		}
		reg := min(computed/w.bs, e.hashable(u))
		if reg < r.lcp {
			hc.settled = false
		}
		hits = max(hits, min(r.lcp, reg))
	}
	scan := func(u *vreq) {
		if u.req == nil || u.req != v.req {
			hc.doneMax = w.extend(v, u, hc.doneMax, hc.maxHit) // past doneMax only if it matches there
		}
	}
	if hc.base < hc.maxHit {
		if keyed {
			w.indexDone()
			for l := w.doneBy[v.fkey]; hc.nKey < len(l); hc.nKey++ {
				scan(&w.done[l[hc.nKey]])
			}
			for ; hc.nWild < len(w.doneWild); hc.nWild++ {
				scan(&w.done[w.doneWild[hc.nWild]])
			}
		} else {
			for ; hc.doneN < len(w.done); hc.doneN++ {
				scan(&w.done[hc.doneN])
			}
		}
	}
	all := max(hits, hc.doneMax)
	return all, all - hits
}

// indexDone files the finished requests not yet in doneBy by their frontier key.
func (w *walk) indexDone() {
	for ; w.doneIdx < len(w.done); w.doneIdx++ {
		switch u := &w.done[w.doneIdx]; u.fk {
		case fkOwn, fkShares:
			w.doneBy[u.fkey] = append(w.doneBy[u.fkey], int32(w.doneIdx))
		case fkWild:
			w.doneWild = append(w.doneWild, int32(w.doneIdx))
		}
	}
}

// lcp is how many leading blocks u and v share, given that they share the first lo and at
// most hi count; guess, tried first, is usually it.
func (w *walk) lcp(u, v *vreq, lo, hi, guess int) int {
	e := w.e
	match := func(k int) bool { return e.vhash(u, k) == e.vhash(v, k) }
	if guess > lo && guess <= hi && match(guess-1) && (guess == hi || !match(guess)) {
		return guess
	}
	for lo < hi && match(lo) {
		lo++
	}
	return lo
}

// extend is how far past h u's registered blocks continue v's prefix.
func (w *walk) extend(v, u *vreq, h, maxHit int) int {
	e := w.e
	reg := min(u.computed/w.bs, e.hashable(u))
	for h < min(reg, maxHit) && e.vhash(u, h) == e.vhash(v, h) {
		h++
	}
	return h
}
