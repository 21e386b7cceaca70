package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// lruModel is the specification of one backend's part of the index, written plainly in terms
// of what can be observed: its chunks from most to least recently used, which Record (named by
// the Stamp it returned, an opaque token here) added each chunk and has not been followed by
// another Record touching it, and how many entries capacity evicted.
type lruModel struct {
	capacity  int
	coarseW   int              // the weight of a hash with bit 0 set (Options.CoarseWeight); others weigh 1
	used      int              // the entries' weight
	order     []uint64         // most recently used first
	addedBy   map[uint64]Stamp // the Record that added the chunk, while no other touched it
	lastUse   map[uint64]Stamp // the last Record that touched the chunk
	evictions uint64
	stamps    []Stamp // every Record's stamp, for Forget
}

func newLRUModel(capacity, coarseW int) *lruModel {
	return &lruModel{capacity: capacity, coarseW: max(coarseW, 1), addedBy: map[uint64]Stamp{}, lastUse: map[uint64]Stamp{}}
}

func (m *lruModel) weight(h uint64) int {
	if h&1 != 0 {
		return m.coarseW
	}
	return 1
}

// modelKey is the chunk as the index stores it: the hash 0 is documented to alias 1.
func modelKey(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

func (m *lruModel) evictTail() {
	h := m.order[len(m.order)-1]
	m.drop(h)
	m.evictions++
}

func (m *lruModel) drop(h uint64) {
	m.used -= m.weight(h)
	m.order = slices.DeleteFunc(m.order, func(x uint64) bool { return x == h })
	delete(m.addedBy, h)
	delete(m.lastUse, h)
}

func (m *lruModel) reset() {
	m.order = m.order[:0]
	m.used = 0
	clear(m.addedBy)
	clear(m.lastUse)
}

// record applies a Record that returned st: the prompt, cut to the capacity (its longest
// prefix whose chunks, repeats included, weigh at most that), is touched deepest chunk first,
// each moved to the front; a chunk not held is added, evicting the least recently used
// entries until it fits. A chunk this Record itself added (a prompt that repeats a hash)
// stays added by it; any other touch confirms the chunk, which no Forget takes back.
func (m *lruModel) record(chunks []uint64, st Stamp) {
	w := 0
	for i, c := range chunks {
		if w += m.weight(modelKey(c)); w > m.capacity {
			chunks = chunks[:i]
			break
		}
	}
	for i := len(chunks) - 1; i >= 0; i-- {
		h := modelKey(chunks[i])
		if j := slices.Index(m.order, h); j >= 0 {
			m.order = slices.Delete(m.order, j, j+1)
			if m.addedBy[h] != st {
				delete(m.addedBy, h)
			}
		} else {
			for m.used+m.weight(h) > m.capacity {
				m.evictTail()
			}
			m.used += m.weight(h)
			m.addedBy[h] = st
		}
		m.order = slices.Insert(m.order, 0, h)
		m.lastUse[h] = st
	}
	m.stamps = append(m.stamps, st)
}

// forget drops the chunks the Record st added and nobody touched since.
func (m *lruModel) forget(chunks []uint64, st Stamp) {
	if st == 0 {
		return
	}
	for _, c := range chunks {
		if h := modelKey(c); slices.Contains(m.order, h) && m.addedBy[h] == st {
			m.drop(h)
		}
	}
}

func (m *lruModel) match(chunks []uint64) int {
	for i, c := range chunks {
		if !slices.Contains(m.order, modelKey(c)) {
			return i
		}
	}
	return len(chunks)
}

// TestAgainstModel runs random Records, Forgets and restarts on small backends, over few
// shards (so that a new chunk and the entry it evicts often share one), and compares every
// backend's LRU order, membership, evictions, oldest entry and matches with lruModel after each
// step. Prompts share prefixes, have holes and repeat chunks; some backends are beyond the
// chunk mask, so that their holders are found by list. Stamps are compared only as the
// documented contract has them: nonzero and increasing per backend.
//
// With coarse weight 8, the hashes with bit 0 set (half of them) weigh 8 chunks of the
// capacity, as the key's coarse chunks do, so that a claim often evicts several entries.
func TestAgainstModel(t *testing.T) {
	for _, c := range []struct{ nb, coarseW int }{{3, 1}, {35, 1}, {3, 8}, {35, 8}} {
		nb := c.nb
		t.Run(fmt.Sprintf("backends=%d/coarse=%d", nb, c.coarseW), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(nb*c.coarseW), 11))
			bs := make([]*backend.Backend, nb)
			models := make([]*lruModel, nb)
			for i := range bs {
				capacity := 1 + rng.IntN(40)
				bs[i] = newBackend(t, fmt.Sprintf("b%d", i), int64(capacity)*64)
				models[i] = newLRUModel(capacity, c.coarseW)
			}
			x := newIndex(Options{ChunkTokens: 64, MaxEntries: -1, CoarseWeight: c.coarseW}, 2)
			x.SetBackends(bs)
			active := []int{0, 1, 2} // the backends used: the last ones, for nb > 32
			if nb > 32 {
				active = []int{0, nb - 2, nb - 1}
			}
			// stale: restarted (ResetCache) and not recorded since, so the index may still
			// list entries that Match ignores until the next Record frees them.
			stale := make([]bool, nb)
			prompt := func() []uint64 {
				p := chain(uint64(rng.IntN(6)), 1+rng.IntN(30))
				switch rng.IntN(8) {
				case 0: // a hole
					i := rng.IntN(len(p))
					p = slices.Delete(p, i, i+1)
				case 1: // a repeated chunk
					p = append(p, p[rng.IntN(len(p))])
				case 2: // a hash 0, stored as 1
					p[rng.IntN(len(p))] = 0
				}
				return p
			}
			for step := range 20_000 {
				j := active[rng.IntN(len(active))]
				b, m := bs[j], models[j]
				p := prompt()
				switch r := rng.IntN(100); {
				case r < 80:
					st := x.Record(p, b, t0.Add(time.Duration(step)))
					switch n := len(m.stamps); {
					case len(p) == 0:
						if st != 0 {
							t.Fatalf("step %d: Record of nothing returned stamp %d, want 0", step, st)
						}
						continue
					case st == 0:
						t.Fatalf("step %d: Record returned stamp 0", step)
					case n > 0 && st <= m.stamps[n-1]:
						t.Fatalf("step %d: Record stamp %d not above the previous %d", step, st, m.stamps[n-1])
					}
					m.record(p, st)
					stale[j] = false
				case r < 97:
					if len(p) > 0 {
						p = p[rng.IntN(len(p)):]
					}
					var st Stamp // usually the last Record's; sometimes an older one, or none
					if n := len(m.stamps); n > 0 && rng.IntN(10) > 0 {
						st = m.stamps[max(n-1-rng.IntN(3), 0)]
					}
					x.Forget(p, b, st)
					m.forget(p, st)
				default:
					b.ResetCache()
					m.reset()
					stale[j] = true
				}
				for _, k := range active {
					if !stale[k] {
						compareModel(t, step, x, bs[k], models[k])
					}
				}
				q := prompt()
				out := make([]int, len(active))
				cs := make([]*backend.Backend, len(active))
				for i, k := range active {
					cs[i] = bs[k]
				}
				x.Match(q, cs, out)
				for i, k := range active {
					if want := models[k].match(q); out[i] != want {
						t.Fatalf("step %d: backend %d matched %d, model %d", step, k, out[i], want)
					}
				}
			}
			check(t, x)
		})
	}
}

// compareModel checks b's LRU order, its entry count, evictions and oldest entry against m.
func compareModel(t *testing.T, step int, x *Index, b *backend.Backend, m *lruModel) {
	t.Helper()
	s := x.tab.Load().byID[b.ID]
	s.mu.Lock()
	var got []uint64
	for ni := s.head; ni != nilIdx; ni = s.nodes[ni].next {
		got = append(got, s.nodes[ni].hash)
	}
	s.mu.Unlock()
	if !slices.Equal(got, m.order) {
		t.Fatalf("step %d: %s: LRU order\n%v\nmodel\n%v", step, b.Name, got, m.order)
	}
	st := stat(x, b)
	if st.Entries != int64(m.used) || st.Evictions != m.evictions {
		t.Fatalf("step %d: %s: %d entries' weight, %d evictions; model %d, %d", step, b.Name, st.Entries, st.Evictions, m.used, m.evictions)
	}
	// The oldest entry's last use is the time of the Record that last touched the least
	// recently used entry, which its Stamp is (unix nanoseconds).
	var want time.Time
	if n := len(m.order); n > 0 {
		want = time.Unix(0, int64(m.lastUse[m.order[n-1]]))
	}
	if got := oldest(x, b); !got.Equal(want) {
		t.Fatalf("step %d: %s: oldest entry last used %v, model %v", step, b.Name, got, want)
	}
}

// TestAgainstModelLong is TestAgainstModel for prompts long enough that Match and Record look
// their chunks up in batches (batch.go: past seqChunks, in windows up to batchChunks), over
// one shard, two and the default 64: prompts of up to 1,400 chunks on backends of 1 to 1,500,
// so that a Record often evicts chunks of its own prompt that its batch already looked up,
// and one of 6,000, so that it often has room to claim a new suffix in batches.
// Records pass a held hint (right, short, long or none); the steps are a second apart, so
// that no held prefix is fresh and every Record must touch its whole prompt as Record does.
func TestAgainstModelLong(t *testing.T) {
	for _, c := range []struct{ shards, coarseW int }{{1, 1}, {2, 1}, {defaultShards, 1}, {1, 8}, {defaultShards, 8}} {
		shards := c.shards
		t.Run(fmt.Sprintf("shards=%d/coarse=%d", shards, c.coarseW), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(shards*c.coarseW), 12))
			const nb = 3
			bs := make([]*backend.Backend, nb)
			models := make([]*lruModel, nb)
			for i := range bs {
				capacity := 1 + rng.IntN(1500)
				if i == nb-1 {
					capacity = 6000 // room for whole prompts: Record claims a new suffix in batches
				}
				bs[i] = newBackend(t, fmt.Sprintf("b%d", i), int64(capacity)*64)
				models[i] = newLRUModel(capacity, c.coarseW)
			}
			x := newIndex(Options{ChunkTokens: 64, MaxEntries: -1, CoarseWeight: c.coarseW}, shards)
			x.SetBackends(bs)
			prompt := func() []uint64 {
				p := chain(uint64(rng.IntN(4)), 1+rng.IntN(1400))
				switch rng.IntN(6) {
				case 0: // a hole
					i := rng.IntN(len(p))
					p = slices.Delete(p, i, i+1)
				case 1: // a repeated chunk
					p = append(p, p[rng.IntN(len(p))])
				case 2: // a new tail that repeats a chunk of itself
					tail := chain(uint64(4+rng.IntN(1<<20)), 1+rng.IntN(400))
					p = append(append(p, tail...), tail[rng.IntN(len(tail))])
				}
				return p
			}
			out := make([]int, nb)
			for step := range 300 {
				j := rng.IntN(nb)
				b, m := bs[j], models[j]
				p := prompt()
				if rng.IntN(10) == 0 {
					st := m.stamps
					if n := len(st); n > 0 {
						x.Forget(p, b, st[n-1])
						m.forget(p, st[n-1])
					}
				} else {
					held := 0
					switch rng.IntN(4) {
					case 1:
						held = m.match(p)
					case 2:
						held = rng.IntN(len(p) + 1)
					case 3:
						held = min(m.match(p)+1+rng.IntN(100), len(p))
					}
					st := x.RecordHeld(p, b, t0.Add(time.Duration(step)*time.Second), held)
					if st == 0 {
						t.Fatalf("step %d: RecordHeld returned stamp 0", step)
					}
					m.record(p, st)
				}
				for k := range bs {
					compareModel(t, step, x, bs[k], models[k])
				}
				q := prompt()
				x.Match(q, bs, out)
				for k := range bs {
					if want := models[k].match(q); out[k] != want {
						t.Fatalf("step %d: backend %d matched %d, model %d", step, k, out[k], want)
					}
				}
			}
			check(t, x)
		})
	}
}
