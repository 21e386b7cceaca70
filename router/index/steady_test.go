package index

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/splitmix"
)

// steady is the shape of a proxy relaying 16 KB chat bodies: prompts of 64 chunks, 48 of
// them one of 4 shared system prompts that every backend already holds and 16 new, over 4
// backends of the default KV capacity (6250 chunks), all at capacity, so that each Record
// touches 48 entries and adds 16, evicting 16. Hashes are random, as xxhash values are.
type steady struct {
	x      *Index
	bs     []*backend.Backend
	shared [4][]uint64
	prompt []uint64
	seq    uint64
	out    []int
}

const (
	steadyShared = 48
	steadyNew    = 16
	steadyChunks = steadyShared + steadyNew
)

func newSteady(tb testing.TB) *steady {
	st := &steady{prompt: make([]uint64, steadyChunks)}
	st.bs = make([]*backend.Backend, 4)
	for i := range st.bs {
		st.bs[i] = newBackend(tb, fmt.Sprintf("b%d", i), 0) // default KV capacity
	}
	st.out = make([]int, len(st.bs))
	st.x = New(Options{})
	st.x.SetBackends(st.bs)
	for p := range st.shared {
		st.shared[p] = make([]uint64, steadyShared)
		for i := range st.shared[p] {
			st.shared[p][i] = splitmix.Mix(uint64(p)<<32 | uint64(i) | 1<<63)
		}
	}
	// Fill every backend past its capacity, then churn a while more.
	capacity := stat(st.x, st.bs[0]).Capacity
	for range 4 * int(capacity) * len(st.bs) / steadyNew {
		st.record()
	}
	for _, s := range st.x.Stats(nil) {
		if s.Entries != s.Capacity || s.Evictions == 0 {
			tb.Fatalf("%s: %d entries of %d, %d evictions: not at steady state", s.Name, s.Entries, s.Capacity, s.Evictions)
		}
	}
	return st
}

// next makes the next prompt and returns its backend.
func (st *steady) next() *backend.Backend {
	st.seq++
	copy(st.prompt, st.shared[st.seq%4])
	for i := steadyShared; i < steadyChunks; i++ {
		st.prompt[i] = splitmix.Mix(st.seq<<8 | uint64(i))
	}
	// The backend moves independently of the shared prompt, so every backend holds all 4.
	return st.bs[splitmix.Mix(st.seq)%uint64(len(st.bs))]
}

func (st *steady) record() { st.x.Record(st.prompt, st.next(), t0) }

// BenchmarkRecordSteadyState is Record (and Match, as the proxy's Pick calls it first) on
// an index at capacity, in the shape of the proxy's 16 KB chat bodies (see steady);
// RecordHeld is the proxy's Learn, told that the shared prompt was matched; PeerRecord and
// PeerRecordNew are a peer's update of the same decision (the chunks past the shared prompt),
// recorded by Record for comparison and by RecordNew, as package peering records it.
func BenchmarkRecordSteadyState(b *testing.B) {
	for _, op := range []string{"Record", "Match", "MatchRecord", "RecordHeld", "PeerRecord", "PeerRecordNew"} {
		b.Run(op, func(b *testing.B) {
			st := newSteady(b)
			b.ReportAllocs()
			now := t0
			for b.Loop() {
				be := st.next()
				if op == "Match" || op == "MatchRecord" || op == "RecordHeld" {
					st.x.Match(st.prompt, st.bs, st.out)
				}
				switch now = now.Add(time.Microsecond); op {
				case "Record", "MatchRecord":
					st.x.Record(st.prompt, be, now)
				case "RecordHeld": // as the proxy learns: the shared prompt matched, and fresh
					st.x.RecordHeld(st.prompt, be, now, steadyShared)
				case "PeerRecord":
					st.x.Record(st.prompt[steadyShared:], be, now)
				case "PeerRecordNew":
					st.x.RecordNew(st.prompt[steadyShared:], be, now)
				}
			}
			chunks := steadyChunks // the chunks each operation walks
			if strings.HasPrefix(op, "Peer") {
				chunks = steadyChunks - steadyShared
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
		})
	}
}

// The steady-state shape keeps the invariants, and Match sees the shared prompt on every
// backend and the new chunks on the one that recorded them.
func TestSteadyState(t *testing.T) {
	st := newSteady(t)
	for range 1000 {
		be := st.next()
		st.x.Record(st.prompt, be, t0)
		if best := st.x.Match(st.prompt, st.bs, st.out); best != steadyChunks {
			t.Fatalf("Match after Record: best %d, want %d", best, steadyChunks)
		}
		for j, m := range st.out {
			if want := steadyShared; st.bs[j] == be {
				want = steadyChunks
				if m != want {
					t.Fatalf("backend %d matched %d, want %d", j, m, want)
				}
			} else if m < want {
				t.Fatalf("backend %d matched %d, want at least %d", j, m, want)
			}
		}
	}
	check(t, st.x)
}

// BenchmarkRecordAtCapacity is Record on a backend at capacity (every new chunk evicts one)
// in the shape of a coding agent's 1 MB prompts (3,400 chunks): a session's next step, whose
// last 200 chunks are new, and a session's first request, all new.
func BenchmarkRecordAtCapacity(b *testing.B) {
	const promptChunks, capacity = 3400, 50_000
	for _, c := range []struct {
		name string
		new  int
	}{{"step", 200}, {"first", promptChunks}} {
		b.Run(c.name, func(b *testing.B) {
			bk := newBackend(b, "b0", capacity*64)
			x := New(Options{ChunkTokens: 64})
			x.SetBackends([]*backend.Backend{bk})
			prompt := make([]uint64, promptChunks)
			seq := uint64(0)
			fill := func() {
				seq++
				for i := range prompt {
					if i >= promptChunks-c.new || seq == 1 {
						prompt[i] = splitmix.Mix(seq<<20 | uint64(i))
					}
				}
			}
			now := t0
			for x.Entries() < capacity { // at capacity before the timer starts
				fill()
				now = now.Add(time.Second)
				x.Record(prompt, bk, now)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				fill()
				now = now.Add(time.Second) // never fresh: every chunk is touched
				x.Record(prompt, bk, now)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*promptChunks), "ns/chunk")
		})
	}
}

// BenchmarkRecordNewAtCapacity is RecordNew as a peered replica's receiver calls it for a
// peer's 16 KB requests (bench overhead): groups of 16 new chunks on one of 2 backends at
// capacity (8 Mi tokens each, BenchKVCacheTokens: 131,072 chunks, so that the index is far
// larger than the CPU's caches), every chunk evicting one.
func BenchmarkRecordNewAtCapacity(b *testing.B) {
	const capacity = 8 << 20 / 64
	for _, group := range []int{16, 64} {
		b.Run(fmt.Sprintf("group%d", group), func(b *testing.B) {
			bs := []*backend.Backend{newBackend(b, "b0", capacity*64), newBackend(b, "b1", capacity*64)}
			x := New(Options{ChunkTokens: 64})
			x.SetBackends(bs)
			hs := make([]uint64, group)
			seq := uint64(0)
			now := t0
			next := func() *backend.Backend {
				seq++
				for i := range hs {
					hs[i] = splitmix.Mix(seq<<20 | uint64(i))
				}
				now = now.Add(time.Microsecond)
				return bs[seq%2]
			}
			for x.Entries() < 2*capacity {
				x.RecordNew(hs, next(), now)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				x.RecordNew(hs, next(), now)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*group), "ns/chunk")
		})
	}
}
