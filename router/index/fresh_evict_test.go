package index

import (
	"fmt"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// TestFreshPrefixSurvivesItsOwnSuffix: a held prefix fresh enough to be left untouched must
// not be evicted by the claims of its own Record's new suffix. The backend's older entries
// run out during a burst (one entry an hour old gives a long LRU horizon, so the prefix
// touched 3 ms ago is fresh), the suffix's claims reach the prefix, and the Record must then
// hold its whole prompt, as a full Record does. Suffixes below and above the batch threshold.
func TestFreshPrefixSurvivesItsOwnSuffix(t *testing.T) {
	for _, n := range []int{seqChunks - 28, 2*seqChunks + 34} {
		t.Run(fmt.Sprintf("suffix=%d", n), func(t *testing.T) {
			const capacity, prefix = 300, 10
			b := newBackend(t, "a", capacity*64)
			x := newIndex(Options{ChunkTokens: 64, MaxEntries: -1}, defaultShards)
			x.SetBackends([]*backend.Backend{b})
			now := t0.Add(time.Hour)
			x.Record(chain(9, 1), b, t0) // the old entry
			p := chain(1, prefix)
			x.Record(p, b, now.Add(-4*time.Millisecond))
			x.Record(p, b, now.Add(-3*time.Millisecond)) // confirmed, 3 ms ago: fresh
			x.Record(chain(2, capacity-prefix-1), b, now.Add(-2*time.Millisecond))
			prompt := append(append([]uint64{}, p...), chain(3, n)...)
			x.RecordHeld(prompt, b, now, prefix)
			check(t, x)
			if got := match(x, prompt, b)[0]; got != len(prompt) {
				t.Fatalf("just recorded %d chunks (%d held, fresh), Match finds %d", len(prompt), prefix, got)
			}
		})
	}
}

// TestFreshPrefixOlderShallowPart: a held prefix whose deeper half was touched after its
// shallow half (by a Record with a shorter held hint) is skipped as fresh; the new suffix's
// claims then evict the shallow half, which its deepest chunk, still held, does not show. The
// Record must leave its whole (cut) prompt held, as a full Record does: with fine chunks, and
// with one coarse chunk that evicts several entries at once.
func TestFreshPrefixOlderShallowPart(t *testing.T) {
	for _, coarse := range []bool{false, true} {
		w := 1
		if coarse {
			w = 8
		}
		mk := func(seed uint64, n int) []uint64 {
			p := chain(seed, n)
			for i := range p {
				p[i] <<= 1 // fine
				if coarse && seed == 4 {
					p[i] |= 1 // Y coarse
				}
			}
			return p
		}
		capacity, ycount, olds := 16, 6, 1
		if coarse {
			capacity, ycount, olds = 18, 1, 3 // one coarse chunk of weight 8 evicts E (3) and P4..P0
		}
		b := newBackend(t, "a", int64(capacity)*64)
		x := newIndex(Options{ChunkTokens: 64, MaxEntries: -1, CoarseWeight: w}, defaultShards)
		x.SetBackends([]*backend.Backend{b})
		now := t0.Add(time.Hour)
		x.Record(mk(9, olds), b, t0) // E: old
		P := mk(1, 10)
		x.Record(P, b, now.Add(-4*time.Millisecond))
		x.Record(P, b, now.Add(-3*time.Millisecond))
		Q := append(append([]uint64{}, P...), mk(2, 5)...)
		x.RecordHeld(Q, b, now.Add(-2*time.Millisecond), 5) // hint 5: P[5:] touched, P[:5] left
		check(t, x)
		R := append(append([]uint64{}, P...), mk(4, ycount)...)
		x.RecordHeld(R, b, now, 10)
		check(t, x)
		s := x.tab.Load().byID[b.ID]
		s.mu.Lock()
		cut := s.fit(R, s.limit())
		s.mu.Unlock()
		if got := match(x, R, b)[0]; got != cut {
			t.Errorf("coarse=%v: just recorded %d chunks (held 10, fresh), Match finds %d; P alone matches %d", coarse, cut, got, match(x, P, b)[0])
		}
	}
}

// stampOf is the stamp of b's entry for h (0: b does not hold h).
func stampOf(x *Index, b *backend.Backend, h uint64) int64 {
	s := x.tab.Load().byID[b.ID]
	s.mu.Lock()
	defer s.mu.Unlock()
	ni := x.shard(norm(h)).lookup(norm(h), s.num)
	if ni == nilIdx {
		return 0
	}
	return s.nodes[ni].used &^ added
}

// TestFreshPrefixSkipAtCapacity: at capacity every Record evicts. A Record whose held prefix
// is fresh (chunks 0 and held-1 touched within the window) and whose claims evict only other
// entries leaves the prefix as it is; one whose claims evict more than the log holds, or a
// prefix whose chunk 0 is not fresh (a conversation whose turns extend it faster than the
// window), walks it in full.
func TestFreshPrefixSkipAtCapacity(t *testing.T) {
	const capacity, prefix = 3000, 10
	now := t0.Add(time.Hour)
	setup := func(t *testing.T) (*Index, *backend.Backend, []uint64) {
		b := newBackend(t, "a", capacity*64)
		x := newIndex(Options{ChunkTokens: 64, MaxEntries: -1}, defaultShards)
		x.SetBackends([]*backend.Backend{b})
		x.Record(chain(9, capacity-prefix), b, t0) // old entries, an hour old: a long horizon
		p := chain(1, prefix)
		x.Record(p, b, now.Add(-4*time.Millisecond))
		x.Record(p, b, now.Add(-3*time.Millisecond)) // confirmed, 3 ms ago: fresh
		return x, b, p
	}
	for _, c := range []struct {
		name    string
		suffix  int
		touched bool // the prefix walked again (stamped now)
	}{
		{"a few claims evict old entries: skipped", 16, false},
		{"more claims than the log holds: walked", evictLogMax + 8, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, b, p := setup(t)
			before := stampOf(x, b, p[0])
			prompt := append(append([]uint64{}, p...), chain(3, c.suffix)...)
			x.RecordHeld(prompt, b, now, prefix)
			check(t, x)
			if got := match(x, prompt, b)[0]; got != len(prompt) {
				t.Fatalf("Match finds %d of %d chunks", got, len(prompt))
			}
			if walked := stampOf(x, b, p[0]) != before; walked != c.touched {
				t.Fatalf("prefix walked again: %v, want %v", walked, c.touched)
			}
		})
	}
	t.Run("chunk 0 stale, chunk held-1 fresh: walked", func(t *testing.T) {
		// Requests that share p to different depths: one held to chunk 4 touches p[5:] only,
		// so p[9] is fresh while p[0] ages; the next, held to p[9], must walk p in full.
		x, b, p := setup(t)
		x.RecordHeld(p, b, now.Add(10*time.Millisecond), 5) // p[0] and p[4] 13 ms old: p[5:] touched
		if got := stampOf(x, b, p[0]); got >= now.UnixNano() {
			t.Fatalf("held to chunk 4, p[0] fresh: touched anyway (%d)", got)
		}
		at := now.Add(55 * time.Millisecond) // p[9] 45 ms old, fresh; p[0] 58 ms old, stale
		x.RecordHeld(p, b, at, prefix)
		check(t, x)
		if got := stampOf(x, b, p[0]); got < at.UnixNano() {
			t.Fatalf("p[0] stamped %d, before the Record at %d: its stale first chunk was skipped", got, at.UnixNano())
		}
	})
}
