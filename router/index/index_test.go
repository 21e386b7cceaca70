package index

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newBackend(t testing.TB, name string, kvTokens int64) *backend.Backend {
	t.Helper()
	b, err := backend.New("http://"+name+":8000", kvTokens, 1)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chain returns n chained "hashes" of a prompt: distinct per (seed, i) and, like the real
// chain, a prompt that shares the seed shares every earlier chunk.
func chain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = seed*1_000_003 + uint64(i) + 1
	}
	return out
}

func match(x *Index, chunks []uint64, bs ...*backend.Backend) []int {
	out := make([]int, len(bs))
	x.Match(chunks, bs, out)
	return out
}

func stat(x *Index, b *backend.Backend) BackendStats {
	for _, s := range x.Stats(nil) {
		if s.Name == b.Name {
			return s
		}
	}
	return BackendStats{}
}

// evictions is the number of entries evicted for capacity over all backends.
func evictions(x *Index) uint64 {
	var n uint64
	for _, s := range x.Stats(nil) {
		n += s.Evictions
	}
	return n
}

// oldest is the last use of b's least recently used entry (zero when b holds none).
func oldest(x *Index, b *backend.Backend) time.Time {
	s := x.tab.Load().byID[b.ID]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tail == nilIdx {
		return time.Time{}
	}
	return time.Unix(0, s.nodes[s.tail].used&^added)
}

// check verifies the index's internal invariants: every LRU node has exactly its holder in
// the shards and nothing else is there; no backend is over capacity.
func check(t *testing.T, x *Index) {
	t.Helper()
	total := int64(0) // nodes
	for _, s := range x.tab.Load().byID {
		s.mu.Lock()
		n, nodes := int64(0), int64(0) // their weight, their number
		prev := int32(nilIdx)
		for ni := s.head; ni != nilIdx; ni = s.nodes[ni].next {
			if s.nodes[ni].prev != prev {
				t.Fatalf("%s: broken back link at node %d", s.name, ni)
			}
			prev = ni
			sh := x.shard(s.nodes[ni].hash)
			sh.mu.RLock()
			got := sh.find(s.nodes[ni].hash, s.num)
			sh.mu.RUnlock()
			if got != ni {
				t.Fatalf("%s: node %d of chunk %d has holder node %d", s.name, ni, s.nodes[ni].hash, got)
			}
			n += s.weight(s.nodes[ni].hash)
			nodes++
		}
		if prev != s.tail {
			t.Fatalf("%s: tail %d, last node %d", s.name, s.tail, prev)
		}
		if n != s.count.Load() {
			t.Fatalf("%s: list's nodes weigh %d, count says %d", s.name, n, s.count.Load())
		}
		if c := s.limit(); n > c {
			t.Fatalf("%s: %d entries over capacity %d", s.name, n, c)
		}
		s.mu.Unlock()
		total += nodes
	}
	holders := int64(0)
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		for _, c := range sh.chunks.slots {
			if c.key == 0 {
				continue
			}
			var mask uint32
			sh.each(&c, func(num uint16, _ int32) bool {
				if num < maskSlots {
					mask |= 1 << num
				}
				holders++
				return true
			})
			if _, _, ok := c.inline(); ok && bits.OnesCount32(c.mask) != 1 {
				t.Fatalf("chunk %d: inline holder, mask %b", c.key, c.mask)
			}
			if mask != c.mask || c.head == nilIdx {
				t.Fatalf("chunk %d: mask %b, holders say %b, head %d", c.key, c.mask, mask, c.head)
			}
			if sh.chunks.get(c.key) == nil {
				t.Fatalf("chunk %d in the table but not found", c.key)
			}
		}
		sh.mu.RUnlock()
	}
	if holders != total {
		t.Fatalf("%d holders in shards, %d entries in LRU lists", holders, total)
	}
}

func TestMatchLeadingRun(t *testing.T) {
	a, b, c := newBackend(t, "a", 1<<20), newBackend(t, "b", 1<<20), newBackend(t, "c", 1<<20)
	x := New(Options{ChunkTokens: 64})
	x.SetBackends([]*backend.Backend{a, b, c})
	p := chain(1, 6)
	x.Record(p[:4], a, t0)
	x.Record(p[:2], b, t0)
	x.Record([]uint64{p[0], p[2], p[3]}, c, t0) // a hole at chunk 1
	tests := []struct {
		q    []uint64
		want []int
	}{
		{p, []int{4, 2, 1}},
		{p[:3], []int{3, 2, 1}},
		{chain(2, 3), []int{0, 0, 0}},
		{nil, []int{0, 0, 0}},
	}
	for _, tt := range tests {
		got := match(x, tt.q, a, b, c)
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("Match(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	// Only the candidates count, in their order.
	if got := match(x, p, c, a); fmt.Sprint(got) != "[1 4]" {
		t.Errorf("Match(c, a) = %v, want [1 4]", got)
	}
	check(t, x)
}

// More backends than the chunk mask (32) covers: Match falls back to the holder lists.
func TestMatchWide(t *testing.T) {
	bs := make([]*backend.Backend, 70)
	for i := range bs {
		bs[i] = newBackend(t, fmt.Sprintf("b%d", i), 1<<20)
	}
	x := New(Options{})
	x.SetBackends(bs)
	p := chain(1, 5)
	x.Record(p[:3], bs[0], t0)
	x.Record(p, bs[69], t0)
	x.Record(p[:1], bs[40], t0)
	if got := match(x, p, bs[69], bs[0], bs[40], bs[1]); fmt.Sprint(got) != "[5 3 1 0]" {
		t.Errorf("Match = %v, want [5 3 1 0]", got)
	}
	out := make([]int, len(bs))
	if best := x.Match(p, bs, out); best != 5 || out[69] != 5 || out[0] != 3 {
		t.Errorf("Match over all 70: best %d, out[69] %d, out[0] %d; want 5, 5, 3", best, out[69], out[0])
	}
	check(t, x)
}

func TestUnregisteredIgnored(t *testing.T) {
	a, b := newBackend(t, "a", 1<<20), newBackend(t, "b", 1<<20)
	x := New(Options{})
	x.SetBackends([]*backend.Backend{a})
	x.Record(chain(1, 3), b, t0)
	if got := match(x, chain(1, 3), a, b); fmt.Sprint(got) != "[0 0]" {
		t.Errorf("Match = %v, want [0 0]", got)
	}
	if x.Entries() != 0 {
		t.Errorf("Entries = %d, want 0", x.Entries())
	}
}

func TestLRUOrder(t *testing.T) {
	a := newBackend(t, "a", 4*64) // capacity 4 chunks
	x := New(Options{ChunkTokens: 64})
	x.SetBackends([]*backend.Backend{a})
	p1, p2, p3 := chain(1, 2), chain(2, 2), chain(3, 2)
	x.Record(p1, a, t0)
	x.Record(p2, a, t0.Add(time.Second))
	x.Record(p1, a, t0.Add(2*time.Second)) // p1 is now the most recent
	x.Record(p3, a, t0.Add(3*time.Second)) // evicts p2
	for _, tt := range []struct {
		name string
		p    []uint64
		want int
	}{{"p1", p1, 2}, {"p2", p2, 0}, {"p3", p3, 2}} {
		if got := match(x, tt.p, a)[0]; got != tt.want {
			t.Errorf("%s matched %d, want %d", tt.name, got, tt.want)
		}
	}
	st := stat(x, a)
	if st.Entries != 4 || st.Evictions != 2 || st.Capacity != 4 {
		t.Errorf("stats = %+v, want 4 entries, 2 evictions, capacity 4", st)
	}
	if got := oldest(x, a); !got.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("oldest entry last used %v, want %v", got, t0.Add(2*time.Second))
	}
	check(t, x)
}

func TestDeepestFirst(t *testing.T) {
	a := newBackend(t, "a", 5*64)
	x := New(Options{ChunkTokens: 64})
	x.SetBackends([]*backend.Backend{a})
	p := chain(1, 4)
	x.Record(p, a, t0)
	x.Record(chain(2, 2), a, t0) // same instant: one entry of p must go, its deepest
	if got := match(x, p, a)[0]; got != 3 {
		t.Errorf("after one eviction p matched %d, want 3", got)
	}
	x.Record(chain(3, 1), a, t0)
	if got := match(x, p, a)[0]; got != 2 {
		t.Errorf("after two evictions p matched %d, want 2", got)
	}
	// A prompt longer than the capacity keeps its first chunks.
	long := chain(4, 12)
	x.Record(long, a, t0.Add(time.Second))
	if got := match(x, long, a)[0]; got != 5 {
		t.Errorf("12-chunk prompt over capacity 5 matched %d, want 5", got)
	}
	check(t, x)
}

func TestEpochDropsEntries(t *testing.T) {
	a, b := newBackend(t, "a", 1<<20), newBackend(t, "b", 1<<20)
	x := New(Options{})
	x.SetBackends([]*backend.Backend{a, b})
	p := chain(1, 8)
	x.Record(p, a, t0)
	x.Record(p[:3], b, t0)
	a.ResetCache()
	if got := match(x, p, a, b); fmt.Sprint(got) != "[0 3]" {
		t.Errorf("right after restart Match = %v, want [0 3]", got)
	}
	x.Record(chain(2, 2), a, t0) // frees the stale entries
	if st := stat(x, a); st.Entries != 2 {
		t.Errorf("entries after restart and one record = %d, want 2", st.Entries)
	}
	if got := match(x, p, a, b); fmt.Sprint(got) != "[0 3]" {
		t.Errorf("Match = %v, want [0 3]", got)
	}
	// SetBackends also frees the entries of a backend whose epoch moved.
	b.ResetCache()
	x.SetBackends([]*backend.Backend{a, b})
	if st := stat(x, b); st.Entries != 0 {
		t.Errorf("b entries after restart and SetBackends = %d, want 0", st.Entries)
	}
	x.Record(p, b, t0)
	if got := match(x, p, a, b); fmt.Sprint(got) != "[0 8]" {
		t.Errorf("Match = %v, want [0 8]", got)
	}
	check(t, x)
}

func TestRemoveBackend(t *testing.T) {
	a, b, c := newBackend(t, "a", 1<<20), newBackend(t, "b", 1<<20), newBackend(t, "c", 1<<20)
	x := New(Options{})
	x.SetBackends([]*backend.Backend{a, b})
	p := chain(1, 8)
	x.Record(p, a, t0)
	x.Record(p[:2], b, t0)
	x.SetBackends([]*backend.Backend{b, c}) // a removed; c takes its slot number
	x.Record(p[:5], c, t0)
	if got := match(x, p, a, b, c); fmt.Sprint(got) != "[0 2 5]" {
		t.Errorf("after removal Match = %v, want [0 2 5]", got)
	}
	x.SetBackends([]*backend.Backend{a, b, c}) // back, but empty
	if got := match(x, p, a, b, c); fmt.Sprint(got) != "[0 2 5]" {
		t.Errorf("after return Match = %v, want [0 2 5]", got)
	}
	x.SetBackends([]*backend.Backend{a, b}) // c removed
	if got := match(x, p, a, b, c); fmt.Sprint(got) != "[0 2 0]" {
		t.Errorf("after c's removal Match = %v, want [0 2 0]", got)
	}
	if x.Entries() != 2 || x.Chunks() != 2 {
		t.Errorf("Entries, Chunks = %d, %d; want 2, 2", x.Entries(), x.Chunks())
	}
	check(t, x)
}

func TestGlobalCap(t *testing.T) {
	bs := []*backend.Backend{newBackend(t, "a", 50*64), newBackend(t, "b", 50*64), newBackend(t, "c", 100*64)}
	x := New(Options{ChunkTokens: 64, MaxEntries: 100})
	x.SetBackends(bs)
	want := map[string]int64{bs[0].Name: 25, bs[1].Name: 25, bs[2].Name: 50}
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 2000 {
		x.Record(chain(uint64(i), 1+rng.IntN(6)), bs[i%3], t0)
	}
	if n := x.Entries(); n > 100 {
		t.Errorf("Entries = %d over the global cap 100", n)
	}
	for _, s := range x.Stats(nil) {
		if s.Capacity != want[s.Name] || s.Entries != s.Capacity {
			t.Errorf("%s: capacity %d entries %d, want both %d", s.Name, s.Capacity, s.Entries, want[s.Name])
		}
	}
	// A fourth backend lowers everyone's share at once.
	d := newBackend(t, "d", 100*64)
	x.SetBackends(append(bs, d))
	if n := x.Entries(); n > 100 {
		t.Errorf("after adding a backend Entries = %d over the cap", n)
	}
	check(t, x)
}

// TestCapacityUnderMillionInserts records 1M prompts of shared-prefix shape over 8 backends
// and checks capacities and internal consistency; it also reports the memory per entry.
func TestCapacityUnderMillionInserts(t *testing.T) {
	if testing.Short() {
		t.Skip("1M inserts")
	}
	const nb = 8
	bs := make([]*backend.Backend, nb)
	for i := range bs {
		bs[i] = newBackend(t, fmt.Sprintf("b%d", i), int64(5000+1000*i)*64)
	}
	x := New(Options{ChunkTokens: 64})
	x.SetBackends(bs)
	rng := rand.New(rand.NewPCG(2, 2))
	inserts := 0
	for inserts < 1_000_000 {
		// 200 system prompts of 8 chunks, then a random tail.
		sys := chain(uint64(rng.IntN(200)), 8)
		p := append(sys, chain(rng.Uint64()>>20, 1+rng.IntN(24))...)
		x.Record(p, bs[rng.IntN(nb)], t0.Add(time.Duration(inserts)))
		inserts += len(p)
	}
	for _, s := range x.Stats(nil) {
		if s.Entries > s.Capacity {
			t.Errorf("%s: %d entries over capacity %d", s.Name, s.Entries, s.Capacity)
		}
		if s.Evictions == 0 {
			t.Errorf("%s: no evictions after 1M inserts", s.Name)
		}
	}
	check(t, x)
}

func TestConcurrent(t *testing.T) {
	for _, c := range []struct {
		name              string
		chunks, capacity  int // prompt length at most, backend capacity
		shards, iteration int
	}{
		{"short", 20, 300, 4, 3000},
		{"long", 1200, 2000, defaultShards, 150}, // batched (batch.go), evicting
	} {
		t.Run(c.name, func(t *testing.T) { testConcurrent(t, c.chunks, c.capacity, c.shards, c.iteration) })
	}
}

// testConcurrent runs 8 goroutines of random Records, Corrects, Forgets, Matches, restarts
// and backend removals on one index, then checks its invariants.
func testConcurrent(t *testing.T, maxChunks, capacity, shards, iterations int) {
	const nb = 6
	bs := make([]*backend.Backend, nb)
	for i := range bs {
		bs[i] = newBackend(t, fmt.Sprintf("b%d", i), int64(capacity)*64)
	}
	x := newIndex(Options{ChunkTokens: 64}, shards)
	x.SetBackends(bs)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			out := make([]int, nb)
			for i := range iterations {
				p := chain(uint64(rng.IntN(50)), 1+rng.IntN(maxChunks))
				switch r := rng.IntN(100); {
				case r < 38:
					x.RecordHeld(p, bs[rng.IntN(nb)], t0.Add(time.Duration(i)*time.Millisecond), rng.IntN(len(p)+1))
				case r < 42:
					b, held := bs[rng.IntN(nb)], rng.IntN(len(p)+1)
					x.Correct(b, x.RecordHeld(p, b, t0.Add(time.Duration(i)*time.Millisecond), held), 1+rng.IntN(len(p)))
				case r < 45:
					b := bs[rng.IntN(nb)]
					x.Forget(p[rng.IntN(len(p)):], b, x.Record(p, b, t0.Add(time.Duration(i))))
				case r < 97:
					x.Match(p, bs, out)
					for j, m := range out {
						if m > len(p) {
							t.Errorf("backend %d matched %d of %d chunks", j, m, len(p))
						}
					}
				case r < 99:
					bs[rng.IntN(nb)].ResetCache()
				default:
					k := rng.IntN(nb)
					x.SetBackends(append(append([]*backend.Backend(nil), bs[:k]...), bs[k+1:]...))
					x.SetBackends(bs)
				}
			}
		})
	}
	wg.Wait()
	check(t, x)
}

// TestMemoryPerEntry fills 1M (chunk, backend) entries, then replaces all of them through
// LRU eviction, and measures the heap they take: churn must not grow the index.
func TestMemoryPerEntry(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("2M inserts measured for memory: run without -short and -race")
	}
	for _, holders := range []int{1, 2} {
		m := fillMillion(t, holders)
		t.Logf("1M entries, %d backend(s) per chunk: %.1f bytes/entry after fill, %.1f after 1M evictions; Go Sys %.0f MiB, VmRSS %.0f MiB",
			holders, m.fill, m.churn, m.sys/(1<<20), m.rss/(1<<20))
		if m.fill > 100 || m.churn > 100 {
			t.Errorf("%d holder(s): %.1f / %.1f bytes per entry, want ≤ 100", holders, m.fill, m.churn)
		}
	}
}

type memUse struct{ fill, churn, sys, rss float64 }

// fillMillion records 1M entries over 8 backends of 125k chunks, each chunk on holders
// backends (as a shared prefix is), measures, then records 1M more (all evictions) and
// measures again. Heap figures are bytes per entry; sys and rss are process-wide bytes.
func fillMillion(tb testing.TB, holders int) memUse {
	const nb, perBackend, promptChunks = 8, 125_000, 25
	var ms runtime.MemStats
	x, bs, base, heap := memSetup(tb, nb, perBackend, &ms)
	prompts := nb * perBackend / promptChunks / holders
	record := func(from int) {
		for p := from; p < from+prompts; p++ {
			c := chain(uint64(p), promptChunks)
			for h := range holders {
				x.Record(c, bs[(p+h)%nb], t0)
			}
		}
	}
	record(0)
	var m memUse
	if n := x.Entries(); n != nb*perBackend {
		tb.Fatalf("entries = %d, want %d", n, nb*perBackend)
	}
	m.fill = (heap() - base) / float64(x.Entries())
	record(prompts)
	if ev := evictions(x); ev != nb*perBackend {
		tb.Fatalf("evictions = %d, want %d", ev, nb*perBackend)
	}
	m.churn = (heap() - base) / float64(x.Entries())
	m.sys = float64(ms.Sys)
	m.rss = vmRSS()
	runtime.KeepAlive(x)
	return m
}

// vmRSS reads the process's resident set size from /proc (0 where there is none).
func vmRSS() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}

func BenchmarkMemory1M(b *testing.B) {
	for b.Loop() {
		m := fillMillion(b, 1)
		b.ReportMetric(m.fill, "bytes/entry")
		b.ReportMetric(m.churn, "bytes/entry-churned")
		b.ReportMetric(m.rss/(1<<20), "MiB-RSS")
	}
}

func benchIndex(b *testing.B, chunks int) (*Index, []*backend.Backend, [][]uint64) {
	bs := make([]*backend.Backend, 8)
	for i := range bs {
		bs[i] = newBackend(b, fmt.Sprintf("b%d", i), 400_000)
	}
	x := New(Options{ChunkTokens: 64})
	x.SetBackends(bs)
	ps := make([][]uint64, 64)
	for i := range ps {
		ps[i] = append(chain(0, chunks/2), chain(uint64(i+1), chunks-chunks/2)...)
		x.Record(ps[i], bs[i%8], t0)
	}
	return x, bs, ps
}

func BenchmarkRecord(b *testing.B) {
	for _, n := range []int{4, 64, 512} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			x, bs, ps := benchIndex(b, n)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				x.Record(ps[i%len(ps)], bs[i%8], t0)
			}
		})
	}
}

func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{4, 64, 512} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			x, bs, ps := benchIndex(b, n)
			out := make([]int, len(bs))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				x.Match(ps[i%len(ps)], bs, out)
			}
		})
	}
}
