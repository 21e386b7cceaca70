// Export and import: a copy of the index's entries, for another prefixlb replica that starts
// (peering's snapshot on join) to begin with what this one learned.

package index

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// BackendEntries is one backend's part of an export: the chunk hashes it holds, most recently
// used first, and when each was last used.
type BackendEntries struct {
	// ID is the backend's ID (backend.Backend.ID, stable across prefixlb replicas configured
	// with the same URL).
	ID uint64
	// Hashes are the chunk hashes, most recently used first.
	Hashes []uint64
	// Used[i] is when Hashes[i] was last recorded, unix nanoseconds.
	Used []int64
}

// Export returns, for each of bs registered here and still in the epoch its entries were
// recorded in, its entries most recently used first, at most maxPerBackend of them (≤ 0: all).
// It holds one backend's lock at a time, for the copy of its list (about 1 ms per 100k
// entries), so that Records on that backend wait meanwhile and Matches never do.
func (x *Index) Export(bs []*backend.Backend, maxPerBackend int) []BackendEntries {
	tab := x.tab.Load()
	out := make([]BackendEntries, 0, len(bs))
	for _, b := range bs {
		s := tab.byID[b.ID]
		if s == nil {
			continue
		}
		var e BackendEntries
		ok := false
		s.locked(func() {
			if s.removed.Load() || s.epoch.Load() != b.Epoch() {
				return
			}
			n := min(int(s.count.Load()), len(s.nodes)) // count is the entries' weight
			if maxPerBackend > 0 {
				n = min(n, maxPerBackend)
			}
			e = BackendEntries{ID: b.ID, Hashes: make([]uint64, 0, n), Used: make([]int64, 0, n)}
			for ni := s.head; ni != nilIdx && len(e.Hashes) < n; ni = s.nodes[ni].next {
				e.Hashes = append(e.Hashes, s.nodes[ni].hash)
				e.Used = append(e.Used, s.nodes[ni].used&^added)
			}
			ok = true
		})
		if !ok {
			continue
		}
		out = append(out, e)
	}
	return out
}

// importBatch is how many entries Import and Merge record under one hold of the backend's
// lock, so that local Records on that backend wait at most one batch (a few ms).
const importBatch = 4096

// Import records that b holds hashes (most recently used first, as Export gives them) as of
// now: Merge with every entry last used now. hashes[0] ends up b's most recently used entry
// (but for entries a local Record used later, or added and not yet confirmed), and what does
// not fit b's capacity is the oldest. An unregistered b is ignored. It returns what Merge
// returns.
func (x *Index) Import(b *backend.Backend, hashes []uint64, now time.Time) int {
	return x.merge(b, hashes, nil, now.UnixNano(), importBatch, nil)
}

// Merge records that b holds hashes, hashes[i] last used at used[i] (unix nanoseconds;
// most recently used first, as Export gives them, used non-increasing, len(used) ==
// len(hashes)), among b's own entries by age: each goes in b's LRU list where its time puts
// it, an entry b holds already moves to the later of its two times, and when b is at
// capacity the oldest of the union go, so that two replicas that learned apart (a partition,
// a replica's restart) and exchange exports each end up with the newest entries of both
// rather than with the other's (an import at now would put the other's whole list ahead of
// what this replica learned meanwhile). Entries added by a Record that Forget may yet
// withdraw are left as they are. An unregistered b is ignored. It returns how many entries
// of hashes it placed or found held (a hash listed twice counts twice; one evicted again, by
// a coarse claim of the same Merge or a change between batches, still counts). Local Records
// between batches (importBatch) are kept; two Merges of one backend at once keep the list
// whole, each's entries at most slightly out of order against the other's.
func (x *Index) Merge(b *backend.Backend, hashes []uint64, used []int64) int {
	if len(used) != len(hashes) {
		return 0
	}
	return x.merge(b, hashes, used, 0, importBatch, nil)
}

// merge is Merge (used nil: every entry at at) in batches of batch entries, with between
// called between two batches, the backend's lock released (tests).
func (x *Index) merge(b *backend.Backend, hashes []uint64, used []int64, at int64, batch int, between func()) int {
	if b == nil || len(hashes) == 0 {
		return 0
	}
	s := x.tab.Load().byID[b.ID]
	if s == nil {
		return 0
	}
	// Cut as Record cuts, by weight: past the capacity an import's own newer entries would
	// evict its older ones (and a chunk weighing more than the capacity, its own node).
	hashes = hashes[:s.fit(hashes, max(s.limit(), 0))]
	m := merger{x: x, s: s, cur: nilIdx}
	for lo := 0; lo < len(hashes); lo += batch {
		if lo > 0 && between != nil {
			between()
		}
		var more bool
		s.locked(func() { more = m.batch(b, hashes, used, at, lo, min(lo+batch, len(hashes))) })
		if !more {
			break
		}
	}
	return m.kept
}

// merger is one Merge's walk down a slot's LRU list: the entries go, newest first, each before
// cur, the first node used no later than it (nilIdx: at the back), which it keeps between
// batches as its node, hash and stamp, so that a batch can tell whether the list changed
// there meanwhile.
type merger struct {
	x       *Index
	s       *slot
	epoch   uint64
	started bool
	limit   int64
	cur     int32
	curHash uint64
	curUsed int64
	kept    int
}

// batch merges hashes[lo:hi] and reports whether the merge goes on. Called with s.mu held.
func (m *merger) batch(b *backend.Backend, hashes []uint64, used []int64, at int64, lo, hi int) bool {
	s := m.s
	if s.removed.Load() {
		return false
	}
	if !m.started {
		m.x.catchUp(s, b.Epoch())
		m.epoch, m.started = s.epoch.Load(), true
		m.cur = s.head
	} else if s.epoch.Load() != m.epoch || b.Epoch() != m.epoch {
		return false // the backend restarted meanwhile: what it held is gone
	} else if c := m.cur; c != nilIdx && (int(c) >= len(s.nodes) || s.nodes[c].hash != m.curHash || s.nodes[c].used != m.curUsed) {
		m.cur = s.head // the list changed there: found again from the front
	}
	if m.limit = s.limit(); m.limit <= 0 {
		return false
	}
	var evicted uint64
	defer func() {
		if evicted > 0 {
			s.evictions.Add(evicted)
			s.regrowBy(int64(evicted))
		}
	}()
	for i := lo; i < hi; i++ {
		h, u := norm(hashes[i]), at&^added
		if used != nil {
			u = used[i] &^ added
		}
		if s.weight(h) > m.limit {
			break // the capacity fell below a coarse chunk's weight between batches (fit cut the rest)
		}
		for m.cur != nilIdx && s.nodes[m.cur].used&^added > u {
			m.cur = s.nodes[m.cur].next
		}
		ni := s.recalled(h)
		if ni == nilIdx {
			ni = m.x.shard(h).lookup(h, s.num)
		}
		if ni == nilIdx {
			if s.full(h, m.limit) && !m.evictable(s.count.Load()+s.weight(h)-m.limit, u) {
				if s.weight(h) == 1 {
					break // older than the least recently used entry, as is every entry after it
				}
				continue // a coarse chunk that would evict newer entries; a fine one may still fit
			}
			var ev uint64
			if ni, ev = m.claim(h, u); ni == nilIdx {
				break
			}
			evicted += ev
		} else if n := &s.nodes[ni]; n.used&added == 0 && n.used < u {
			if ni == m.cur {
				m.cur = n.next
			}
			s.unlink(ni)
			n.used = u
			s.insertBefore(ni, m.cur)
		}
		m.kept++
	}
	if c := m.cur; c != nilIdx {
		m.curHash, m.curUsed = s.nodes[c].hash, s.nodes[c].used
	}
	return true
}

// evictable reports whether the least recently used entries that weigh need (those a claim
// evicts) are all older than u. Called with s.mu held.
func (m *merger) evictable(need, u int64) bool {
	s := m.s
	for ni := s.tail; need > 0; ni = s.nodes[ni].prev {
		if ni == nilIdx || s.nodes[ni].used&^added >= u {
			return false
		}
		need -= s.weight(s.nodes[ni].hash)
	}
	return true
}

// claim adds h, which s does not hold, last used at u, before m.cur, evicting the least
// recently used entries as claim does; an eviction that took m.cur (at the back: everything
// from it on went) leaves the new entry at the back. It returns h's node (nilIdx: not added)
// and the entries evicted.
func (m *merger) claim(h uint64, u int64) (int32, uint64) {
	s := m.s
	var curHash uint64
	if m.cur != nilIdx {
		curHash = s.nodes[m.cur].hash
	}
	ni, held, evicted := m.x.claim(s, m.x.shard(h), h, u, m.limit)
	if held { // not reached: only this slot adds its own holders, under s.mu
		return ni, evicted
	}
	if s.nodes[ni].hash != h { // not reached: batch checks h's weight against the capacity
		return nilIdx, evicted // its own node evicted (and freed) for it
	}
	if m.cur != nilIdx && (m.cur == ni || s.nodes[m.cur].hash != curHash) {
		m.cur = nilIdx
	}
	s.unlink(ni)
	s.nodes[ni].used = u
	s.insertBefore(ni, m.cur)
	return ni, evicted
}
