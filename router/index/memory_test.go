package index

import (
	"fmt"
	"math"
	"runtime"
	"testing"
	"unsafe"

	"github.com/prefixlb/prefixlb/backend"
)

// Sizes of the index's parts, in bytes.
const (
	tableSlotBytes = int64(unsafe.Sizeof(chunk{}))  // 16: one open-addressing slot per chunk hash
	holderBytes    = int64(unsafe.Sizeof(holder{})) // 12: one per (chunk, backend) entry
	nodeBytes      = int64(unsafe.Sizeof(node{}))   // 24: one LRU node per entry
)

// footprint is what the index's own structures take, by part, in bytes, and what they hold.
type footprint struct {
	table, holders, nodes, recent int64
	entries, chunks, backends     int64
	capacity                      int64 // entries the backends may hold, summed
}

// nodeSlabBytes is the size of s's LRU node slab as allocated. Called with s.mu held.
func nodeSlabBytes(s *slot) int64 { return int64(cap(s.nodes)) * nodeBytes }

func (f footprint) total() int64 { return f.table + f.holders + f.nodes + f.recent }

// footprint adds up the index's slabs and tables as allocated (capacity, not use).
func (x *Index) footprint() footprint {
	var f footprint
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		f.table += int64(len(sh.chunks.slots)) * tableSlotBytes
		f.holders += int64(len(sh.hs.pages)) * pageSize * holderBytes
		f.chunks += int64(sh.chunks.n)
		sh.mu.RUnlock()
	}
	for _, s := range x.tab.Load().byID {
		s.mu.Lock()
		f.nodes += nodeSlabBytes(s)
		f.recent += int64(cap(s.recent)) * 8
		f.entries += s.count.Load()
		f.capacity += s.capacity.Load()
		f.backends++
		s.mu.Unlock()
	}
	return f
}

// memScenario fills an index with entries (chunk, backend) pairs over backends, each chunk
// held by holders backends, in prompts of 25 chunks; each backend's capacity is fill × its
// share, so fill < 1 measures a slab still being filled.
type memScenario struct {
	entries, backends, holders int
	fill                       float64
}

func (sc memScenario) String() string {
	return fmt.Sprintf("%.1fM_entries/%d_backends/%d_holders/%.0f%%_full", float64(sc.entries)/1e6, sc.backends, sc.holders, 100*sc.fill)
}

// memResult is one scenario's measurement: heap is the live-heap growth (after GC) per
// entry, f the index's parts as allocated.
type memResult struct {
	heap float64
	f    footprint
}

// memSetup makes n backends of perBackend chunks of 64 tokens, measures the live heap, and
// then makes an index without global cap over them. heap runs a GC and returns the live
// heap, leaving the runtime's statistics in ms.
func memSetup(tb testing.TB, n int, perBackend int64, ms *runtime.MemStats) (x *Index, bs []*backend.Backend, base float64, heap func() float64) {
	bs = make([]*backend.Backend, n)
	for i := range bs {
		bs[i] = newBackend(tb, fmt.Sprintf("b%d", i), perBackend*64)
	}
	heap = func() float64 {
		runtime.GC()
		runtime.ReadMemStats(ms)
		return float64(ms.HeapAlloc)
	}
	base = heap()
	x = New(Options{ChunkTokens: 64, MaxEntries: -1})
	x.SetBackends(bs)
	return x, bs, base, heap
}

func measureMemory(tb testing.TB, sc memScenario) memResult {
	tb.Helper()
	const promptChunks = 25
	// Prompts go round the backends, so one may get a prompt more than its share.
	perBackend := int64(math.Ceil(float64(sc.entries)/float64(sc.backends)/sc.fill)) + promptChunks*int64(sc.holders)
	var ms runtime.MemStats
	x, bs, base, heap := memSetup(tb, sc.backends, perBackend, &ms)
	prompts := sc.entries / promptChunks / sc.holders
	for p := range prompts {
		c := chain(uint64(p), promptChunks)
		for h := range sc.holders {
			x.Record(c, bs[(p+h)%sc.backends], t0)
		}
	}
	grown := heap() - base
	f := x.footprint()
	if want := int64(prompts * promptChunks * sc.holders); f.entries != want || evictions(x) != 0 {
		tb.Fatalf("%v: %d entries, %d evictions; want %d, 0", sc, f.entries, evictions(x), want)
	}
	runtime.KeepAlive(x)
	return memResult{heap: grown / float64(f.entries), f: f}
}

// largeAllocRounding is how far the Go allocator may round up one large allocation (a node
// slab): to its 8 KiB pages.
const largeAllocRounding = 8 << 10

// perEntryBound is the most heap an entry may take: its holder (none for a chunk's only
// holder, which its table slot keeps when the backend is one of the first maskSlots); its
// LRU node, in a slab that
// is at most twice the entries while a backend fills and exactly the capacity once full; its
// share of a table slot at the lowest load a table has (3/8, just after it doubled) split
// over the holders of the chunk; and slack of one holder page per shard and an allocation's
// rounding per backend.
func perEntryBound(sc memScenario, shards int) float64 {
	nodes := float64(nodeBytes) * min(2, 1/sc.fill)
	share := float64(tableSlotBytes) / (3.0 / 8) / float64(sc.holders)
	slack := float64(int64(shards)*pageSize*holderBytes+int64(sc.backends)*largeAllocRounding) / float64(sc.entries)
	holder := 0.0
	if sc.holders > 1 || sc.backends > maskSlots {
		holder = float64(holderBytes)
	}
	return holder + nodes + share + slack
}

// TestMemoryPerEntryAtScale measures the heap the index takes per (chunk, backend) entry at
// 1M and 3M entries, full and partly filled, chunks on one or two backends, and checks it
// against what the structures account for: 24 B LRU node + 16 B table slot ÷ (table load ×
// holders per chunk) + a 12 B holder when a chunk has more than one, the load between 3/8
// and 3/4 as the tables double: at capacity 45–67 B an entry when each chunk is on one
// backend (of the first 32), 47–58 when on two. While a
// backend fills, its node slab (doubling) holds up to twice its entries, never more than its
// capacity. Run without -race (which it only slows down):
//
//	go test -count=1 -run TestMemoryPerEntryAtScale -v ./router/index/
func TestMemoryPerEntryAtScale(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("fills up to 3M entries to measure memory: run without -short and -race")
	}
	shards := len(New(Options{}).shards)
	for _, sc := range []memScenario{
		{1 << 20, 8, 1, 1}, {1 << 20, 8, 2, 1},
		{3_000_000, 8, 1, 1}, {3_000_000, 8, 2, 1},
		{2_900_000, 8, 1, 0.69}, {2_900_000, 4, 1, 0.69}, {2_900_000, 16, 2, 0.69},
	} {
		t.Run(sc.String(), func(t *testing.T) {
			m := measureMemory(t, sc)
			f, e := m.f, float64(m.f.entries)
			load := float64(f.chunks) * float64(tableSlotBytes) / float64(f.table)
			t.Logf("%.1f B/entry of heap: table %.1f (load %.2f), holders %.1f, LRU nodes %.1f, recent caches %.2f; structures %.1f",
				m.heap, float64(f.table)/e, load, float64(f.holders)/e, float64(f.nodes)/e, float64(f.recent)/e, float64(f.total())/e)
			if bound := perEntryBound(sc, shards); m.heap > bound {
				t.Errorf("%.1f B/entry of heap, above the %.1f the structures allow", m.heap, bound)
			}
			// The accounting explains the heap: nothing else of size grows with the entries.
			if d := math.Abs(m.heap - float64(f.total())/e); d > 1 {
				t.Errorf("heap %.1f B/entry, structures %.1f: %.1f B/entry unaccounted for", m.heap, float64(f.total())/e, d)
			}
			// What the tables, holders and caches leave of the heap is the LRU node slabs: never
			// more than 24 B per entry of capacity (a slab grown by append overshoots it by up
			// to a quarter, and keeps that for good), so exactly 24 B an entry once full.
			nodes := m.heap*e - float64(f.table+f.holders+f.recent)
			if limit := float64(nodeBytes*f.capacity+f.backends*largeAllocRounding) + 0.5*e; nodes > limit {
				t.Errorf("LRU node slabs take %.1f B/entry, above 24 B per entry of capacity (%.1f B/entry)", nodes/e, limit/e)
			}
		})
	}
}
