package router

import (
	"fmt"
	"testing"

	"github.com/prefixlb/prefixlb/router/key"
)

// TestThinMatchAmongNearTies: with SpreadNewPrefixes, among near-ties a match that spares under thinMatchShare of the
// prefill (one shared chunk of a 16-chunk prompt) counts as none, so the ring places the
// prompt by its first own chunk and such prompts spread; a match that spares half or more
// keeps the prompt on its holder whatever the ring says.
func TestThinMatchAmongNearTies(t *testing.T) {
	const n = 4
	place, ids, in := tieBreakSetup(n)
	shared := chunkChain(nil).extend("system prompt", 1)
	tests := []struct {
		name    string
		matched int // chunks of the 16 the holder (candidate 0) holds
		minHits int // of 64 prompts, how many the holder must get at least
		maxHits int
	}{
		{"one chunk of 16: thin, spread", 1, 6, 30},
		{"eight of 16: held", 8, 64, 64},
		{"three of 16 (15% of the tokens): thin", 3, 6, 30},
		{"six of 16 (34%): held", 6, 64, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hits := 0
			for i := range 64 {
				chunks := append(chunkChain(nil).extend("prefix", tt.matched), chunkChain(nil).extend(fmt.Sprint("own", i), 16-tt.matched)...)
				if tt.matched == 1 {
					chunks = append(shared[:1:1], chunks[1:]...)
				}
				in.promptTokens = int64(key.PrefixTokens(16, key.DefaultChunkTokens))
				cs := make([]cand, n)
				for j := range cs {
					cs[j] = cand{id: ids[j], weight: 1, rate: 10_000, base: 0.02}
				}
				cs[0].matched = tt.matched
				estimate(cs, in)
				spread := testSel(0.5, false)
				spread.spread = true
				if j, _ := pickCost(chunks, cs, spread, place); j == 0 {
					hits++
				}
				if j, _ := pickCost(chunks, cs, testSel(0.5, false), place); j != 0 {
					t.Fatalf("prompt %d: without spread the holder of %d chunks lost to %d", i, tt.matched, j)
				}
			}
			if hits < tt.minHits || hits > tt.maxHits {
				t.Errorf("holder of %d chunks got %d of 64 prompts, want %d..%d", tt.matched, hits, tt.minHits, tt.maxHits)
			}
		})
	}
}

// TestTieBreakAutoByRecentShare: with SpreadNewPrefixes, a prefixlb replica alone (TieBreakAuto, every candidate
// alone) sends a cold prompt's near-ties to the backend it routed the fewest requests to
// lately, even where that one has a request in flight and another has none (conversations
// between turns have none); peered replicas (TieBreakLoad) rank by in-flight requests only.
func TestTieBreakAutoByRecentShare(t *testing.T) {
	const n = 4
	place, ids, in := tieBreakSetup(n)
	auto := testSel(0.5, false)
	auto.auto, auto.spread = true, true
	load := testSel(0.5, true)
	load.spread = true
	for i := range 32 {
		chunks := chunkChain(nil).extend(fmt.Sprint("cold", i), 4)
		quiet := i % n      // fewest requests lately, one in flight now
		idle := (i + 1) % n // none in flight, many lately
		cs := make([]cand, n)
		for j := range cs {
			cs[j] = cand{id: ids[j], weight: 1, rate: 10_000, base: 0.02, alone: true, recent: 30, inFlight: 1}
		}
		cs[quiet].recent = 5
		cs[idle].inFlight = 0
		estimate(cs, in)
		if got, _ := pickCost(chunks, cs, auto, place); got != quiet {
			t.Fatalf("prompt %d: auto picked %d, want %d (fewest routed lately)", i, got, quiet)
		}
		if got, _ := pickCost(chunks, cs, load, place); got != idle {
			t.Fatalf("prompt %d: load picked %d, want %d (none in flight)", i, got, idle)
		}
	}
}
