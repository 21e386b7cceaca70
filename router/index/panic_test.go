package index

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// TestPanicReleasesLocks breaks the index on purpose (every shard's holder slab emptied, so
// that any walk of a holder list panics with an index out of range) and checks, for each
// operation that walks holders under a shard lock, that the panic leaves no shard and no
// backend locked: the proxy contains a panic as one failed request, and a lock left held
// would instead stall every later request on that shard. Locks are probed with TryLock,
// which fails at once on a held lock.
func TestPanicReleasesLocks(t *testing.T) {
	long := chain(1, 3*seqChunks)  // batched lookups (batch.go)
	short := chain(2, seqChunks/2) // one lookup at a time
	for _, c := range []struct {
		name string
		op   func(x *Index, bs []*backend.Backend)
	}{
		{"record long prompt", func(x *Index, bs []*backend.Backend) { x.Record(long, bs[0], t0) }},
		{"record short prompt", func(x *Index, bs []*backend.Backend) { x.Record(short, bs[0], t0) }},
		{"record held hint", func(x *Index, bs []*backend.Backend) {
			x.RecordHeld(append(slices.Clone(long), 99), bs[0], t0.Add(time.Second), len(long))
		}},
		{"forget", func(x *Index, bs []*backend.Backend) { x.Forget(long, bs[0], Stamp(t0.UnixNano())) }},
		{"match by list", func(x *Index, bs []*backend.Backend) { x.Match(long, bs[len(bs)-1:], make([]int, 1)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			const nb = maskSlots + 2 // the last ones are matched through holder lists
			bs := make([]*backend.Backend, nb)
			for i := range bs {
				bs[i] = newBackend(t, fmt.Sprintf("b%d", i), 1<<20)
			}
			x := New(Options{ChunkTokens: 64})
			x.SetBackends(bs)
			for _, b := range bs {
				x.Record(long, b, t0)
				x.Record(short, b, t0)
			}
			saved := make([][][]holder, len(x.shards))
			for i := range x.shards {
				saved[i] = x.shards[i].hs.pages
				x.shards[i].hs.pages = nil
			}
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				c.op(x, bs)
				return false
			}()
			for i := range x.shards {
				x.shards[i].hs.pages = saved[i]
			}
			if !panicked {
				t.Fatal("the broken index did not panic: the test does not reach a holder walk")
			}
			for i := range x.shards {
				if !x.shards[i].mu.TryLock() {
					t.Fatalf("shard %d left locked by the panic", i)
				}
				x.shards[i].mu.Unlock()
			}
			for _, s := range x.tab.Load().byID {
				if !s.mu.TryLock() {
					t.Fatalf("backend %s left locked by the panic", s.name)
				}
				s.mu.Unlock()
			}
		})
	}
}
