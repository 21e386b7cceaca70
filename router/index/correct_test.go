package index

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// tenPrompts records ten 4-chunk prompts p0..p9 on each of bs, one millisecond apart (p0
// oldest), and returns them.
func tenPrompts(x *Index, bs ...*backend.Backend) [][]uint64 {
	ps := make([][]uint64, 10)
	for i := range ps {
		ps[i] = chain(uint64(i+1), 4)
		for _, b := range bs {
			x.Record(ps[i], b, t0.Add(time.Duration(i)*time.Millisecond))
		}
	}
	return ps
}

// TestCorrect: B held ten 4-chunk prompts p0..p9 (oldest first) as far as the index knew,
// and so did A. A request matched p3 on B (4 chunks) and B reported it had lost all of it.
// Correct drops B's entries last used before p3 was (p0..p2: B evicted them first), keeps
// p3 (B just computed it again), lowers B's capacity to what is left less the 4 lost
// chunks, which trims the least recently used prompt left (p4), and leaves A alone.
func TestCorrect(t *testing.T) {
	x := New(Options{ChunkTokens: 64})
	a, b := newBackend(t, "a", 64*1000), newBackend(t, "b", 64*1000)
	x.SetBackends([]*backend.Backend{a, b})
	ps := tenPrompts(x, a, b)
	st := x.RecordHeld(ps[3], b, t0.Add(time.Second), 4)
	if n := x.Correct(b, st, 4); n != 16 {
		t.Fatalf("Correct dropped %d entries, want 16 (p0..p2 older, p4 trimmed)", n)
	}
	check(t, x)
	for i, p := range ps {
		want := 4
		if i < 3 || i == 4 {
			want = 0
		}
		if got := match(x, p, a, b); got[0] != 4 || got[1] != want {
			t.Errorf("p%d: A holds %d, B %d; want 4, %d", i, got[0], got[1], want)
		}
	}
	sb := stat(x, b)
	if sb.Entries != 24 || sb.Capacity != 24 || sb.Corrections != 1 || sb.CorrectedEntries != 16 || sb.CorrectedTokens != 16*64 || sb.Evictions != 0 {
		t.Errorf("B's stats %+v: want 24 entries at capacity 24, 1 correction of 16 entries (1024 tokens), no evictions", sb)
	}
	if sa := stat(x, a); sa.Entries != 40 || sa.Capacity != 1000 || sa.Corrections != 0 {
		t.Errorf("A's stats %+v: want untouched (40 entries, capacity 1000)", sa)
	}
	// B now evicts at its learned capacity: a new prompt pushes out p5, the oldest.
	x.Record(chain(99, 4), b, t0.Add(2*time.Second))
	if got := match(x, ps[5], b); got[0] != 0 || stat(x, b).Entries != 24 {
		t.Errorf("after a new prompt B holds %d of p5 and %d entries, want 0 and 24", got[0], stat(x, b).Entries)
	}
	check(t, x)
}

// TestCorrectCases: what a correction may not do, and when it does less.
func TestCorrectCases(t *testing.T) {
	tests := []struct {
		name    string
		run     func(x *Index, b *backend.Backend, ps [][]uint64) int
		dropped int
		entries int64
		limit   int64
	}{
		{"no shortfall", func(x *Index, b *backend.Backend, ps [][]uint64) int {
			return x.Correct(b, x.RecordHeld(ps[3], b, t0.Add(time.Second), 4), 0)
		}, 0, 40, 1000},
		{"no stamp", func(x *Index, b *backend.Backend, ps [][]uint64) int {
			return x.Correct(b, 0, 4)
		}, 0, 40, 1000},
		{"a restart since the Record", func(x *Index, b *backend.Backend, ps [][]uint64) int {
			st := x.RecordHeld(ps[3], b, t0.Add(time.Second), 4)
			b.ResetCache()
			return x.Correct(b, st, 4)
		}, 0, 40, 1000},
		{"prior gone: the shortfall alone", func(x *Index, b *backend.Backend, ps [][]uint64) int {
			// A Record without a held prefix remembers no prior: only the 4 lost chunks go,
			// the least recently used (p0).
			return x.Correct(b, x.RecordHeld(ps[3], b, t0.Add(time.Second), 0), 4)
		}, 4, 36, 36},
		{"partial shortfall", func(x *Index, b *backend.Backend, ps [][]uint64) int {
			// B kept 2 of p5's 4 chunks: p0..p4 go (older), then 2 more (p6's deepest two).
			return x.Correct(b, x.RecordHeld(ps[5], b, t0.Add(time.Second), 4), 2)
		}, 22, 18, 18},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := New(Options{ChunkTokens: 64})
			b := newBackend(t, "b", 64*1000)
			x.SetBackends([]*backend.Backend{b})
			ps := tenPrompts(x, b)
			if got := tc.run(x, b, ps); got != tc.dropped {
				t.Errorf("dropped %d, want %d", got, tc.dropped)
			}
			if s := stat(x, b); b.Epoch() == 0 && (s.Entries != tc.entries || s.Capacity != tc.limit) {
				t.Errorf("%d entries, capacity %d; want %d, %d", s.Entries, s.Capacity, tc.entries, tc.limit)
			}
			check(t, x)
		})
	}
}

// TestCorrectRegrowsAndResets: a learned capacity grows back one chunk per regrowEvery
// entries evicted for it, and a restart (epoch) forgets it.
func TestCorrectRegrowsAndResets(t *testing.T) {
	x := New(Options{ChunkTokens: 64})
	b := newBackend(t, "b", 64*1000)
	x.SetBackends([]*backend.Backend{b})
	ps := tenPrompts(x, b)
	x.Correct(b, x.RecordHeld(ps[3], b, t0.Add(time.Second), 4), 4)
	if c := stat(x, b).Capacity; c != 24 {
		t.Fatalf("capacity %d after the correction, want 24", c)
	}
	for i := range 3 * regrowEvery / 4 { // 3 × regrowEvery new chunks
		x.Record(chain(uint64(100+i), 4), b, t0.Add(2*time.Second+time.Duration(i)*time.Millisecond))
	}
	// Each chunk the capacity grows by is one not evicted: 48 new chunks, 46 evictions.
	s := stat(x, b)
	if s.Capacity != 26 || s.Evictions != 3*regrowEvery-2 || s.Entries != 26 {
		t.Errorf("after %d new chunks: capacity %d, %d entries, %d evictions; want 26 (grown by 2), 26, %d",
			3*regrowEvery, s.Capacity, s.Entries, s.Evictions, 3*regrowEvery-2)
	}
	b.ResetCache()
	x.Record(ps[0], b, t0.Add(3*time.Second))
	if s := stat(x, b); s.Capacity != 1000 || s.Entries != 4 {
		t.Errorf("after a restart: capacity %d, %d entries; want 1000, 4", s.Capacity, s.Entries)
	}
	check(t, x)
}

// BenchmarkCorrect: a backend's Record of a held 16-chunk prompt (64 prompts in turn, all
// within its capacity) followed by the correction of a report that lost half of it. Each
// correction lowers the capacity and drops the 8 least recently used entries; the learned
// capacity is then forgotten (as after a restart, without the purge) so that every iteration
// corrects the same steady state. Allocation-free after the first round.
func BenchmarkCorrect(b *testing.B) {
	const prompts, chunks = 64, 16
	x := New(Options{ChunkTokens: 64})
	be := newBackend(b, "b", 64*prompts*chunks)
	x.SetBackends([]*backend.Backend{be})
	ps := make([][]uint64, prompts)
	for i := range ps {
		ps[i] = chain(uint64(i+1), chunks)
		x.Record(ps[i], be, t0)
	}
	s := x.tab.Load().byID[be.ID]
	dropped := 0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		st := x.RecordHeld(ps[i%prompts], be, t0, chunks)
		dropped += x.Correct(be, st, chunks/2)
		s.mu.Lock()
		s.forgetLearned()
		s.mu.Unlock()
	}
	b.ReportMetric(float64(dropped)/float64(b.N), "dropped/op")
}
