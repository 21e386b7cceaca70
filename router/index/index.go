// Package index is the prefix index: for each chained chunk hash, which backends hold that
// prefix in their KV cache (as far as this router knows) and when each last used it.
//
// A chained hash names its whole prefix, so a map of them is a radix tree in disguise: a
// backend holds the first i chunks of a prompt if it holds Chunks[0..i-1].
//
// Structure. Chunk hashes are spread over shards (64 by default), each an open-addressing
// table (table.go) from hash to a short list of holders, guarded by its own RWMutex. Each
// backend gets a small slot number and its own LRU list of the chunks it holds, guarded by
// the slot's mutex. Lock order is slot, then shard; no goroutine holds two shard locks, no
// lock is held across a request, and Match takes only shard read locks, one chunk at a
// time. A table slot (16 bytes) carries a bitmask of the backend slots below 32 that hold
// the chunk, so Match reads one table slot per chunk and no list. Lists link int32 indexes
// into slabs, not pointers: a (chunk, backend) entry costs a 12-byte holder, a 24-byte LRU
// node and its share of a 16-byte table slot (tables run 3/8 to 3/4 full as they double):
// at capacity 57–79 bytes of heap when each chunk is on one backend, 47–58 when on two
// (TestMemoryPerEntryAtScale), steady under eviction churn. A backend still filling up has a
// node slab of up to twice its entries, never more than its capacity. Each backend also keeps a small cache (8 KiB) of the LRU nodes of chunks Record
// found it holding, so that Record touches a held system prompt without locking a shard; a
// new chunk costs one shard write lock to look it up and add it, and at capacity one more
// to drop the entry it evicts.
//
// Bounds. A backend holds at most its capacity in chunks (KV-cache tokens ÷ chunk tokens);
// past it, its least recently used chunks go first. Record touches a prompt's chunks deepest
// first, so of one prompt the deeper chunks are always evicted before their ancestors, as the
// engine's own LRU frees leaf blocks first, and a backend's entries always form whole
// prefixes. When the capacities add up to more than MaxEntries, every backend's capacity
// is scaled down in proportion, so the whole index stays under MaxEntries.
//
// Staleness. Entries are tied to the backend's Epoch: after ResetCache (restart, return from
// unhealthy) Match ignores them at once and the next Record or SetBackends frees them.
// Removed backends lose their entries in SetBackends or RemoveBackend.
package index

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// Defaults of an Index, for Options left at zero.
const (
	// DefaultKVCacheTokens is a backend's KV-cache capacity, in tokens, when neither the
	// configuration nor the replica's metrics give one. Llama-3-8B in bf16 keeps 2 × 32
	// layers × 8 KV heads × 128 dims × 2 bytes = 128 KiB of KV per token; an 80 GB H100 at
	// vLLM's gpu_memory_utilization 0.9 leaves ≈ 56 GB after 16 GB of weights and
	// activations: ≈ 430k tokens, rounded down to 400k.
	DefaultKVCacheTokens = 400_000
	// DefaultMaxEntries bounds the index to 4M (chunk, backend) entries, ≈ 256M tokens of
	// prefixes at 64-token chunks; at 57–79 bytes an entry (see the package comment) that
	// is at most ≈ 330 MB of heap.
	DefaultMaxEntries = 4 << 20
)

// Options configure an Index. Zero fields take the defaults above and key.DefaultChunkTokens.
type Options struct {
	// ChunkTokens is the number of approximate tokens per chunk (0: key.DefaultChunkTokens).
	ChunkTokens int
	// DefaultKVCacheTokens is a backend's KV capacity in tokens when its KVCacheTokens is 0
	// and it reported none (0: DefaultKVCacheTokens).
	DefaultKVCacheTokens int64
	// MaxEntries caps the (chunk, backend) entries over all backends (0: DefaultMaxEntries;
	// negative: no cap).
	MaxEntries int
	// Shards is the number of hash shards, rounded up to a power of two (default 64).
	Shards int
}

// Index maps chained chunk hashes to the backends that hold them. It is safe for concurrent
// use. Backends must be registered with SetBackends before Record learns anything about them.
type Index struct {
	chunkTokens int64
	defaultKV   int64
	maxEntries  int64
	mask        uint64
	shards      []shard

	mu sync.Mutex // serialises SetBackends and RemoveBackend
	// retiredStamp is the largest stamp a retired slot issued; a new slot's stamps start
	// above it, so that a stamp of a backend removed and added again never matches entries
	// of its new slot. Guarded by mu.
	retiredStamp int64
	tab          atomic.Pointer[table]
	evictions    atomic.Uint64
}

// table is an immutable snapshot of the registered backends.
type table struct {
	byID   map[uint64]*slot
	maxNum int // every slot number is below maxNum
}

type shard struct {
	mu     sync.RWMutex
	chunks chunkTable
	hs     holderSlab
	_      [64]byte // keep neighbouring shards' locks off one cache line
}

// holder says that slot holds the chunk; node is the slot's LRU node for it.
type holder struct {
	next int32 // next holder of the same chunk, -1 at the end
	node int32
	slot uint16
}

// maskSlots is the number of slots that chunk.mask covers.
const maskSlots = 32

const (
	pageBits = 10
	pageSize = 1 << pageBits
	nilIdx   = -1
)

// holderSlab allocates holders in fixed pages, so growth never copies and wastes at most
// one page per shard.
type holderSlab struct {
	pages [][]holder
	n     int32
	free  int32 // free list through holder.next
}

func (s *holderSlab) at(i int32) *holder { return &s.pages[i>>pageBits][i&(pageSize-1)] }

func (s *holderSlab) alloc() int32 {
	if i := s.free; i != nilIdx {
		s.free = s.at(i).next
		return i
	}
	if int(s.n)>>pageBits == len(s.pages) {
		s.pages = append(s.pages, make([]holder, pageSize))
	}
	s.n++
	return s.n - 1
}

func (s *holderSlab) release(i int32) {
	*s.at(i) = holder{next: s.free}
	s.free = i
}

// slot is one backend's part of the index: its LRU list of entries.
type slot struct {
	num  uint16
	id   uint64
	name string

	removed   atomic.Bool   // retired; its number may belong to a new slot
	epoch     atomic.Uint64 // the backend epoch the entries belong to
	capacity  atomic.Int64  // effective capacity in chunks
	count     atomic.Int64
	evictions atomic.Uint64
	rawCap    int64 // capacity before the global cap; guarded by Index.mu

	mu    sync.Mutex // guards the fields below and the slot's holders
	nodes []node
	head  int32 // most recently used
	tail  int32 // least recently used
	free  int32 // free list through node.next
	stamp int64 // the last Record's stamp (see Stamp)
	// recent caches the nodes of chunks that Record found held, so that touching them
	// again locks no shard. See recalled.
	recent []uint64
}

// The recent cache is 2-way set associative: recentSets sets of two entries, the most
// recently remembered first. An entry is a tag (the low 32 bits of the hash's Fibonacci
// product, whose top bits pick the set) over the node index + 1 (0: empty): 8 KiB per
// backend, allocated by its first Record.
const (
	recentBits = 9
	recentSets = 1 << recentBits
)

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

// nextStamp returns the stamp of a Record on s at now. Called with s.mu held.
func (s *slot) nextStamp(now int64) int64 {
	t := now &^ added
	if t <= s.stamp {
		t = s.stamp + 2
	}
	s.stamp = t
	return t
}

// New returns an empty Index.
func New(o Options) *Index {
	if o.ChunkTokens <= 0 {
		o.ChunkTokens = key.DefaultChunkTokens
	}
	if o.DefaultKVCacheTokens <= 0 {
		o.DefaultKVCacheTokens = DefaultKVCacheTokens
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	n := 64
	if o.Shards > 0 {
		n = 1
		for n < o.Shards {
			n <<= 1
		}
	}
	x := &Index{
		chunkTokens: int64(o.ChunkTokens),
		defaultKV:   o.DefaultKVCacheTokens,
		maxEntries:  int64(o.MaxEntries),
		mask:        uint64(n - 1),
		shards:      make([]shard, n),
	}
	for i := range x.shards {
		x.shards[i].hs.free = nilIdx
	}
	x.tab.Store(&table{byID: map[uint64]*slot{}})
	return x
}

func (x *Index) shard(h uint64) *shard { return &x.shards[h&x.mask] }

// norm maps the chunk hash 0, which marks empty table slots, to 1.
func norm(h uint64) uint64 { return max(h, 1) }

// SetBackends makes bs the registered backends (identified by ID): it frees the entries of
// backends no longer listed and of backends whose epoch moved, registers new ones, and
// recomputes every capacity (KV tokens may have changed, and the global cap is shared).
func (x *Index) SetBackends(bs []*backend.Backend) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.tab.Load()
	want := make(map[uint64]*backend.Backend, len(bs))
	for _, b := range bs {
		want[b.ID] = b
	}
	nt := &table{byID: make(map[uint64]*slot, len(bs))}
	var used []bool
	for id, s := range old.byID {
		if want[id] == nil {
			x.retire(s) // before its number can be reused
			continue
		}
		nt.byID[id] = s
		used = setBit(used, int(s.num))
	}
	for _, b := range bs {
		if nt.byID[b.ID] != nil {
			continue
		}
		num := slices.Index(used, false)
		if num < 0 {
			num = len(used)
		}
		if num > math.MaxUint16 {
			continue // more backends than slots; they are simply not indexed
		}
		used = setBit(used, num)
		s := &slot{num: uint16(num), id: b.ID, name: b.Name, head: nilIdx, tail: nilIdx, free: nilIdx, stamp: x.retiredStamp}
		s.epoch.Store(b.Epoch())
		nt.byID[b.ID] = s
	}
	for id, s := range nt.byID {
		s.rawCap = x.rawCapacity(want[id])
	}
	x.install(nt)
	for id, s := range nt.byID {
		b := want[id]
		s.mu.Lock()
		if e := b.Epoch(); e != s.epoch.Load() {
			x.purge(s)
			s.epoch.Store(e)
		}
		x.trim(s)
		s.mu.Unlock()
	}
}

// RemoveBackend frees all entries of b and forgets it. Unknown backends are ignored.
func (x *Index) RemoveBackend(b *backend.Backend) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.tab.Load()
	s := old.byID[b.ID]
	if s == nil {
		return
	}
	x.retire(s)
	nt := &table{byID: make(map[uint64]*slot, len(old.byID))}
	for id, o := range old.byID {
		if o != s {
			nt.byID[id] = o
		}
	}
	x.install(nt) // capacities only grow here: nothing to trim
}

func setBit(bs []bool, i int) []bool {
	for len(bs) <= i {
		bs = append(bs, false)
	}
	bs[i] = true
	return bs
}

func (x *Index) rawCapacity(b *backend.Backend) int64 {
	return b.KVCapacity(x.defaultKV) / x.chunkTokens
}

// install scales capacities to the global cap and publishes nt. Called with x.mu held.
func (x *Index) install(nt *table) {
	var sum int64
	for _, s := range nt.byID {
		sum += s.rawCap
		nt.maxNum = max(nt.maxNum, int(s.num)+1)
	}
	for _, s := range nt.byID {
		c := s.rawCap
		if x.maxEntries > 0 && sum > x.maxEntries {
			c = int64(float64(c) * float64(x.maxEntries) / float64(sum)) // floor: Σ ≤ MaxEntries
		}
		s.capacity.Store(c)
	}
	x.tab.Store(nt)
}

// retire frees s's entries and marks it removed. Called with x.mu held.
func (x *Index) retire(s *slot) {
	s.mu.Lock()
	x.retiredStamp = max(x.retiredStamp, s.stamp)
	x.purge(s)
	s.removed.Store(true)
	s.nodes, s.recent = nil, nil
	s.mu.Unlock()
}

// Record marks b as holding every chunk of chunks (a prompt's chained hashes, in order) as
// of now, making them its most recently used entries. A prompt longer than b's capacity is
// recorded up to the capacity. Backends not registered with SetBackends are ignored.
func (x *Index) Record(chunks []uint64, b *backend.Backend, now time.Time) Stamp {
	return x.RecordHeld(chunks, b, now, 0)
}

// freshWindow bounds how recently a held prefix must have been touched for RecordHeld to
// leave it as it is: 50 ms, or a sixteenth of the backend's LRU horizon (now minus its
// oldest entry's last use) when that is shorter.
const freshWindow = 50 * time.Millisecond

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
	if e := b.Epoch(); e != s.epoch.Load() {
		x.purge(s)
		s.epoch.Store(e)
	}
	x.trim(s)
	limit := s.capacity.Load()
	if limit <= 0 {
		return 0
	}
	if int64(len(chunks)) > limit {
		chunks = chunks[:limit]
	}
	t := s.nextStamp(now.UnixNano())
	lo := 0 // the shallowest chunk to record
	if held > 0 && held <= len(chunks) && x.heldFresh(s, norm(chunks[held-1]), t) {
		lo = held
	}
	var evicted uint64
	// Chained hashes make a backend's entries whole prefixes, so walking deepest first the
	// new chunks come before the held ones: until a chunk is found held, expect the next one
	// to be new too, and look it up under the write lock that adding it takes anyway.
	fresh := true
	// Deepest first, each moved to the front: the prompt ends up shallow-to-deep from the
	// front of the list, so its deepest chunks are the first of it to be evicted.
	for i := len(chunks) - 1; i >= lo; i-- {
		h := norm(chunks[i])
		if ni := s.recalled(h); ni != nilIdx {
			s.retouch(ni, t)
			fresh = false
			continue
		}
		sh := x.shard(h)
		// Only this slot adds or removes its own holders, and s.mu is held: what find
		// says stays true after the lock is released.
		if !fresh {
			sh.mu.RLock()
			ni := sh.find(h, s.num)
			sh.mu.RUnlock()
			if ni != nilIdx {
				s.remember(h, ni)
				s.retouch(ni, t)
				continue
			}
			fresh = true
		}
		ni, held, ev := x.claim(s, sh, h, t, limit)
		if held {
			s.remember(h, ni)
			s.retouch(ni, t)
			fresh = false
		} else if ev {
			evicted++
		}
	}
	if evicted > 0 {
		s.evictions.Add(evicted)
		x.evictions.Add(evicted)
	}
	return Stamp(t)
}

// heldFresh reports whether s holds h and touched it within the fresh window before t.
// Called with s.mu held.
func (x *Index) heldFresh(s *slot, h uint64, t int64) bool {
	ni := s.recalled(h)
	if ni == nilIdx {
		sh := x.shard(h)
		sh.mu.RLock()
		ni = sh.find(h, s.num)
		sh.mu.RUnlock()
		if ni == nilIdx {
			return false
		}
		s.remember(h, ni)
	}
	u := s.nodes[ni].used
	if u&added != 0 {
		// Added by a Record that may yet be withdrawn (Forget) and that no later Record has
		// touched: touch the prefix, which confirms it, rather than leave it to that Forget.
		return false
	}
	window := int64(freshWindow)
	if s.tail != nilIdx {
		window = min(window, (t-s.nodes[s.tail].used&^added)/16)
	}
	return t-u < window
}

// claim looks h up for s under sh's write lock and, when s does not hold it, adds it as s's
// most recently used entry, evicting the least recently used one at capacity: that entry's
// node is reused for h, and its holder is removed after sh is released, so that no two
// shard locks are ever held at once. Meanwhile both holders name the node, which only this
// slot's own finds, under s.mu, could see. It returns s's node of h, whether s held h
// already (then nothing changed), and whether an entry was evicted. Called with s.mu held.
func (x *Index) claim(s *slot, sh *shard, h uint64, t, limit int64) (ni int32, held, evicted bool) {
	ti := int32(nilIdx)
	var old uint64
	var osh *shard
	if s.count.Load() >= limit {
		ti = s.tail
		old = s.nodes[ti].hash
		osh = x.shard(old)
	} else {
		s.reserve(limit) // not while readers wait on sh
	}
	sh.mu.Lock()
	if osh == sh {
		// Rare: h shares the evicted entry's shard. Remove before adding, as evicting
		// first would.
		if ni := sh.find(h, s.num); ni != nilIdx {
			sh.mu.Unlock()
			return ni, true, false
		}
		sh.remove(old, s.num)
		sh.add(h, s.num, ti)
		sh.mu.Unlock()
	} else {
		c := sh.chunks.put(h) // one probe for the lookup and the insertion
		if ni := sh.holderOf(c, s.num); ni != nilIdx {
			sh.mu.Unlock()
			return ni, true, false
		}
		if ti == nilIdx {
			ni := s.alloc(h, t|added, limit)
			sh.link(c, s.num, ni)
			sh.mu.Unlock()
			return ni, false, false
		}
		sh.link(c, s.num, ti)
		sh.mu.Unlock()
		osh.mu.Lock()
		osh.remove(old, s.num)
		osh.mu.Unlock()
	}
	s.nodes[ti].hash = h
	s.touch(ti, t|added)
	return ti, false, true
}

// Forget withdraws what the Record stamped st added to b's entries among chunks: entries it
// created that no Record has touched since. Entries b held before that Record, and entries
// another Record has touched or re-added since (another request that b accepted), stay.
//
// The proxy records a prompt as soon as the request is on its way to the backend, so that
// the index update overlaps the backend's work, and forgets it when the backend then refuses
// the request (a 400 for a too-long prompt, a 429/503 retried elsewhere) or never answers:
// a refused prompt left nothing in the engine's KV cache. Entries evicted by that Record
// stay evicted.
func (x *Index) Forget(chunks []uint64, b *backend.Backend, st Stamp) {
	if len(chunks) == 0 || b == nil || st == 0 {
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
	mark := int64(st) | added
	for _, c := range chunks {
		h := norm(c)
		sh := x.shard(h)
		sh.mu.Lock()
		ni := sh.find(h, s.num)
		if ni != nilIdx && s.nodes[ni].used == mark {
			sh.remove(h, s.num)
		} else {
			ni = nilIdx
		}
		sh.mu.Unlock()
		if ni != nilIdx {
			s.unlink(ni)
			s.release(ni)
		}
	}
}

// Match sets out[j] to the number of leading chunks of chunks that cs[j] holds: chunk i
// counts only if chunks 0..i all do. It walks the chunks from the start and stops at the
// first chunk that no candidate still matching holds. It returns the largest out[j].
// out must have room for len(cs); candidates must have distinct IDs. It allocates only when
// there are more than 64 candidates or 256 registered backends.
func (x *Index) Match(chunks []uint64, cs []*backend.Backend, out []int) int {
	out = out[:len(cs)]
	clear(out)
	if len(chunks) == 0 || len(cs) == 0 {
		return 0
	}
	tab := x.tab.Load()
	var posBuf [256]uint16 // slot number → candidate index + 1
	var slotBuf [64]*slot  // candidate index → slot
	pos, slots := posBuf[:], slotBuf[:]
	if tab.maxNum > len(pos) {
		pos = make([]uint16, tab.maxNum)
	}
	if len(cs) > len(slots) {
		slots = make([]*slot, len(cs))
	}
	var want uint32 // candidates' slot bits
	wide := false   // some candidate's slot is beyond the mask
	for j, b := range cs {
		s := tab.byID[b.ID]
		// A restarted backend's entries are ignored until they are purged.
		if s == nil || s.epoch.Load() != b.Epoch() {
			continue
		}
		slots[j] = s
		pos[s.num] = uint16(j + 1)
		if s.num < maskSlots {
			want |= 1 << s.num
		} else {
			wide = true
		}
	}
	var best int
	switch {
	case wide:
		best = x.matchList(chunks, pos, out)
	case want != 0:
		best = x.matchMask(chunks, want, pos, out)
	}
	// A candidate whose slot was retired meanwhile may have been credited with holders of
	// a new slot that reuses the number: retire happens before any reuse, so checking it
	// after the walk is enough.
	for j, s := range slots[:len(cs)] {
		if s != nil && s.removed.Load() {
			out[j] = 0
		}
	}
	return best
}

// matchMask is Match for slots that all fit the chunk mask.
func (x *Index) matchMask(chunks []uint64, want uint32, pos []uint16, out []int) int {
	alive := want
	for i, h := range chunks {
		h = norm(h)
		sh := x.shard(h)
		var mask uint32
		sh.mu.RLock()
		if c := sh.chunks.get(h); c != nil {
			mask = c.mask
		}
		sh.mu.RUnlock()
		next := alive & mask
		for gone := alive &^ next; gone != 0; gone &= gone - 1 {
			out[pos[bits.TrailingZeros32(gone)]-1] = i
		}
		if alive = next; alive == 0 {
			return i
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		out[pos[bits.TrailingZeros32(alive)]-1] = len(chunks)
	}
	return len(chunks)
}

// matchList is Match through the holder lists, for slots beyond the chunk mask.
func (x *Index) matchList(chunks []uint64, pos []uint16, out []int) int {
	best := 0
	for i, h := range chunks {
		h = norm(h)
		sh := x.shard(h)
		advanced := false
		sh.mu.RLock()
		hi := int32(nilIdx)
		if c := sh.chunks.get(h); c != nil {
			hi = c.head
		}
		for hi != nilIdx {
			hd := sh.hs.at(hi)
			if p := int(pos[hd.slot]); p > 0 && out[p-1] == i {
				out[p-1] = i + 1
				advanced = true
			}
			hi = hd.next
		}
		sh.mu.RUnlock()
		if !advanced {
			break
		}
		best = i + 1
	}
	return best
}

// find returns the LRU node of slot's holder of h, or nilIdx. Called with sh.mu held.
func (sh *shard) find(h uint64, slot uint16) int32 {
	c := sh.chunks.get(h)
	if c == nil {
		return nilIdx
	}
	return sh.holderOf(c, slot)
}

// holderOf returns the LRU node of slot's holder of c, or nilIdx. Called with sh.mu held.
func (sh *shard) holderOf(c *chunk, slot uint16) int32 {
	if slot < maskSlots && c.mask&(1<<slot) == 0 {
		return nilIdx
	}
	for hi := c.head; hi != nilIdx; {
		hd := sh.hs.at(hi)
		if hd.slot == slot {
			return hd.node
		}
		hi = hd.next
	}
	return nilIdx
}

// add links a new holder of h. Called with sh.mu held.
func (sh *shard) add(h uint64, slot uint16, node int32) { sh.link(sh.chunks.put(h), slot, node) }

// link adds a holder to c, which put returned. Called with sh.mu held.
func (sh *shard) link(c *chunk, slot uint16, node int32) {
	hi := sh.hs.alloc() // does not move c
	*sh.hs.at(hi) = holder{next: c.head, node: node, slot: slot}
	c.head = hi
	if slot < maskSlots {
		c.mask |= 1 << slot
	}
}

// remove unlinks slot's holder of h, if any. Called with sh.mu held.
func (sh *shard) remove(h uint64, slot uint16) {
	c := sh.chunks.get(h)
	if c == nil {
		return
	}
	prev := int32(nilIdx)
	for hi := c.head; hi != nilIdx; {
		hd := sh.hs.at(hi)
		if hd.slot != slot {
			prev, hi = hi, hd.next
			continue
		}
		if prev != nilIdx {
			sh.hs.at(prev).next = hd.next
		} else {
			c.head = hd.next
		}
		if slot < maskSlots {
			c.mask &^= 1 << slot
		}
		sh.hs.release(hi)
		if c.head == nilIdx {
			sh.chunks.del(h)
		}
		return
	}
}

// evict drops s's least recently used entry. Called with s.mu held and no shard lock.
func (x *Index) evict(s *slot) {
	ti := s.tail
	if ti == nilIdx {
		return
	}
	h := s.nodes[ti].hash
	sh := x.shard(h)
	sh.mu.Lock()
	sh.remove(h, s.num)
	sh.mu.Unlock()
	s.unlink(ti)
	s.release(ti)
	s.evictions.Add(1)
	x.evictions.Add(1)
}

// trim evicts until s is within its capacity (which SetBackends may have lowered).
// Called with s.mu held.
func (x *Index) trim(s *slot) {
	for s.count.Load() > max(s.capacity.Load(), 0) {
		x.evict(s)
	}
}

// purge frees all of s's entries. Called with s.mu held.
func (x *Index) purge(s *slot) {
	for ni := s.head; ni != nilIdx; ni = s.nodes[ni].next {
		h := s.nodes[ni].hash
		sh := x.shard(h)
		sh.mu.Lock()
		sh.remove(h, s.num)
		sh.mu.Unlock()
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
	m := h * 0x9e3779b97f4a7c15
	set := s.recent[2*(m>>(64-recentBits)):][:2]
	tag := m << 32
	for w, e := range set {
		if e&^math.MaxUint32 != tag || uint32(e) == 0 {
			continue
		}
		ni := int32(uint32(e)) - 1
		if int(ni) >= len(s.nodes) || s.nodes[ni].hash != h {
			return nilIdx
		}
		if w == 1 {
			set[0], set[1] = e, set[0]
		}
		return ni
	}
	return nilIdx
}

// remember notes in recent that ni is the node of h. Called with s.mu held.
func (s *slot) remember(h uint64, ni int32) {
	if s.recent == nil {
		s.recent = make([]uint64, 2*recentSets)
	}
	m := h * 0x9e3779b97f4a7c15
	set := s.recent[2*(m>>(64-recentBits)):][:2]
	e := m<<32 | uint64(uint32(ni+1))
	if set[0]&^math.MaxUint32 != e&^math.MaxUint32 {
		set[1] = set[0]
	}
	set[0] = e
}

// alloc takes a node for h and puts it at the front. limit bounds the slab's growth.
func (s *slot) alloc(h uint64, t int64, limit int64) int32 {
	ni := s.free
	if ni != nilIdx {
		s.free = s.nodes[ni].next
	} else {
		s.reserve(limit)
		s.nodes = append(s.nodes, node{})
		ni = int32(len(s.nodes) - 1)
	}
	s.nodes[ni] = node{hash: h, used: t, prev: nilIdx, next: nilIdx}
	s.pushFront(ni)
	s.count.Add(1)
	return ni
}

// minNodeSlab is the node slab's first size, in nodes.
const minNodeSlab = 64

// reserve grows the node slab, if full, so that the next alloc does not copy it: it doubles,
// up to exactly limit (the capacity). A doubling slice alone (append, slices.Grow) overshoots
// by up to a quarter past the capacity, where the slab then stays: at capacity the slab is
// exactly 24 bytes a node. While a backend fills up, the slab is up to twice its entries.
func (s *slot) reserve(limit int64) {
	if s.free != nilIdx || len(s.nodes) < cap(s.nodes) {
		return
	}
	want := min(max(2*len(s.nodes), minNodeSlab), int(limit))
	if want <= len(s.nodes) {
		want = len(s.nodes) + 1 // not reached: alloc runs only below the capacity
	}
	grown := make([]node, len(s.nodes), want)
	copy(grown, s.nodes)
	s.nodes = grown
}

func (s *slot) release(ni int32) {
	s.nodes[ni] = node{next: s.free}
	s.free = ni
	s.count.Add(-1)
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

// BackendStats describes one backend's part of the index.
type BackendStats struct {
	ID   uint64
	Name string
	// Entries is the number of chunks recorded for the backend (including, until the next
	// Record, entries of an old epoch that Match already ignores).
	Entries int64
	// Capacity is the most entries the backend may have, after the global cap.
	Capacity int64
	// Evictions counts entries dropped for capacity (not for restarts or removal).
	Evictions uint64
	// Oldest is the last use of the backend's least recently used entry (zero when empty):
	// now − Oldest approximates how long a prefix survives in that backend's cache.
	Oldest time.Time
}

// Stats appends one BackendStats per registered backend to dst, ordered by name.
func (x *Index) Stats(dst []BackendStats) []BackendStats {
	start := len(dst)
	for _, s := range x.tab.Load().byID {
		st := BackendStats{ID: s.id, Name: s.name, Capacity: s.capacity.Load(), Evictions: s.evictions.Load()}
		s.mu.Lock()
		st.Entries = s.count.Load()
		if s.tail != nilIdx {
			st.Oldest = time.Unix(0, s.nodes[s.tail].used&^added)
		}
		s.mu.Unlock()
		dst = append(dst, st)
	}
	slices.SortFunc(dst[start:], func(a, b BackendStats) int { return cmp.Compare(a.Name, b.Name) })
	return dst
}

// Entries is the number of (chunk, backend) entries over all backends.
func (x *Index) Entries() int64 {
	var n int64
	for _, s := range x.tab.Load().byID {
		n += s.count.Load()
	}
	return n
}

// Chunks is the number of distinct chunk hashes held by at least one backend.
func (x *Index) Chunks() int {
	n := 0
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		n += sh.chunks.n
		sh.mu.RUnlock()
	}
	return n
}

// Evictions counts entries dropped for capacity since the Index was made.
func (x *Index) Evictions() uint64 { return x.evictions.Load() }
