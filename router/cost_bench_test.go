package router

import (
	"fmt"
	"testing"

	"github.com/prefixlb/prefixlb/router/key"
)

// benchCands are n estimated candidates with varied matches, loads and recent shares, every
// one alone (so that TieBreakAuto goes by load), for prompts of 16 chunks.
func benchCands(n int) []cand {
	cs := make([]cand, n)
	for i := range cs {
		cs[i] = cand{id: uint64(100 + i), weight: 1 + i%3/2, rate: 10_000, base: 0.02, matched: []int{0, 1, 4, 16, 3}[i%5],
			inFlight: int64(i % 4), own: int64(i % 3), pending: int64(i % 2), queued: int64(i%3) * 800, recent: float64(i%5) * 1000, alone: true}
	}
	estimate(cs, costInput{promptTokens: int64(key.PrefixTokens(16, key.DefaultChunkTokens)), chunkTokens: key.DefaultChunkTokens, meanWork: 500})
	return cs
}

// BenchmarkPickCost is the selection alone (pickCost over estimated candidates, ring on) for
// 8 and maxStackCandidates candidates under the tie-breaks: ring, TieBreakLoad, and
// TieBreakAuto alone and spreading new prefixes (the thin-match path).
func BenchmarkPickCost(b *testing.B) {
	prompts := make([][]uint64, 64)
	for i := range prompts {
		prompts[i] = chunkChain(nil).extend(fmt.Sprint("bench ", i), 16)
	}
	ring, load, auto := testSel(0.5, false), testSel(0.5, true), testSel(0.5, false)
	auto.auto, auto.spread = true, true
	for _, n := range []int{8, maxStackCandidates} {
		for _, tc := range []struct {
			name string
			sel  selection
		}{{"ring", ring}, {"load", load}, {"auto-spread", auto}} {
			b.Run(fmt.Sprintf("%s/%d", tc.name, n), func(b *testing.B) {
				cs := benchCands(n)
				place, _, _ := tieBreakSetup(n)
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					pickCost(prompts[i%len(prompts)], cs, tc.sel, place)
				}
			})
		}
	}
}

// BenchmarkEstimate is the estimate of 8 candidates, half of them unlearned (the pool's
// median stands in).
func BenchmarkEstimate(b *testing.B) {
	cs := benchCands(8)
	for i := range cs {
		if i%2 == 1 {
			cs[i].rate, cs[i].base = 0, 0
		}
	}
	in := costInput{promptTokens: int64(key.PrefixTokens(16, key.DefaultChunkTokens)), chunkTokens: key.DefaultChunkTokens, meanWork: 500}
	b.ReportAllocs()
	for b.Loop() {
		estimate(cs, in)
	}
}
