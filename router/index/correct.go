// Correction: the index's view of a backend's KV cache converges to the backend's own, from
// what the backend reports it found cached (usage.prompt_tokens_details.cached_tokens).

package index

import "github.com/prefixlb/prefixlb/backend"

// The correction's constants.
const (
	// priorEntries is how many of a backend's latest Records with a held prefix remember the
	// prior stamp of that prefix (16 bytes each: 4 KiB per backend, allocated by its first
	// such Record). A request whose Record has left the ring by the time its answer comes
	// (more than priorEntries matched requests to the same backend while it ran) is
	// corrected by its shortfall alone.
	priorEntries = 256
	// regrowEvery gives a learned capacity back one chunk for every regrowEvery entries the
	// backend evicts for it: the learned capacity is an upper bound the backend's answers
	// only ever lower, and a backend whose cache was short for a while (running requests
	// pinned blocks) must be trusted again after it recovers. At 16, a learned capacity cut
	// by half is back after 8 turnovers of the backend's entries.
	regrowEvery = 16
)

// prior is what one Record saw of its held prefix before touching it: the stamp of the last
// Record that had touched the deepest held chunk.
type prior struct {
	stamp int64 // the Record's (even, strictly increasing per backend)
	used  int64 // the deepest held chunk's last use before it
}

// notePrior remembers that the Record stamped t found its held prefix last used at used.
// Called with s.mu held.
func (s *slot) notePrior(t, used int64) {
	if s.priors == nil {
		s.priors = make([]prior, priorEntries)
	}
	s.priors[s.nextPr] = prior{stamp: t, used: used}
	s.nextPr = (s.nextPr + 1) % priorEntries
}

// priorOf is what notePrior remembered for the Record stamped t (0: nothing). Called with
// s.mu held.
func (s *slot) priorOf(t int64) int64 {
	for _, p := range s.priors {
		if p.stamp == t {
			return p.used
		}
	}
	return 0
}

// limit is the most entries s may hold: its capacity, or the capacity Correct learned when
// that is lower.
func (s *slot) limit() int64 {
	c := s.capacity.Load()
	if l := s.learned.Load(); l > 0 && l < c {
		return l
	}
	return c
}

// regrowBy gives the learned capacity back one chunk for every regrowEvery entries of n
// evicted for capacity. Called with s.mu held.
func (s *slot) regrowBy(n int64) {
	l := s.learned.Load()
	if l <= 0 {
		return
	}
	s.regrow += n
	l += s.regrow / regrowEvery
	s.regrow %= regrowEvery
	if l >= s.capacity.Load() {
		s.forgetLearned()
		return
	}
	s.learned.Store(l)
}

// forgetLearned drops what Correct learned: a backend that restarted (or whose capacity is
// reconfigured) is trusted with its capacity again. Called with s.mu held.
func (s *slot) forgetLearned() {
	s.learned.Store(0)
	s.regrow = 0
}

// Correct corrects b's entries after b answered the request that the Record stamped stamp
// learned with fewer cached tokens than the index had listed: of the chunks the index said b
// held, b had kept all but shortfall (> 0) chunks' worth (a coarse chunk counting
// Options.CoarseWeight, as in the capacity). It returns the entries dropped, by weight. Other backends'
// entries are untouched; the Record's own chunks stay (b computed the whole prompt, so it
// holds it now, as that Record says).
//
// The engine's prefix cache evicts least recently used blocks first, and so does the index.
// b had lost the deepest chunk the index listed as held; that chunk's last use before the
// Record (remembered in priors) is T. So:
//
//  1. Every entry of b last used at or before T is dropped: b evicted them before that
//     chunk, if not with it.
//  2. b's capacity, as the index models it, is lowered to the entries left less the
//     shortfall: the index counted the lost chunks within b's capacity, so the capacity
//     was too large by at least that much. The least recently used entries go until b is
//     within it, and Records then evict at b's own pace. Each correction lowers the
//     capacity from above toward b's actual one; regrowEvery gives it back slowly.
//
// When the Record's prior is gone from the ring, step 2 alone runs. A Record of another
// epoch (b restarted since) corrects nothing. It allocates nothing.
func (x *Index) Correct(b *backend.Backend, stamp Stamp, shortfall int) int {
	if b == nil || stamp == 0 || shortfall <= 0 {
		return 0
	}
	s := x.tab.Load().byID[b.ID]
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed.Load() || b.Epoch() != s.epoch.Load() {
		return 0
	}
	before := s.count.Load()
	if t := s.priorOf(int64(stamp)); t > 0 {
		for s.tail != nilIdx && s.nodes[s.tail].used&^added <= t {
			x.drop(s, s.tail)
		}
	}
	learned := max(s.count.Load()-int64(shortfall), 1)
	if learned < s.limit() {
		s.learned.Store(learned)
		s.regrow = 0
	}
	for s.count.Load() > s.limit() {
		x.drop(s, s.tail)
	}
	dropped := before - s.count.Load()
	s.corrections.Add(1)
	s.corrected.Add(uint64(dropped))
	return int(dropped)
}

// drop frees s's entry at node ni (not counted as an eviction). Called with s.mu held and no
// shard lock.
func (x *Index) drop(s *slot, ni int32) {
	h := s.nodes[ni].hash
	x.shard(h).drop(h, s.num)
	s.unlink(ni)
	s.release(ni)
}
