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
