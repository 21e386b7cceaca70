// The per-backend LRU: a slot's list of the chunks its backend holds, most recently used
// first, with the recent cache that lets Record touch held chunks without a shard lock.

package index

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prefixlb/prefixlb/router/key"
)

// slot is one backend's part of the index: its LRU list of entries.
type slot struct {
	num  uint16
	name string

	removed   atomic.Bool   // retired; its number may belong to a new slot
	epoch     atomic.Uint64 // the backend epoch the entries belong to
	capacity  atomic.Int64  // effective capacity in chunks
	count     atomic.Int64  // the entries' weight in chunks (weight: see slot.weight)
	coarseW   int64         // the weight of an entry marked coarse (Options.CoarseWeight)
	evictions atomic.Uint64
	rawCap    int64 // capacity before the global cap; guarded by Index.mu

	// What Correct learned (correct.go): learned is the capacity in chunks that the
	// backend's own answers showed (0: none, the capacity stands), regrow the capacity
	// evictions not yet given back to it, priors the recent Records' priors.
	learned     atomic.Int64
	corrections atomic.Uint64
	corrected   atomic.Uint64 // entries dropped by corrections

	mu    sync.Mutex // guards the fields below and the slot's holders
	nodes []node
	head  int32 // most recently used
	tail  int32 // least recently used
	free  int32 // free list through node.next
	stamp int64 // the last Record's stamp (see Stamp)
	// recent caches the nodes of chunks that Record found held, so that touching them
	// again locks no shard. See recalled.
	recent []uint64
	regrow int64
	priors []prior
	nextPr int // the next priors entry to overwrite
	// evictLog collects the hashes that the Record in progress evicts while logging is on
	// (RecordHeld with a fresh prefix left as it is; see evictedAnyOf); evictLogFull: more
	// than evictLogMax were evicted, and the log no longer says which.
	evictLog     []uint64
	logging      bool
	evictLogFull bool
}

// evictLogMax bounds a slot's eviction log (8 KiB, allocated by its first eviction under a
// fresh prefix): a Record that evicts more re-walks its fresh prefix without asking the log,
// as it would without one.
const evictLogMax = 1024

// noteEvicted logs h, an entry the Record in progress evicted, while logging is on. Called
// with s.mu held.
func (s *slot) noteEvicted(h uint64) {
	if !s.logging {
		return
	}
	if len(s.evictLog) == evictLogMax {
		s.evictLogFull = true
		return
	}
	if s.evictLog == nil {
		s.evictLog = make([]uint64, 0, evictLogMax)
	}
	s.evictLog = append(s.evictLog, h)
}

// startEvictLog empties the eviction log and turns logging on. Called with s.mu held.
func (s *slot) startEvictLog() {
	s.evictLog, s.logging, s.evictLogFull = s.evictLog[:0], true, false
}

// evictedAnyOf turns logging off and reports whether the log holds a chunk of chunks (or
// overflowed, when it cannot tell; or is over 4 times longer than chunks, when walking the
// short prefix costs less than sorting the log). A 4096-bit filter of the log on the stack
// answers most chunks; the log is sorted and searched only for those the filter lets
// through. Called with s.mu held.
func (s *slot) evictedAnyOf(chunks []uint64) bool {
	s.logging = false
	if s.evictLogFull || len(s.evictLog) > 4*len(chunks) {
		return true
	}
	if len(s.evictLog) == 0 {
		return false
	}
	var filter [evictFilterBits / 64]uint64
	for _, h := range s.evictLog {
		b := h * fibonacci >> (64 - evictFilterLog)
		filter[b/64] |= 1 << (b % 64)
	}
	sorted := false
	for _, c := range chunks {
		h := norm(c)
		if b := h * fibonacci >> (64 - evictFilterLog); filter[b/64]&(1<<(b%64)) == 0 {
			continue
		}
		if !sorted {
			slices.Sort(s.evictLog)
			sorted = true
		}
		if _, found := slices.BinarySearch(s.evictLog, h); found {
			return true
		}
	}
	return false
}

// The eviction log's filter: evictFilterBits bits (512 bytes), indexed by the top
// evictFilterLog bits of a hash's Fibonacci product.
const (
	evictFilterLog  = 12
	evictFilterBits = 1 << evictFilterLog
)

// The recent cache is 2-way set associative: recentSets sets of recentWays entries, the most
// recently remembered first. An entry is a tag (the low 32 bits of the hash's Fibonacci
// product, whose top recentBits pick the set) over the node index + 1 (0: empty): 8 KiB per
// backend, allocated by its first Record.
const (
	recentBits = 9
	recentSets = 1 << recentBits
	recentWays = 2
	// recentTagShift puts the tag in an entry's high 32 bits, above the node index + 1.
	recentTagShift = 32
)

// fibonacci is 2^64 / φ, the multiplier of Fibonacci hashing: the top bits of its product
// with a key depend on every bit of the key (the recent cache's set, table.go's home slot).
const fibonacci = 0x9e3779b97f4a7c15

type node struct {
	hash uint64
	// used is the stamp of the last Record that touched the entry, with the low bit set when
	// that Record added it: unix nanoseconds to within 1 ns (plus the few ns by which
	// same-instant Records are kept apart).
	used       int64
	prev, next int32
}

// Stamp names one Record call on one backend, for Forget. It is the Record's time in unix
// nanoseconds, made even and strictly increasing per backend, so no two Records of a backend
// share one; 0 means that nothing was recorded.
type Stamp int64

// added marks a node's used stamp as "added by this Record" (rather than touched).
const added = 1

// stampStep separates two Records' stamps: stamps are even, the low bit is the added mark.
const stampStep = 2 * added

// nextStamp returns the stamp of a Record on s at now. Called with s.mu held.
func (s *slot) nextStamp(now int64) int64 {
	t := now &^ added
	if t <= s.stamp {
		t = s.stamp + stampStep
	}
	s.stamp = t
	return t
}

// locked runs f with s.mu held, released however f ends (see shard.go on panics).
func (s *slot) locked(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

// weight is how many chunks of s's capacity an entry of hash h takes: coarseW when h is
// marked coarse (key.IsCoarse), else 1.
func (s *slot) weight(h uint64) int64 {
	if key.IsCoarse(h) {
		return s.coarseW
	}
	return 1
}

// full reports whether an entry of hash h would take s past limit: a new one then evicts.
func (s *slot) full(h uint64, limit int64) bool { return s.count.Load()+s.weight(h) > limit }

// evict drops s's least recently used entry. Called with s.mu held and no shard lock.
func (x *Index) evict(s *slot) {
	tail := s.tail
	if tail == nilIdx {
		return
	}
	h := s.nodes[tail].hash
	x.shard(h).drop(h, s.num)
	s.unlink(tail)
	s.release(tail)
	s.evictions.Add(1)
}

// trim evicts until s is within its capacity (which SetBackends may have lowered).
// Called with s.mu held.
func (x *Index) trim(s *slot) {
	for s.count.Load() > max(s.limit(), 0) {
		x.evict(s)
	}
}

// catchUp brings s up to date with its backend before it is used: when the backend's cache
// epoch moved (restart, return from unhealthy) its entries are freed, and s is trimmed to its
// capacity. Called with s.mu held.
func (x *Index) catchUp(s *slot, epoch uint64) {
	if epoch != s.epoch.Load() {
		x.purge(s)
		s.epoch.Store(epoch)
		s.forgetLearned()
	}
	x.trim(s)
}

// purge frees all of s's entries. Called with s.mu held.
func (x *Index) purge(s *slot) {
	for ni := s.head; ni != nilIdx; ni = s.nodes[ni].next {
		h := s.nodes[ni].hash
		x.shard(h).drop(h, s.num)
	}
	s.nodes = s.nodes[:0]
	s.head, s.tail, s.free = nilIdx, nilIdx, nilIdx
	s.count.Store(0)
}

// recalled returns the node of h that recent remembers, or nilIdx. An entry is trusted only
// while its node still carries h: a node holds one chunk at a time and each (chunk, slot)
// has at most one node, so a node that carries h is what find would return, and stale
// entries (the node freed, reused or purged) fail the check. Called with s.mu held.
func (s *slot) recalled(h uint64) int32 {
	if s.recent == nil {
		return nilIdx
	}
	set, tag := s.recentSet(h)
	for way, entry := range set {
		if entry&^math.MaxUint32 != tag || uint32(entry) == 0 {
			continue
		}
		ni := int32(uint32(entry)) - 1
		if int(ni) >= len(s.nodes) || s.nodes[ni].hash != h {
			return nilIdx
		}
		if way == 1 {
			set[0], set[1] = entry, set[0]
		}
		return ni
	}
	return nilIdx
}

// remember notes in recent that ni is the node of h. Called with s.mu held.
func (s *slot) remember(h uint64, ni int32) {
	if s.recent == nil {
		s.recent = make([]uint64, recentWays*recentSets)
	}
	set, tag := s.recentSet(h)
	if set[0]&^math.MaxUint32 != tag {
		set[1] = set[0]
	}
	set[0] = tag | uint64(uint32(ni+1))
}

// recentSet returns the set of recent where h's entry may be, and h's tag.
func (s *slot) recentSet(h uint64) (set []uint64, tag uint64) {
	prod := h * fibonacci
	return s.recent[recentWays*(prod>>(64-recentBits)):][:recentWays], prod << recentTagShift
}

// retouch is touch for a Record stamped t: a chunk that this same Record added (a prompt
// that repeats a chunk hash) keeps its added mark, so that Forget still withdraws it.
func (s *slot) retouch(ni int32, t int64) {
	if s.nodes[ni].used == t|added {
		t |= added
	}
	s.touch(ni, t)
}

func (s *slot) touch(ni int32, t int64) {
	s.nodes[ni].used = t
	if s.head != ni {
		s.unlink(ni)
		s.pushFront(ni)
	}
}

func (s *slot) unlink(ni int32) {
	n := &s.nodes[ni]
	if n.prev != nilIdx {
		s.nodes[n.prev].next = n.next
	} else {
		s.head = n.next
	}
	if n.next != nilIdx {
		s.nodes[n.next].prev = n.prev
	} else {
		s.tail = n.prev
	}
	n.prev, n.next = nilIdx, nilIdx
}

// insertBefore links ni, unlinked, before at (nilIdx: at the back).
func (s *slot) insertBefore(ni, at int32) {
	n := &s.nodes[ni]
	if at == nilIdx {
		n.prev, n.next = s.tail, nilIdx
		if s.tail != nilIdx {
			s.nodes[s.tail].next = ni
		} else {
			s.head = ni
		}
		s.tail = ni
		return
	}
	p := s.nodes[at].prev
	n.prev, n.next = p, at
	s.nodes[at].prev = ni
	if p != nilIdx {
		s.nodes[p].next = ni
	} else {
		s.head = ni
	}
}

func (s *slot) pushFront(ni int32) {
	n := &s.nodes[ni]
	n.prev, n.next = nilIdx, s.head
	if s.head != nilIdx {
		s.nodes[s.head].prev = ni
	}
	s.head = ni
	if s.tail == nilIdx {
		s.tail = ni
	}
}
