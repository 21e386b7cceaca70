package index

import (
	"math"
	"slices"
	"testing"
)

// TestHolderInline: a chunk's holders through the changes that move the first between the
// chunk itself (inline) and the slab's list: one holder below maskSlots is inline, a second
// (either side of maskSlots) moves both to the list, a holder at or past maskSlots alone is
// on the list, and removing the last holder removes the chunk. After each step every holder
// is found under its own slot and node, no other slot finds one, and the mask names exactly
// the holders below maskSlots.
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
		{"second spills, first removed", []step{{true, 3, 7, true}, {true, 5, 9, false}, {false, 3, 0, false}, {false, 5, 0, false}}},
		{"second spills, second removed", []step{{true, 3, 7, true}, {true, 5, 9, false}, {false, 5, 0, false}, {true, 6, 1, false}}},
		{"past the mask alone", []step{{true, maskSlots + 2, 4, false}, {true, 1, 2, false}, {false, maskSlots + 2, 0, false}}},
		{"past the mask second", []step{{true, 1, 2, true}, {true, maskSlots, 4, false}, {false, 1, 0, false}}},
		{"remove a slot that holds nothing", []step{{true, 2, 5, true}, {false, 4, 0, true}, {false, maskSlots + 1, 0, true}}},
		{"the largest inline node", []step{{true, 31, math.MaxInt32 - 1, true}}},
		{"a node past inline", []step{{true, 31, math.MaxInt32, false}, {true, 2, 3, false}, {false, 31, 0, false}}},
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
