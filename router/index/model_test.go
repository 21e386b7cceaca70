package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// lruModel is the specification of one backend's part of the index, written plainly: its
// chunks from most to least recently used, with their last use.
type lruModel struct {
	capacity  int
	order     []uint64         // most recently used first
	used      map[uint64]int64 // stamp of the last Record, +1 if that Record added the chunk
	evictions uint64
	stamp     int64   // the last Record's stamp
	stamps    []Stamp // every Record's stamp, for Forget
}

func (m *lruModel) evictTail() {
	h := m.order[len(m.order)-1]
	m.order = m.order[:len(m.order)-1]
	delete(m.used, h)
	m.evictions++
}

func (m *lruModel) record(chunks []uint64, now int64) Stamp {
	if len(chunks) == 0 {
		return 0
	}
	t := now &^ 1
	if t <= m.stamp {
		t = m.stamp + 2
	}
	m.stamp = t
	for len(m.order) > m.capacity {
		m.evictTail()
	}
	if len(chunks) > m.capacity {
		chunks = chunks[:m.capacity]
	}
	for i := len(chunks) - 1; i >= 0; i-- {
		h := norm(chunks[i])
		u := t
		if j := slices.Index(m.order, h); j >= 0 {
			m.order = slices.Delete(m.order, j, j+1)
			if m.used[h] == t|1 {
				u |= 1 // repeated in this prompt: still added by it
			}
		} else {
			if len(m.order) >= m.capacity {
				m.evictTail()
			}
			u |= 1
		}
		m.order = slices.Insert(m.order, 0, h)
		m.used[h] = u
	}
	m.stamps = append(m.stamps, Stamp(t))
	return Stamp(t)
}

// forget drops the chunks the Record stamped st added and nobody touched since.
func (m *lruModel) forget(chunks []uint64, st Stamp) {
	if st == 0 {
		return
	}
	for _, c := range chunks {
		h := norm(c)
		if j := slices.Index(m.order, h); j >= 0 && m.used[h] == int64(st)|1 {
			m.order = slices.Delete(m.order, j, j+1)
			delete(m.used, h)
		}
	}
}

func (m *lruModel) match(chunks []uint64) int {
	for i, c := range chunks {
		if _, ok := m.used[norm(c)]; !ok {
			return i
		}
	}
	return len(chunks)
}

// TestAgainstModel runs random Records, Forgets and restarts on small backends, over few
// shards (so that a new chunk and the entry it evicts often share one), and compares every
// backend's LRU list, last uses, evictions and matches with lruModel after each step.
// Prompts share prefixes, have holes and repeat chunks; some backends are beyond the
// chunk mask, so that their holders are found by list.
func TestAgainstModel(t *testing.T) {
	for _, nb := range []int{3, 35} {
		t.Run(fmt.Sprintf("backends=%d", nb), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(nb), 11))
			bs := make([]*backend.Backend, nb)
			models := make([]*lruModel, nb)
			for i := range bs {
				capacity := 1 + rng.IntN(40)
				bs[i] = newBackend(t, fmt.Sprintf("b%d", i), int64(capacity)*64)
				models[i] = &lruModel{capacity: capacity, used: map[uint64]int64{}}
			}
			x := New(Options{ChunkTokens: 64, Shards: 2, MaxEntries: -1})
			x.SetBackends(bs)
			active := []int{0, 1, 2} // the backends used: the last ones, for nb > 32
			if nb > 32 {
				active = []int{0, nb - 2, nb - 1}
			}
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
					now := t0.Add(time.Duration(step))
					got, want := x.Record(p, b, now), m.record(p, now.UnixNano())
					if len(p) > 0 && got != want {
						t.Fatalf("step %d: Record stamp %d, model %d", step, got, want)
					}
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
					m.order, m.used = m.order[:0], map[uint64]int64{}
				}
				for _, k := range active {
					compareModel(t, step, x, bs[k], models[k])
				}
				q := prompt()
				out := make([]int, len(active))
				cs := make([]*backend.Backend, len(active))
				for i, k := range active {
					cs[i] = bs[k]
				}
				x.Match(q, cs, out)
				for i, k := range active {
					want := models[k].match(q)
					if bs[k].Epoch() != epochOf(x, bs[k]) {
						want = 0 // restarted, not yet purged: ignored
					}
					if out[i] != want {
						t.Fatalf("step %d: backend %d matched %d, model %d", step, k, out[i], want)
					}
				}
			}
			check(t, x)
		})
	}
}

func epochOf(x *Index, b *backend.Backend) uint64 {
	return x.tab.Load().byID[b.ID].epoch.Load()
}

// compareModel checks b's LRU list, last uses and evictions against m. A backend restarted
// since its last Record still lists its old entries, which m has dropped: skipped.
func compareModel(t *testing.T, step int, x *Index, b *backend.Backend, m *lruModel) {
	t.Helper()
	s := x.tab.Load().byID[b.ID]
	if s.epoch.Load() != b.Epoch() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var got []uint64
	for ni := s.head; ni != nilIdx; ni = s.nodes[ni].next {
		n := s.nodes[ni]
		got = append(got, n.hash)
		if n.used != m.used[n.hash] {
			t.Fatalf("step %d: %s: chunk %d last used %d, model %d", step, s.name, n.hash, n.used, m.used[n.hash])
		}
	}
	if !slices.Equal(got, m.order) {
		t.Fatalf("step %d: %s: LRU list\n%v\nmodel\n%v", step, s.name, got, m.order)
	}
	if e := s.evictions.Load(); e != m.evictions {
		t.Fatalf("step %d: %s: %d evictions, model %d", step, s.name, e, m.evictions)
	}
}
