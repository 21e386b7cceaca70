// Package index is the prefix index: for each chained chunk hash, which backends hold that
// prefix in their KV cache (as far as this router knows) and when each last used it.
//
// A chained hash names its whole prefix, so a map of them is a radix tree in disguise: a
// backend holds the first i chunks of a prompt if it holds Chunks[0..i-1].
//
// Structure. Chunk hashes are spread over shards (64 by default; shard.go), each an
// open-addressing table (table.go) from hash to a short list of holders, guarded by its own
// RWMutex. Each backend gets a small slot number and its own LRU list of the chunks it holds
// (lru.go), guarded by the slot's mutex. Lock order is slot, then shard; no goroutine holds
// two shard locks, no lock is held across a request, and Match (match.go) takes only shard
// read locks, one at a time. The chunks of a long prompt are looked up in batches, each
// shard of a batch locked once (batch.go), so that the probes overlap. A table slot (16 bytes) carries a bitmask of the backend
// slots below 32 that hold the chunk, so Match reads one table slot per chunk and no list.
// Lists link int32 indexes into slabs (slab.go), not pointers: a (chunk, backend) entry
// costs a 24-byte LRU node, its share of a 16-byte table slot (tables run 3/8 to 3/4 full as
// they double) and, for a chunk on two backends or more, a 12-byte holder (a chunk's only
// holder is kept in its table slot when its backend is one of the first 32: shard.go): at
// capacity 45–67 bytes of heap when each chunk is on one backend (57–79 past the 32nd),
// 47–58 when on two (TestMemoryPerEntryAtScale), steady under eviction churn. A
// backend still filling up has a node slab of up to twice its entries, never more than its
// capacity. Each backend also keeps a small cache (8 KiB) of the LRU nodes of chunks Record
// (record.go) found it holding, so that Record touches a held system prompt without locking
// a shard; a new chunk costs one shard write lock to look it up and add it, and at capacity
// one more to drop the entry it evicts.
//
// Bounds. A backend holds at most its capacity in chunks (KV-cache tokens ÷ chunk tokens),
// an entry marked coarse (key.IsCoarse: a key's chunks past key.FineChunks, each
// key.CoarseFactor chunks long) counting Options.CoarseWeight of it; past it, its least
// recently used chunks go first. Record touches a prompt's chunks deepest
// first, so of one prompt the deeper chunks are always evicted before their ancestors, as the
// engine's own LRU frees leaf blocks first, and a backend's entries always form whole
// prefixes. When the capacities add up to more than MaxEntries, every backend's capacity
// is scaled down in proportion, so the whole index stays under MaxEntries.
//
// Correction (correct.go). A backend's capacity is configured or scraped, and may be wrong:
// generated tokens, pinned blocks and a smaller GPU leave its prefix cache smaller than the
// index believes, and the index then lists prefixes the backend evicted long ago. The
// backend says so itself: when it reports far fewer cached tokens than the index listed
// (router.Shortfall), Correct drops its entries older than the prefix it lost and lowers its
// modelled capacity to what is left less the shortfall, so that the index evicts at the
// backend's pace; the learned capacity regrows slowly (regrowEvery) and is forgotten on a
// restart.
//
// Staleness. Entries are tied to the backend's Epoch: after ResetCache (restart, return from
// unhealthy) Match ignores them at once and the next Record or SetBackends frees them.
// Removed backends lose their entries in SetBackends.
package index

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"

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
	// prefixes at 64-token chunks; at 45–67 bytes an entry (see the package comment) that
	// is at most ≈ 280 MB of heap (≈ 330 MB with more than 32 backends, 57–79 bytes).
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
	// CoarseWeight is how many chunks' worth of a backend's capacity an entry whose hash
	// is marked coarse (key.IsCoarse: the key's chunks past key.FineChunks, each
	// key.CoarseFactor chunks long) takes; 0 or 1: one, as every other entry. The prefix
	// policy sets key.CoarseFactor.
	CoarseWeight int
}

// defaultShards spreads the chunk hashes over 64 shards, each with its own lock: Records and
// Matches of different prompts rarely wait on one another, and an empty shard costs a few
// hundred bytes.
const defaultShards = 64

// Index maps chained chunk hashes to the backends that hold them. It is safe for concurrent
// use. Backends must be registered with SetBackends before Record learns anything about them.
type Index struct {
	chunkTokens int64
	defaultKV   int64
	maxEntries  int64
	mask        uint64
	coarseW     int64 // an entry's weight when its hash is marked coarse (≥ 1)
	shards      []shard

	mu sync.Mutex // serialises SetBackends
	// retiredStamp is the largest stamp a retired slot issued; a new slot's stamps start
	// above it, so that a stamp of a backend removed and added again never matches entries
	// of its new slot. Guarded by mu.
	retiredStamp int64
	tab          atomic.Pointer[table]
}

// table is an immutable snapshot of the registered backends.
type table struct {
	byID   map[uint64]*slot
	maxNum int // every slot number is below maxNum
}

// New returns an empty Index.
func New(o Options) *Index { return newIndex(o, defaultShards) }

// newIndex returns an empty Index of shards hash shards, rounded up to a power of two and
// at most maxShards.
func newIndex(o Options, shards int) *Index {
	if o.ChunkTokens <= 0 {
		o.ChunkTokens = key.DefaultChunkTokens
	}
	if o.DefaultKVCacheTokens <= 0 {
		o.DefaultKVCacheTokens = DefaultKVCacheTokens
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	n := 1
	for n < min(shards, maxShards) {
		n <<= 1
	}
	x := &Index{
		chunkTokens: int64(o.ChunkTokens),
		defaultKV:   o.DefaultKVCacheTokens,
		maxEntries:  int64(o.MaxEntries),
		mask:        uint64(n - 1),
		coarseW:     int64(max(o.CoarseWeight, 1)),
		shards:      make([]shard, n),
	}
	for i := range x.shards {
		x.shards[i].hs.free = nilIdx
	}
	x.tab.Store(&table{byID: map[uint64]*slot{}})
	return x
}

func (x *Index) shard(h uint64) *shard { return &x.shards[x.shardOf(h)] }

// shardOf is the shard number of hash h: bits 1 and up, as bit 0 marks coarse chunks (half
// of the hashes of a long prompt have it set, the others clear).
func (x *Index) shardOf(h uint64) int { return int(h >> 1 & x.mask) }

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
	next := &table{byID: make(map[uint64]*slot, len(bs))}
	var used []bool
	for id, s := range old.byID {
		if want[id] == nil {
			x.retire(s) // before its number can be reused
			continue
		}
		next.byID[id] = s
		used = setBit(used, int(s.num))
	}
	for _, b := range bs {
		if next.byID[b.ID] != nil {
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
		s := &slot{num: uint16(num), name: b.Name, head: nilIdx, tail: nilIdx, free: nilIdx, stamp: x.retiredStamp, coarseW: x.coarseW}
		s.epoch.Store(b.Epoch())
		next.byID[b.ID] = s
	}
	for id, s := range next.byID {
		s.rawCap = x.rawCapacity(want[id])
	}
	x.install(next)
	for id, s := range next.byID {
		s.locked(func() { x.catchUp(s, want[id].Epoch()) })
	}
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

// install scales capacities to the global cap and publishes tab. Called with x.mu held.
func (x *Index) install(tab *table) {
	var sum int64
	for _, s := range tab.byID {
		sum += s.rawCap
		tab.maxNum = max(tab.maxNum, int(s.num)+1)
	}
	for _, s := range tab.byID {
		capacity := s.rawCap
		if x.maxEntries > 0 && sum > x.maxEntries {
			capacity = int64(float64(capacity) * float64(x.maxEntries) / float64(sum)) // floor: Σ ≤ MaxEntries
		}
		s.capacity.Store(capacity)
	}
	x.tab.Store(tab)
}

// retire frees s's entries and marks it removed. Called with x.mu held.
func (x *Index) retire(s *slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	x.retiredStamp = max(x.retiredStamp, s.stamp)
	x.purge(s)
	s.removed.Store(true)
	s.nodes, s.recent = nil, nil
}

// BackendStats describes one backend's part of the index.
type BackendStats struct {
	Name string
	// Entries is the chunks recorded for the backend, by weight: a coarse entry counts
	// Options.CoarseWeight (including, until the next Record, entries of an old epoch that
	// Match already ignores).
	Entries int64
	// Capacity is the most entries the backend may have, after the global cap and what
	// Correct learned of the backend's own capacity.
	Capacity int64
	// Evictions counts entries dropped for capacity (not for restarts or removal).
	Evictions uint64
	// Corrections counts the backend's answers that showed it held far less than the index
	// listed (Correct); CorrectedEntries the entries those corrections dropped, CorrectedTokens
	// their approximate tokens (entries × chunk tokens: an over-count of up to 112 tokens
	// for each prompt whose head chunks a correction drops, at the default size: the key's two
	// head chunks span 16 tokens together, key.HeadChunks, and an entry does not keep its size).
	Corrections      uint64
	CorrectedEntries uint64
	CorrectedTokens  uint64
}

// Stats appends one BackendStats per registered backend to dst, ordered by name.
func (x *Index) Stats(dst []BackendStats) []BackendStats {
	start := len(dst)
	for _, s := range x.tab.Load().byID {
		dst = append(dst, BackendStats{Name: s.name, Entries: s.count.Load(), Capacity: s.limit(),
			Evictions: s.evictions.Load(), Corrections: s.corrections.Load(), CorrectedEntries: s.corrected.Load(),
			CorrectedTokens: s.corrected.Load() * uint64(x.chunkTokens)})
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
