package index

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prefixlb/prefixlb/internal/splitmix"
)

// TestBatchGroup checks that group lists every position of a batch exactly once, under its
// chunk's shard, in the batch's order, for batches of one chunk to batchChunks over one,
// two and the default shards, with hash 0 (stored as 1) among them.
func TestBatchGroup(t *testing.T) {
	for _, shards := range []int{1, 2, defaultShards} {
		x := newIndex(Options{}, shards)
		for _, n := range []int{1, 2, 63, 64, 65, batchChunks} {
			t.Run(fmt.Sprintf("shards=%d/n=%d", shards, n), func(t *testing.T) {
				hs := make([]uint64, n)
				for i := range hs {
					hs[i] = splitmix.Mix(uint64(i) * 7919)
				}
				hs[n/2] = 0
				var b batch
				b.group(x, hs)
				var seen []int
				for si := range x.shards {
					run := b.order[b.start[si]:b.start[si+1]]
					for k, p := range run {
						if got := x.shardOf(norm(hs[p])); got != si {
							t.Fatalf("position %d (shard %d) listed under shard %d", p, got, si)
						}
						if k > 0 && run[k-1] >= p {
							t.Fatalf("shard %d's run out of order: %v", si, run)
						}
						seen = append(seen, int(p))
					}
				}
				slices.Sort(seen)
				for i, p := range seen {
					if p != i {
						t.Fatalf("positions listed: %v, want 0..%d once each", seen, n-1)
					}
				}
				if len(seen) != n || int(b.start[len(x.shards)]) != n {
					t.Fatalf("%d positions listed, runs end at %d; want %d", len(seen), b.start[len(x.shards)], n)
				}
			})
		}
	}
}
