package index

import (
	"math/rand/v2"
	"testing"
)

// The table against a Go map, under random puts and deletes, with keys that crowd a few
// home slots so that probe runs wrap around the end: present keys carry their value, absent
// ones (deleted or never added) are not found.
func TestChunkTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, keySpace := range []uint64{40, 5000} {
		var tab chunkTable
		ref := map[uint64]int32{}
		for i := range 200_000 {
			k := 1 + rng.Uint64N(keySpace)
			if rng.IntN(3) == 0 {
				tab.del(k)
				delete(ref, k)
			} else {
				tab.put(k).head = int32(i)
				ref[k] = int32(i)
			}
			if i%1000 == 0 || keySpace == 40 {
				if tab.n != len(ref) {
					t.Fatalf("step %d: table has %d keys, map %d", i, tab.n, len(ref))
				}
				for k, v := range ref {
					if c := tab.get(k); c == nil || c.head != v {
						t.Fatalf("step %d: key %d: got %v, want head %d", i, k, c, v)
					}
				}
				// Deleted and never-added keys are absent: a deletion leaves nothing
				// findable behind (the key space, plus keys beyond it).
				for k := uint64(1); k <= keySpace+8; k++ {
					if _, in := ref[k]; !in && tab.get(k) != nil {
						t.Fatalf("step %d: key %d found, but it was deleted or never added", i, k)
					}
				}
			}
		}
		for k := range ref {
			tab.del(k)
		}
		if tab.n != 0 || len(tab.slots) != minTableSlots {
			t.Errorf("emptied table: %d keys in %d slots, want 0 in %d", tab.n, len(tab.slots), minTableSlots)
		}
	}
}
