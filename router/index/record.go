// Learning: Record adds a prompt's chunks to a backend's entries, Forget withdraws them.

package index

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// Record marks b as holding every chunk of chunks (a prompt's chained hashes, in order) as
// of now, making them its most recently used entries. A prompt longer than b's capacity is
// recorded up to the capacity. Backends not registered with SetBackends are ignored.
func (x *Index) Record(chunks []uint64, b *backend.Backend, now time.Time) Stamp {
	return x.RecordHeld(chunks, b, now, 0)
}

// freshWindow bounds how recently a held prefix must have been touched for RecordHeld to
// leave it as it is: 50 ms, or 1/freshHorizonShare of the backend's LRU horizon (now minus
// its oldest entry's last use) when that is shorter.
const (
	freshWindow       = 50 * time.Millisecond
	freshHorizonShare = 16
)

// RecordHeld is Record for a prompt whose first held chunks b was found to hold when the
// request was routed (router.Decision.MatchedChunks). When b still holds chunk held-1 and
// touched it within the fresh window, the held chunks are not touched again: every request
// that shares a hot system prompt would otherwise move the same chunks to the front of the
// LRU, a few cache misses each, for a recency that changes by milliseconds. A Record touches
// a whole prefix at once, so the skipped chunks are at most two windows staler than a full
// Record would leave them. A prefix still marked as added by an earlier Record that no later
// one touched is touched in full (that Record may yet be withdrawn by Forget). held ≤ 0 (or
// a stale hint) records every chunk.
func (x *Index) RecordHeld(chunks []uint64, b *backend.Backend, now time.Time, held int) Stamp {
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
	if int64(len(chunks)) > limit {
		chunks = chunks[:limit]
	}
	t := s.nextStamp(now.UnixNano())
	lo := 0 // the shallowest chunk to record
	if held > 0 && held <= len(chunks) {
		fresh, used := x.heldFresh(s, norm(chunks[held-1]), t)
		switch {
		case fresh:
			lo = held
		case used > 0:
			s.notePrior(t, used)
		}
	}
	var evicted uint64
	// Deepest first, each moved to the front: the prompt ends up shallow-to-deep from the
	// front of the list, so its deepest chunks are the first of it to be evicted. Chained
	// hashes make a backend's entries whole prefixes, so the chunks past the held hint are
	// expected new: each is claimed, which looks it up under the write lock that adding it
	// takes anyway. The chunks up to the hint (all of them without one) are expected held:
	// they are looked up in batches, each shard locked once (batch.go), and touched; one that
	// an eviction of this same Record took meanwhile (its node now carries another hash) is
	// claimed again.
	split := len(chunks)
	if held > 0 {
		split = max(min(held, len(chunks)), lo)
	}
	if n := len(chunks) - split; n > seqChunks && s.count.Load()+int64(n) <= limit {
		x.claimBatched(s, chunks[split:], t, limit)
	} else {
		for i := len(chunks) - 1; i >= split; i-- {
			h := norm(chunks[i])
			if ni := s.recalled(h); ni != nilIdx {
				s.retouch(ni, t)
			} else if x.touchOrClaim(s, h, t, limit) {
				evicted++
			}
		}
	}
	if split-lo <= seqChunks {
		for i := split - 1; i >= lo; i-- {
			h := norm(chunks[i])
			ni := s.recalled(h)
			if ni == nilIdx {
				if ni = x.shard(h).lookup(h, s.num); ni != nilIdx {
					s.remember(h, ni)
				}
			}
			if ni != nilIdx {
				s.retouch(ni, t)
			} else if x.touchOrClaim(s, h, t, limit) {
				evicted++
			}
		}
	} else {
		evicted += x.touchBatched(s, chunks[lo:split], t, limit)
	}
	if evicted > 0 {
		s.evictions.Add(evicted)
		s.regrowBy(int64(evicted))
	}
	return Stamp(t)
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

// touchBatched touches s's entries of chunks, deepest first, looked up in batches
// (batch.go), and claims those s does not hold: in a batch too when s has room for them all
// (claimAll), else one by one. It returns the entries evicted. Called with s.mu held.
func (x *Index) touchBatched(s *slot, chunks []uint64, t, limit int64) (evicted uint64) {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	for hi := len(chunks); hi > 0; {
		from := max(0, hi-batchChunks)
		hs := chunks[from:hi]
		nodes := sc.nodes[:len(hs)]
		x.nodesOf(s, hs, nodes, &sc.batch)
		missing := 0
		for _, ni := range nodes {
			if ni == nilIdx {
				missing++
			}
		}
		if missing > 0 && s.count.Load()+int64(missing) <= limit {
			x.claimAll(s, hs, nodes, t, limit, sc)
			hi = from
			continue
		}
		for p := len(hs) - 1; p >= 0; p-- {
			h := norm(hs[p])
			// A node that an eviction of this same walk reused carries another hash now.
			if ni := nodes[p]; ni != nilIdx && s.nodes[ni].hash == h {
				s.retouch(ni, t)
			} else if x.touchOrClaim(s, h, t, limit) {
				evicted++
			}
		}
		hi = from
	}
	return evicted
}

// claimBatched is claim for each of chunks, deepest first, when s has room for all of them:
// claimAll, batch by batch. Called with s.mu held.
func (x *Index) claimBatched(s *slot, chunks []uint64, t, limit int64) {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	for hi := len(chunks); hi > 0; {
		from := max(0, hi-batchChunks)
		hs := chunks[from:hi]
		nodes := sc.nodes[:len(hs)]
		for p := range nodes {
			nodes[p] = nilIdx
		}
		x.claimAll(s, hs, nodes, t, limit, sc)
		hi = from
	}
}

// claimAll is claim, deepest first, for each chunk of a batch hs whose node is nilIdx, and a
// touch for the others (nodes[p] is s's node of hs[p]), when s has room for every claim (none
// evicts): the new nodes are taken first, then linked to their chunks with each shard
// write-locked once, then every node of the batch is put at the front deepest first. A chunk
// that s turns out to hold already (or that the batch holds twice) is touched instead, and
// its spare node given back. Called with s.mu held.
func (x *Index) claimAll(s *slot, hs []uint64, nodes []int32, t, limit int64, sc *scratch) {
	fresh, held := sc.fresh[:len(hs)], sc.held[:len(hs)]
	for p, h := range hs {
		fresh[p], held[p] = nilIdx, nilIdx
		if nodes[p] == nilIdx {
			fresh[p] = s.allocDetached(norm(h), t|added, limit)
		}
	}
	sc.batch.group(x, hs)
	for si := range x.shards {
		if run := sc.batch.order[sc.batch.start[si]:sc.batch.start[si+1]]; len(run) > 0 {
			x.shards[si].linkAll(hs, run, s.num, fresh, held)
		}
	}
	for p := len(hs) - 1; p >= 0; p-- {
		ni := nodes[p]
		if ni == nilIdx {
			if ni = fresh[p]; held[p] != nilIdx {
				s.release(ni)
				ni = held[p]
			}
		}
		if s.linked(ni) {
			s.retouch(ni, t)
		} else {
			s.pushFront(ni)
		}
	}
}

// linkAll links, for each position p of run with a node fresh[p], slot num's holder of hs[p]
// to that node, or, when num holds hs[p] already, sets held[p] to that holder's node. Under
// sh's write lock.
func (sh *shard) linkAll(hs []uint64, run []uint16, num uint16, fresh, held []int32) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, p := range run {
		if fresh[p] == nilIdx {
			continue
		}
		ch := sh.chunks.put(norm(hs[p]))
		if held[p] = sh.holderOf(ch, num); held[p] == nilIdx {
			sh.link(ch, num, fresh[p])
		}
	}
}

// touchOrClaim claims h for s (claim) and touches it if s held it already. It reports whether
// an entry was evicted for it. Called with s.mu held.
func (x *Index) touchOrClaim(s *slot, h uint64, t, limit int64) bool {
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
// slot's own finds, under s.mu, could see. It returns s's node of h, whether s held h
// already (then nothing changed), and whether an entry was evicted. Called with s.mu held.
func (x *Index) claim(s *slot, sh *shard, h uint64, t, limit int64) (ni int32, held, evicted bool) {
	victim := int32(nilIdx) // the node evicted for h, if s is at capacity
	var victimHash uint64
	var victimShard *shard
	if s.count.Load() >= limit {
		victim = s.tail
		victimHash = s.nodes[victim].hash
		victimShard = x.shard(victimHash)
	} else {
		s.reserve(limit) // not while readers wait on sh
	}
	if ni, held := x.claimIn(s, sh, h, t, limit, victim, victimHash, victimShard == sh); held || victim == nilIdx {
		return ni, held, false
	}
	if victimShard != sh {
		victimShard.drop(victimHash, s.num)
	}
	s.nodes[victim].hash = h
	s.touch(victim, t|added)
	return victim, false, true
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
// The proxy records a prompt as soon as the request is on its way to the backend, so that
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
