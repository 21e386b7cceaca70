package index

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

func TestForget(t *testing.T) {
	p := chain(1, 8)
	for _, tt := range []struct {
		name  string
		setup func(x *Index, a, b *backend.Backend) Stamp // returns the stamp to forget
		wantA int                                         // p's match on a after Forget(p, a, stamp)
		wantB int
	}{
		{"nothing held before: all forgotten", func(x *Index, a, _ *backend.Backend) Stamp {
			return x.Record(p, a, t0)
		}, 0, 0},
		{"held part stays", func(x *Index, a, _ *backend.Backend) Stamp {
			x.Record(p[:3], a, t0)
			return x.Record(p, a, t0.Add(time.Second))
		}, 3, 0},
		{"all held before: nothing forgotten", func(x *Index, a, _ *backend.Backend) Stamp {
			x.Record(p, a, t0)
			return x.Record(p, a, t0.Add(time.Second))
		}, 8, 0},
		{"another backend keeps its entries", func(x *Index, a, b *backend.Backend) Stamp {
			x.Record(p, b, t0)
			return x.Record(p, a, t0)
		}, 0, 8},
		{"touched since by another Record: kept", func(x *Index, a, _ *backend.Backend) Stamp {
			st := x.Record(p, a, t0)
			x.Record(p[:5], a, t0) // same instant: still a distinct stamp
			return st
		}, 5, 0},
		{"stale stamp of an older Record: nothing forgotten", func(x *Index, a, _ *backend.Backend) Stamp {
			st := x.Record(p, a, t0)
			x.Record(p, a, t0.Add(time.Second))
			return st
		}, 8, 0},
		{"zero stamp: nothing forgotten", func(x *Index, a, _ *backend.Backend) Stamp {
			x.Record(p, a, t0)
			return 0
		}, 8, 0},
		{"restarted since: nothing to forget", func(x *Index, a, _ *backend.Backend) Stamp {
			st := x.Record(p, a, t0)
			a.ResetCache()
			return st
		}, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newBackend(t, "a", 64*64), newBackend(t, "b", 64*64)
			x := New(Options{ChunkTokens: 64})
			x.SetBackends([]*backend.Backend{a, b})
			x.Forget(p, a, tt.setup(x, a, b))
			if got := match(x, p, a, b); got[0] != tt.wantA || got[1] != tt.wantB {
				t.Errorf("match a, b = %v, want [%d %d]", got, tt.wantA, tt.wantB)
			}
			check(t, x)
			// Freed nodes are reused: recording again fills a up to p's length.
			x.Record(p, a, t0.Add(2*time.Second))
			if got := match(x, p, a)[0]; got != 8 {
				t.Errorf("after recording again a matched %d, want 8", got)
			}
			check(t, x)
		})
	}
}

// usedOf returns when b's entry of chunk c was last touched (zero time if b lacks it).
func usedOf(x *Index, b *backend.Backend, c uint64) time.Time {
	s := x.tab.Load().byID[b.ID]
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := x.shard(norm(c))
	sh.mu.RLock()
	ni := sh.find(norm(c), s.num)
	sh.mu.RUnlock()
	if ni == nilIdx {
		return time.Time{}
	}
	return time.Unix(0, s.nodes[ni].used&^added)
}

func TestRecordHeldSkipsFreshPrefix(t *testing.T) {
	sys := chain(1, 8)                     // a shared system prompt
	p := append(sys[:8:8], chain(2, 4)...) // sys + a question (distinct hashes; chained in reality)
	for _, tt := range []struct {
		name        string
		prior       []uint64      // recorded at t0
		horizon     time.Duration // the LRU tail is this old at t0
		after       time.Duration // RecordHeld(p, held) at t0 + after
		held        int
		wantTouched bool // sys re-touched by the RecordHeld
		unconfirmed bool // prior was added at t0 and not touched since
	}{
		{"fresh shared prefix: left as it is", sys, time.Hour, 10 * time.Millisecond, 8, false, false},
		{"older than the window: touched", sys, time.Hour, 80 * time.Millisecond, 8, true, false},
		{"no hint: touched", sys, time.Hour, 10 * time.Millisecond, 0, true, false},
		{"stale hint (prefix not held): recorded", nil, time.Hour, 10 * time.Millisecond, 8, true, false},
		{"hint past the prompt: recorded in full", sys, time.Hour, 10 * time.Millisecond, 20, true, false},
		{"short LRU horizon shrinks the window", sys, 100 * time.Millisecond, 10 * time.Millisecond, 8, true, false},
		{"added and never touched since (may be withdrawn): touched", sys, time.Hour, 10 * time.Millisecond, 8, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newBackend(t, "a", 64*64)
			x := New(Options{ChunkTokens: 64})
			x.SetBackends([]*backend.Backend{a})
			x.Record(chain(9, 1), a, t0.Add(-tt.horizon)) // the LRU tail
			if tt.prior != nil {
				if !tt.unconfirmed {
					x.Record(tt.prior, a, t0.Add(-time.Millisecond)) // added, then touched at t0
				}
				x.Record(tt.prior, a, t0)
			}
			now := t0.Add(tt.after)
			x.RecordHeld(p, a, now, tt.held)
			if got := match(x, p, a)[0]; got != len(p) {
				t.Fatalf("p matched %d of %d after RecordHeld", got, len(p))
			}
			if got := usedOf(x, a, p[len(p)-1]); !got.Equal(now) {
				t.Errorf("the new chunks were last used %v, want %v", got, now)
			}
			touched := usedOf(x, a, sys[0]).Equal(now) && usedOf(x, a, sys[7]).Equal(now)
			if touched != tt.wantTouched {
				t.Errorf("system prompt touched = %v, want %v (used %v)", touched, tt.wantTouched, usedOf(x, a, sys[0]))
			}
			check(t, x)
		})
	}
}

// Forget and RecordHeld together: what an accepted request relies on,
// or a later incarnation of the backend holds, is never withdrawn by another Record's Forget.
func TestForgetNeverTakesWhatOthersHold(t *testing.T) {
	sys := chain(1, 4)
	pa := append(sys[:4:4], chain(2, 2)...)
	pb := append(sys[:4:4], chain(3, 2)...)
	for _, tt := range []struct {
		name string
		run  func(x *Index, a *backend.Backend) (probe []uint64, want int64)
	}{
		{"B routed onto A's new prefix skips re-touching it; A is refused", func(x *Index, a *backend.Backend) ([]uint64, int64) {
			stA := x.Record(pa, a, t0)
			held := match(x, pb, a)[0]
			x.RecordHeld(pb, a, t0.Add(5*time.Millisecond), held)
			x.Forget(pa, a, stA)
			return pb, int64(len(pb))
		}},
		{"a chunk hash repeated in one prompt is still withdrawn", func(x *Index, a *backend.Backend) ([]uint64, int64) {
			p := []uint64{0, 1, 5} // 0 and 1 are the same entry
			x.Forget(p, a, x.Record(p, a, t0))
			return p, 0
		}},
		{"a stamp from before the backend was removed and added again", func(x *Index, a *backend.Backend) ([]uint64, int64) {
			p := chain(1, 4)
			st := x.Record(p, a, t0)
			x.SetBackends(nil)
			x.SetBackends([]*backend.Backend{a})
			x.Record(p, a, t0) // the same instant: a coarse or stepped-back clock
			x.Forget(p, a, st)
			return p, 4
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newBackend(t, "a", 64*64)
			x := New(Options{ChunkTokens: 64})
			x.SetBackends([]*backend.Backend{a})
			x.Record(chain(9, 1), a, t0.Add(-time.Hour)) // a long LRU horizon
			probe, want := tt.run(x, a)
			check(t, x)
			if want == 0 {
				if got := match(x, probe, a)[0]; got != 0 {
					t.Errorf("matched %d chunks after the Forget, want 0", got)
				}
				return
			}
			if got := match(x, probe, a)[0]; int64(got) != want {
				t.Errorf("matched %d chunks, want %d", got, want)
			}
		})
	}
}

// keyChunks is a prompt's chunk hashes as router/key marks them: n hashes named by seed, the
// first key.FineChunks fine (bit 0 clear), the rest coarse (bit 0 set).
func keyChunks(seed uint64, n int) []uint64 {
	out := chain(seed, n)
	for i := range out {
		out[i] = max(out[i]&^1, 2)
		if i >= key.FineChunks {
			out[i] |= 1
		}
	}
	return out
}

// TestFitKeepsPeersInStep: one session's prompts, each extending the last and weighing more
// than the backend's capacity, recorded on one index with the held hint and sent to another
// as peering sends them (the chunks past held, up to Fit): both match the same every step.
// Sent past the cut, the peer would record coarse chunks the first never held and evict its
// own copy of the prefix for them.
func TestFitKeepsPeersInStep(t *testing.T) {
	const capacity = 468 // 30,000 KV tokens of 64-token chunks
	b := newBackend(t, "a", capacity*64)
	local := newIndex(Options{ChunkTokens: 64, MaxEntries: -1, CoarseWeight: key.CoarseFactor}, defaultShards)
	peer := newIndex(Options{ChunkTokens: 64, MaxEntries: -1, CoarseWeight: key.CoarseFactor}, defaultShards)
	local.SetBackends([]*backend.Backend{b})
	peer.SetBackends([]*backend.Backend{b})
	now := t0
	for step, n := range []int{167, 171, 175, 179, 183} {
		p := keyChunks(1, n)
		now = now.Add(time.Second)
		held := match(local, p, b)[0]
		cut := local.Fit(p, b)
		if want := 128 + (capacity-128)/key.CoarseFactor; cut != min(n, want) {
			t.Fatalf("step %d: Fit = %d, want %d", step, cut, min(n, want))
		}
		local.RecordHeld(p, b, now, held)
		peer.Record(p[min(held, cut):cut], b, now)
		if l, r := match(local, p, b)[0], match(peer, p, b)[0]; l != cut || r != cut {
			t.Errorf("step %d: prompt of %d chunks, cut %d: local matches %d, peer %d", step, n, cut, l, r)
		}
	}
	if got := local.Fit(keyChunks(2, 10), newBackend(t, "unregistered", 64)); got != 0 {
		t.Errorf("Fit on an unregistered backend = %d, want 0", got)
	}
}

// TestRecordNewIsRecord: RecordNew (chunks expected new, each claimed at once) leaves the
// index exactly as Record does, whether the chunks are new, partly held or all held, below
// and at capacity: the same matches, the same last-use times, the same evictions.
func TestRecordNewIsRecord(t *testing.T) {
	a1, a2 := newBackend(t, "a", 48*64), newBackend(t, "a", 48*64)
	x1, x2 := New(Options{ChunkTokens: 64}), New(Options{ChunkTokens: 64})
	x1.SetBackends([]*backend.Backend{a1})
	x2.SetBackends([]*backend.Backend{a2})
	var probes [][]uint64
	for i := range 400 {
		// Prompts of 8 conversations growing turn by turn, with some of each resent whole
		// (all held) and some a suffix past a prefix learned before (a peer's update).
		conv := chain(uint64(i%8), 4+i/8%24)
		var p []uint64
		switch i % 3 {
		case 0:
			p = conv
		case 1:
			p = conv[len(conv)/2:]
		default:
			p = chain(uint64(1000+i), 3)
		}
		now := t0.Add(time.Duration(i) * time.Millisecond)
		s1, s2 := x1.Record(p, a1, now), x2.RecordNew(p, a2, now)
		if s1 != s2 {
			t.Fatalf("record %d: stamps %d and %d", i, s1, s2)
		}
		probes = append(probes, conv)
		for _, q := range probes[max(len(probes)-16, 0):] {
			if m1, m2 := match(x1, q, a1)[0], match(x2, q, a2)[0]; m1 != m2 {
				t.Fatalf("record %d: Record matched %d chunks, RecordNew %d", i, m1, m2)
			}
			for _, c := range q {
				if u1, u2 := usedOf(x1, a1, c), usedOf(x2, a2, c); !u1.Equal(u2) {
					t.Fatalf("record %d: last use %v after Record, %v after RecordNew", i, u1, u2)
				}
			}
		}
	}
	st1, st2 := x1.Stats(nil), x2.Stats(nil)
	if st1[0].Entries != st2[0].Entries || st1[0].Evictions != st2[0].Evictions || st1[0].Evictions == 0 {
		t.Fatalf("Record: %d entries, %d evictions; RecordNew: %d, %d (want equal, and some evictions)",
			st1[0].Entries, st1[0].Evictions, st2[0].Entries, st2[0].Evictions)
	}
	check(t, x1)
	check(t, x2)
}
