package index

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestHolderInline: a chunk's holders through the changes that move them between the chunk
// itself (inline) and the slab's list: one holder below maskSlots is inline, a second
// (either side of maskSlots) moves both to the list, the last one left on the list goes back
// inline when it can (below maskSlots, a node inlineHead can encode), a holder at or past
// maskSlots is on the list, and removing the last holder removes the chunk. After each step
// every holder is found under its own slot and node, no other slot finds one, the mask names
// exactly the holders below maskSlots, and the slab holds exactly the list's holders.
func TestHolderInline(t *testing.T) {
	type hold struct {
		num  uint16
		node int32
	}
	type step struct {
		add    bool
		num    uint16
		node   int32 // for add
		inline bool  // whether the chunk then keeps its holder inline (when it has any)
	}
	const h = 0x9e3779b97f4a7c15
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"one, removed", []step{{true, 3, 7, true}, {false, 3, 0, false}}},
		{"node 0 in slot 0", []step{{true, 0, 0, true}, {false, 0, 0, false}}},
		{"second spills, first removed", []step{{true, 3, 7, true}, {true, 5, 9, false}, {false, 3, 0, true}, {false, 5, 0, false}}},
		{"second spills, second removed", []step{{true, 3, 7, true}, {true, 5, 9, false}, {false, 5, 0, true}, {true, 6, 1, false}}},
		{"three, two removed", []step{{true, 3, 7, true}, {true, 5, 9, false}, {true, 8, 2, false}, {false, 5, 0, false}, {false, 8, 0, true}, {false, 3, 0, false}}},
		{"past the mask alone", []step{{true, maskSlots + 2, 4, false}, {true, 1, 2, false}, {false, maskSlots + 2, 0, true}}},
		{"past the mask second", []step{{true, 1, 2, true}, {true, maskSlots, 4, false}, {false, 1, 0, false}}},
		{"past the mask left", []step{{true, maskSlots + 1, 4, false}, {true, maskSlots + 3, 6, false}, {false, maskSlots + 3, 0, false}}},
		{"remove a slot that holds nothing", []step{{true, 2, 5, true}, {false, 4, 0, true}, {false, maskSlots + 1, 0, true}}},
		{"the largest inline node", []step{{true, 31, math.MaxInt32 - 1, true}}},
		{"a node past inline", []step{{true, 31, math.MaxInt32, false}, {true, 2, 3, false}, {false, 31, 0, true}, {true, 4, math.MaxInt32, false}, {false, 2, 0, false}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var sh shard
			sh.hs.free = nilIdx
			var want []hold
			for i, st := range c.steps {
				if st.add {
					sh.add(h, st.num, st.node)
					want = append(want, hold{st.num, st.node})
				} else {
					sh.remove(h, st.num)
					want = slices.DeleteFunc(want, func(x hold) bool { return x.num == st.num })
				}
				ch := sh.chunks.get(h)
				if len(want) == 0 {
					if ch != nil {
						t.Fatalf("step %d: chunk left with head %d, mask %b", i, ch.head, ch.mask)
					}
					continue
				}
				if ch == nil {
					t.Fatalf("step %d: chunk gone, want holders %v", i, want)
				}
				if _, _, ok := ch.inline(); ok != st.inline {
					t.Fatalf("step %d: inline %v, want %v", i, ok, st.inline)
				}
				var got []hold
				sh.each(ch, func(num uint16, node int32) bool { got = append(got, hold{num, node}); return true })
				cmp := func(a, b hold) int { return int(a.num) - int(b.num) }
				slices.SortFunc(got, cmp)
				sorted := slices.SortedFunc(slices.Values(want), cmp)
				if !slices.Equal(got, sorted) {
					t.Fatalf("step %d: holders %v, want %v", i, got, sorted)
				}
				var mask uint32
				for _, x := range want {
					if x.num < maskSlots {
						mask |= 1 << x.num
					}
				}
				if ch.mask != mask {
					t.Fatalf("step %d: mask %b, want %b", i, ch.mask, mask)
				}
				live := slabLive(&sh)
				if _, _, ok := ch.inline(); ok && live != 0 || !ok && live != len(want) {
					t.Fatalf("step %d: %d holders in the slab for %d holders (inline %v)", i, live, len(want), ok)
				}
				for num := range uint16(maskSlots + 4) {
					wantNode := int32(nilIdx)
					for _, x := range want {
						if x.num == num {
							wantNode = x.node
						}
					}
					if got := sh.find(h, num); got != wantNode {
						t.Fatalf("step %d: slot %d finds node %d, want %d", i, num, got, wantNode)
					}
				}
			}
		})
	}
}

// slabLive counts the holders in use in sh's slab: those allocated less the free list.
func slabLive(sh *shard) int {
	free := 0
	for i := sh.hs.free; i != nilIdx; i = sh.hs.at(i).next {
		free++
	}
	return int(sh.hs.n) - free
}

// TestShardAgainstModel: random adds and removes of (chunk, slot) holders over slots on both
// sides of maskSlots, against a map: after each step every chunk's holders, nodes and mask
// are the model's, find answers for every slot as the model does, a chunk on the slab's list
// has two holders or one that cannot be inline, and the slab holds exactly the lists' holders.
func TestShardAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var sh shard
	sh.hs.free = nilIdx
	type hold struct {
		h   uint64
		num uint16
	}
	model := map[hold]int32{}
	const chunks, slots = 20, maskSlots + 8
	for step := range 20_000 {
		k := hold{uint64(1 + rng.IntN(chunks)), uint16(rng.IntN(slots))}
		if _, ok := model[k]; !ok && rng.IntN(2) == 0 {
			node := int32(rng.IntN(1000))
			sh.add(k.h, k.num, node)
			model[k] = node
		} else {
			sh.remove(k.h, k.num)
			delete(model, k)
		}
		listed := 0
		for h := uint64(1); h <= chunks; h++ {
			var want int
			var mask uint32
			for m := range model {
				if m.h == h {
					want++
					if m.num < maskSlots {
						mask |= 1 << m.num
					}
				}
			}
			ch := sh.chunks.get(h)
			switch {
			case want == 0 && ch != nil:
				t.Fatalf("step %d: chunk %d left", step, h)
			case want == 0:
				continue
			case ch == nil:
				t.Fatalf("step %d: chunk %d gone, the model has %d holders", step, h, want)
			case ch.mask != mask:
				t.Fatalf("step %d: chunk %d mask %b, want %b", step, h, ch.mask, mask)
			}
			n, first := 0, uint16(0)
			sh.each(ch, func(num uint16, node int32) bool {
				n, first = n+1, num
				if w, ok := model[hold{h, num}]; !ok || w != node {
					t.Fatalf("step %d: chunk %d slot %d node %d, model %d (%v)", step, h, num, node, w, ok)
				}
				return true
			})
			if n != want {
				t.Fatalf("step %d: chunk %d has %d holders, want %d", step, h, n, want)
			}
			if _, _, ok := ch.inline(); !ok {
				listed += n
				if n == 1 && first < maskSlots {
					t.Fatalf("step %d: chunk %d's one holder (slot %d) left on the list", step, h, first)
				}
			}
			for num := range uint16(slots + 2) {
				w, ok := model[hold{h, num}]
				if !ok {
					w = nilIdx
				}
				if got := sh.find(h, num); got != w {
					t.Fatalf("step %d: find(%d, %d) = %d, want %d", step, h, num, got, w)
				}
			}
		}
		if live := slabLive(&sh); live != listed {
			t.Fatalf("step %d: %d holders live in the slab, %d on lists", step, live, listed)
		}
	}
}
