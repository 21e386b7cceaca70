// Learning: Record adds a prompt's chunks to a backend's entries, Forget withdraws them.

package index

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// Record marks b as holding every chunk of chunks (a prompt's chained hashes, in order) as
// of now, making them its most recently used entries. A prompt longer than b's capacity is
// recorded up to the capacity (a coarse chunk counting Options.CoarseWeight). Backends not
// registered with SetBackends are ignored.
func (x *Index) Record(chunks []uint64, b *backend.Backend, now time.Time) Stamp {
	return x.record(chunks, b, now, 0, false)
}

// RecordNew is Record for chunks b is expected not to hold yet: what a peer learned past the
// prefix it found b holding (peering), which this replica has usually not learned either.
// Each chunk is claimed at once, one lookup under the shard's write lock, where Record first
// looks every chunk up under a read lock, expecting it held; the result is Record's
// (TestRecordNewIsRecord).
func (x *Index) RecordNew(chunks []uint64, b *backend.Backend, now time.Time) Stamp {
	return x.record(chunks, b, now, 0, true)
}

// freshWindow bounds how recently a held prefix must have been touched for RecordHeld to
// leave it as it is: 50 ms, or 1/freshHorizonShare of the backend's LRU horizon (now minus
// its oldest entry's last use) when that is shorter.
const (
	freshWindow       = 50 * time.Millisecond
	freshHorizonShare = 16
)

// RecordHeld is Record for a prompt whose first held chunks b was found to hold when the
// request was routed (router.Decision.MatchedChunks). When b still holds chunks h and held-1
// (h the last head chunk, key.HeadChunks − 1, or held-1 if that is less) and touched both
// within the fresh window, the held chunks are not touched again: every
// request that shares a hot system prompt would otherwise move the same chunks to the front
// of the LRU, a few cache misses each, for a recency that changes by milliseconds. Chunk h is
// touched only by Records that walk their whole prompt (from chunk 0, or from chunk 1 after a
// match of the first chunk alone, which unrelated prompts share), so a prefix is walked in full at
// least once a window and its chunks are at most about two windows staler than a full Record
// would leave them; chunk held-1 alone would let a conversation whose turns come faster than
// the window skip its older turns for good (each turn's last chunk fresh from the turn
// before), and they would age out of the index while the engine keeps them. A prefix still
// marked as added by an earlier Record that no later one touched is touched in full (that
// Record may yet be withdrawn by Forget), and so is the prefix of a Record whose new chunks
// evicted part of it (TestFreshPrefixSurvivesItsOwnSuffix): the Record logs what it evicts
// (slot.evictLog), so that at capacity, where every Record evicts, a prefix whose chunks were
// not among them is still skipped. held ≤ 0 (or a stale hint) records every chunk.
func (x *Index) RecordHeld(chunks []uint64, b *backend.Backend, now time.Time, held int) Stamp {
	return x.record(chunks, b, now, held, false)
}

// record is RecordHeld; allNew (RecordNew, with held 0) expects none of chunks held.
func (x *Index) record(chunks []uint64, b *backend.Backend, now time.Time, held int, allNew bool) Stamp {
	if len(chunks) == 0 || b == nil {
		return 0
	}
	s := x.tab.Load().byID[b.ID]
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed.Load() {
		return 0
	}
	x.catchUp(s, b.Epoch())
	limit := s.limit()
	if limit <= 0 {
		return 0
	}
	chunks = chunks[:s.fit(chunks, limit)]
	t := s.nextStamp(now.UnixNano())
	s.logging = false // a Record that panicked mid-walk left it on
	lo := 0           // the shallowest chunk to record
	if held > 0 && held <= len(chunks) {
		fresh, used := x.heldFresh(s, norm(chunks[held-1]), t)
		if h := min(held, key.HeadChunks) - 1; fresh && held-1 > h {
			fresh, _ = x.heldFresh(s, norm(chunks[h]), t)
		}
		switch {
		case fresh:
			lo = held
		case used > 0:
			s.notePrior(t, used)
		}
	}
	hint := -1 // no hint: every chunk is expected held
	switch {
	case held > 0:
		hint = max(min(held, len(chunks))-lo, 0)
	case allNew:
		hint = 0
	}
	if lo > 0 {
		s.startEvictLog()
	}
	evicted := x.walk(s, chunks[lo:], hint, t, limit)
	if lo > 0 && s.evictedAnyOf(chunks[:lo]) {
		// The held prefix was left as it is, fresh, but this Record's own claims evicted some
		// of it: its chunks need not be as fresh as its deepest one (a Record with a shorter
		// held hint touched only the part past it, so the shallower part is older), and a
		// coarse claim evicts several at once. The prefix is then walked too, as a full Record
		// walks it after the suffix: the result is the full Record's
		// (TestFreshPrefixSurvivesItsOwnSuffix, TestFreshPrefixOlderShallowPart). Claims that
		// evicted only other entries, as every Record at capacity does, leave it as it is.
		evicted += x.walk(s, chunks[:lo], lo, t, limit)
	}
	if evicted > 0 {
		s.evictions.Add(evicted)
		s.regrowBy(int64(evicted))
	}
	return Stamp(t)
}

// Fit is how many leading chunks of chunks a Record on b keeps now: those that fit in b's
// capacity, each counting its weight (a coarse chunk Options.CoarseWeight); 0 for a backend
// not registered. A peer told of the chunks past it would record chunks b's own index never
// held, and evict its copy of the prefix for them.
func (x *Index) Fit(chunks []uint64, b *backend.Backend) int {
	if b == nil {
		return 0
	}
	s := x.tab.Load().byID[b.ID]
	if s == nil {
		return 0
	}
	return s.fit(chunks, max(s.limit(), 0))
}

// fit is how many leading chunks of chunks fit in limit, each counting its weight.
func (s *slot) fit(chunks []uint64, limit int64) int {
	if int64(len(chunks))*s.coarseW <= limit {
		return len(chunks)
	}
	var w int64
	for i, h := range chunks {
		if w += s.weight(norm(h)); w > limit {
			return i
		}
	}
	return len(chunks)
}

// heldFresh reports whether s holds h and touched it within the fresh window before t, and
// the stamp of that last touch (0: s does not hold h). Called with s.mu held.
func (x *Index) heldFresh(s *slot, h uint64, t int64) (fresh bool, used int64) {
	ni := s.recalled(h)
	if ni == nilIdx {
		if ni = x.shard(h).lookup(h, s.num); ni == nilIdx {
			return false, 0
		}
		s.remember(h, ni)
	}
	used = s.nodes[ni].used
	if used&added != 0 {
		// Added by a Record that may yet be withdrawn (Forget) and that no later Record has
		// touched: touch the prefix, which confirms it, rather than leave it to that Forget.
		return false, used &^ added
	}
	window := int64(freshWindow)
	if s.tail != nilIdx {
		window = min(window, (t-s.nodes[s.tail].used&^added)/freshHorizonShare)
	}
	return t-used < window, used
}

// walk records chunks on s as of stamp t, deepest first, each moved to the front: the
// prompt ends up shallow-to-deep from the front of the list, so its deepest chunks are the
// first of it to be evicted. held is how many of the first chunks s is expected to hold (< 0:
// no hint, all of them). More than seqChunks chunks go in batches (recordBatched). Fewer go one by one:
// chained hashes make a backend's entries whole prefixes, so the chunks past held are
// expected new and each is claimed, which looks it up under the write lock that adding it
// takes anyway; the first held (all of them without a hint) are expected held, looked up
// and touched. It returns the entries evicted. Called with s.mu held.
func (x *Index) walk(s *slot, chunks []uint64, held int, t, limit int64) (evicted uint64) {
	if len(chunks) > seqChunks {
		return x.recordBatched(s, chunks, t, limit)
	}
	split := len(chunks)
	if held >= 0 {
		split = min(held, len(chunks))
	}
	x.prefetchClaims(s, chunks[split:], limit)
	for i := len(chunks) - 1; i >= split; i-- {
		h := norm(chunks[i])
		if ni := s.recalled(h); ni != nilIdx {
			s.retouch(ni, t)
		} else {
			evicted += x.touchOrClaim(s, h, t, limit)
		}
	}
	for i := split - 1; i >= 0; i-- {
		h := norm(chunks[i])
		ni := s.recalled(h)
		if ni == nilIdx {
			if ni = x.shard(h).lookup(h, s.num); ni != nilIdx {
				s.remember(h, ni)
			}
		}
		if ni != nilIdx {
			s.retouch(ni, t)
		} else {
			evicted += x.touchOrClaim(s, h, t, limit)
		}
	}
	return evicted
}

// prefetchDepth bounds the chunks and victims prefetchClaims hints: 2 × 32 cache lines, a
// small part of any L1 data cache.
const prefetchDepth = 32

// prefetchClaims hints the home slots of news, chunks about to be claimed for s, and of the
// entries their claims will evict (s's least recently used, read from its list under s.mu,
// held), so that the misses of the claims overlap (chunkTable.prefetchHome): a claim at
// capacity otherwise waits on one cache miss after another, its own slot, the victim's
// node, the victim's slot. Measured with BenchmarkRecordNewAtCapacity (groups of 16 new
// chunks at capacity, the table far larger than the caches). Called with s.mu held.
func (x *Index) prefetchClaims(s *slot, news []uint64, limit int64) {
	if len(news) < 2 {
		return
	}
	news = news[max(len(news)-prefetchDepth, 0):] // the deepest, claimed first
	for _, h := range news {
		h = norm(h)
		x.shard(h).chunks.prefetchHome(h)
	}
	// The claims evict at most this many (fine) entries, the list's last ones.
	victims := min(s.count.Load()+int64(len(news))-limit, prefetchDepth)
	for v := s.tail; victims > 0 && v != nilIdx; victims-- {
		h := s.nodes[v].hash
		x.shard(h).chunks.prefetchHome(h)
		v = s.nodes[v].prev
	}
}

// recordBatched is RecordHeld's walk over chunks (deepest first) in batches of up to
// batchChunks, so that each shard is locked twice a batch rather than once or twice a chunk:
//
//  1. look up s's node of every chunk of the batch, each shard read-locked once (nodesOf);
//  2. walk the batch deepest first, on s's own LRU list only: a chunk s holds is touched; one
//     it does not is given a node at the front, a new one below the capacity, else the least
//     recently used entry's (the victim, evicted), and when the new chunk weighs more than
//     the victim (coarse over fine) the next least recently used go too until s is within
//     the capacity; a chunk the batch holds twice is claimed once and then touched; a node
//     that a victim of this same batch took now carries another hash (or none), and its
//     chunk is claimed again;
//  3. apply the batch to the shards, each write-locked once: the victims' holders removed,
//     then the new chunks' holders linked to their nodes.
//
// Meanwhile holders of victims name nodes that now carry new chunks, which only this slot's
// own lookups, under s.mu, could see. The result is that of claiming the chunks one by one
// (TestAgainstModelLong) because no victim is a chunk its own batch added: RecordHeld cuts a
// prompt to the capacity, so that the weight of a batch's claims and touches is at most the
// capacity. An eviction happens only while the entries weigh more than the capacity (with the
// chunk being claimed); were every entry left this Record's, they would weigh at most what
// the cut prompt does, within the capacity, so an entry older than the batch is at the tail.
// It returns the entries evicted. Called with s.mu held.
func (x *Index) recordBatched(s *slot, chunks []uint64, t, limit int64) (evicted uint64) {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	for hi := len(chunks); hi > 0; {
		from := max(0, hi-batchChunks)
		hs := chunks[from:hi]
		hi = from
		nodes := sc.nodes[:len(hs)]
		x.nodesOf(s, hs, nodes, &sc.batch)
		evicted += x.settle(s, hs, nodes, t, limit, sc)
	}
	return evicted
}

// settle is steps 2 and 3 of recordBatched for one batch hs, with nodes[p] s's node of hs[p]
// as looked up (nilIdx: none). It returns the entries evicted.
func (x *Index) settle(s *slot, hs []uint64, nodes []int32, t, limit int64, sc *scratch) (evicted uint64) {
	adds, rems := sc.addH[:0], sc.remH[:0]
	addNodes := sc.addN[:0]
	for p := len(hs) - 1; p >= 0; p-- {
		h := norm(hs[p])
		if ni := nodes[p]; ni != nilIdx && s.nodes[ni].hash == h {
			s.retouch(ni, t)
			continue
		}
		if ni := sc.seen.get(h); ni != nilIdx {
			s.retouch(ni, t) // claimed by this batch already: keeps its added mark
			continue
		}
		var ni int32
		if !s.full(h, limit) {
			ni = s.alloc(h, t|added, limit)
		} else {
			if len(rems) == len(sc.remH) {
				rems = x.removeEarly(s, rems, sc)
			}
			ni = s.tail
			old := s.nodes[ni].hash
			rems = append(rems, old)
			s.noteEvicted(old)
			s.nodes[ni].hash = h
			s.count.Add(s.weight(h) - s.weight(old))
			s.touch(ni, t|added)
			evicted++
			for s.count.Load() > limit && s.tail != nilIdx { // a coarse chunk took a fine one's place
				if len(rems) == len(sc.remH) {
					rems = x.removeEarly(s, rems, sc)
				}
				v := s.tail
				rems = append(rems, s.nodes[v].hash)
				s.noteEvicted(s.nodes[v].hash)
				s.unlink(v)
				s.release(v)
				evicted++
			}
		}
		adds, addNodes = append(adds, h), append(addNodes, ni)
		sc.seen.put(h, ni)
	}
	for i := len(adds) - 1; i >= 0; i-- { // last put first: see seenSet.del
		sc.seen.del(adds[i])
	}
	if len(adds) == 0 {
		return evicted
	}
	sc.batch.group(x, adds)
	sc.rbatch.group(x, rems)
	for si := range x.shards {
		a := sc.batch.order[sc.batch.start[si]:sc.batch.start[si+1]]
		r := sc.rbatch.order[sc.rbatch.start[si]:sc.rbatch.start[si+1]]
		if len(a)+len(r) > 0 {
			x.shards[si].apply(s.num, rems, r, adds, addNodes, a)
		}
	}
	return evicted
}

// removeEarly removes slot s's holders of rems, each shard write-locked once, and returns rems
// emptied: a batch whose coarse claims evict more fine entries than remH holds removes them
// before the rest, still ahead of every add of the batch, as settle's step 3 does.
func (x *Index) removeEarly(s *slot, rems []uint64, sc *scratch) []uint64 {
	sc.rbatch.group(x, rems)
	for si := range x.shards {
		if r := sc.rbatch.order[sc.rbatch.start[si]:sc.rbatch.start[si+1]]; len(r) > 0 {
			x.shards[si].apply(s.num, rems, r, nil, nil, nil)
		}
	}
	return rems[:0]
}

// apply removes slot num's holders of rems[p] for the positions p of r, then links its
// holders of adds[p] to addNodes[p] for the positions p of a, under sh's write lock.
func (sh *shard) apply(num uint16, rems []uint64, r []uint16, adds []uint64, addNodes []int32, a []uint16) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, p := range r {
		sh.remove(rems[p], num)
	}
	for _, p := range a {
		sh.link(sh.chunks.put(adds[p]), num, addNodes[p])
	}
}

// touchOrClaim claims h for s (claim) and touches it if s held it already. It returns the
// entries evicted for it. Called with s.mu held.
func (x *Index) touchOrClaim(s *slot, h uint64, t, limit int64) uint64 {
	ni, already, evicted := x.claim(s, x.shard(h), h, t, limit)
	if already {
		s.remember(h, ni)
		s.retouch(ni, t)
	}
	return evicted
}

// claim looks h up for s under sh's write lock and, when s does not hold it, adds it as s's
// most recently used entry, evicting the least recently used one at capacity: that entry's
// node is reused for h, and its holder is removed after sh is released, so that no two
// shard locks are ever held at once. Meanwhile both holders name the node, which only this
// slot's own finds, under s.mu, could see. When h weighs more than the victim (a coarse chunk
// for a fine one), the next least recently used entries are evicted too until s is within
// limit. It returns s's node of h, whether s held h already (then nothing changed), and the
// entries evicted. Called with s.mu held.
func (x *Index) claim(s *slot, sh *shard, h uint64, t, limit int64) (ni int32, held bool, evicted uint64) {
	victim := int32(nilIdx) // the node evicted for h, if s is at capacity
	var victimHash uint64
	var victimShard *shard
	if s.full(h, limit) {
		victim = s.tail
		victimHash = s.nodes[victim].hash
		victimShard = x.shard(victimHash)
	} else {
		s.reserve(limit) // not while readers wait on sh
	}
	if ni, held := x.claimIn(s, sh, h, t, limit, victim, victimHash, victimShard == sh); held || victim == nilIdx {
		return ni, held, 0
	}
	if victimShard != sh {
		victimShard.drop(victimHash, s.num)
	}
	s.noteEvicted(victimHash)
	s.nodes[victim].hash = h
	s.count.Add(s.weight(h) - s.weight(victimHash))
	s.touch(victim, t|added)
	evicted = 1
	for s.count.Load() > limit && s.tail != nilIdx { // a coarse chunk took a fine one's place
		s.noteEvicted(s.nodes[s.tail].hash)
		x.drop(s, s.tail) // counted with the rest by RecordHeld
		evicted++
	}
	return victim, false, evicted
}

// withdraw removes s's holder of h if its node's stamp is mark, under sh's write lock, and
// returns that node (nilIdx: nothing removed).
func (sh *shard) withdraw(s *slot, h uint64, mark int64) int32 {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ni := sh.find(h, s.num)
	if ni == nilIdx || s.nodes[ni].used != mark {
		return nilIdx
	}
	sh.remove(h, s.num)
	return ni
}

// claimIn is claim's part under sh's write lock: it returns s's node of h and true when s
// held h already; else it links h to a new node (no victim: returned) or to the victim's
// node, whose old holder it removes when it is in sh too (sameShard: remove before adding,
// as evicting first would).
func (x *Index) claimIn(s *slot, sh *shard, h uint64, t, limit int64, victim int32, victimHash uint64, sameShard bool) (int32, bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sameShard {
		if ni := sh.find(h, s.num); ni != nilIdx {
			return ni, true
		}
		sh.remove(victimHash, s.num)
		sh.add(h, s.num, victim)
		return victim, false
	}
	ch := sh.chunks.put(h) // one probe for the lookup and the insertion
	if ni := sh.holderOf(ch, s.num); ni != nilIdx {
		return ni, true
	}
	if victim == nilIdx {
		ni := s.alloc(h, t|added, limit)
		sh.link(ch, s.num, ni)
		return ni, false
	}
	sh.link(ch, s.num, victim)
	return victim, false
}

// Forget withdraws what the Record stamped stamp added to b's entries among chunks: entries it
// created that no Record has touched since. Entries b held before that Record, and entries
// another Record has touched or re-added since (another request that b accepted), stay.
//
// The proxy records a prompt as soon as the request is on its way to the backend (a request
// held for its peered replicas' decisions, just before it is held), so that
// the index update overlaps the backend's work, and forgets it when the backend then refuses
// the request (a 400 for a too-long prompt, a 429/503 retried elsewhere) or never answers:
// a refused prompt left nothing in the engine's KV cache. Entries evicted by that Record
// stay evicted.
func (x *Index) Forget(chunks []uint64, b *backend.Backend, stamp Stamp) {
	if len(chunks) == 0 || b == nil || stamp == 0 {
		return
	}
	s := x.tab.Load().byID[b.ID]
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed.Load() || b.Epoch() != s.epoch.Load() {
		return
	}
	mark := int64(stamp) | added
	for _, hash := range chunks {
		if ni := x.shard(norm(hash)).withdraw(s, norm(hash), mark); ni != nilIdx {
			s.unlink(ni)
			s.release(ni)
		}
	}
}
