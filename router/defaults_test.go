package router

import (
	"math"
	"testing"

	"github.com/prefixlb/prefixlb/router/key"
)

// PrefixOptions left at zero take the package's defaults (configs writes the same numbers
// into a loaded config); NoLoadMargin, or any negative margin, is a cap without margin.
func TestPrefixOptionsDefaults(t *testing.T) {
	cases := []struct {
		name        string
		o           PrefixOptions
		chunkTokens int64
		factor      float64
		hard        float64
		margin      int64
		tie         float64
	}{
		{"zero", PrefixOptions{}, key.DefaultChunkTokens, DefaultLoadFactor, DefaultHardLoadFactor, DefaultLoadMargin, DefaultTieMargin},
		{"set", PrefixOptions{ChunkTokens: 16, LoadFactor: 1.5, HardLoadFactor: 3, LoadMargin: 5, TieMargin: 0.3}, 16, 1.5, 3, 5, 0.3},
		{"hard below the cap: the cap alone", PrefixOptions{LoadFactor: 1.5, HardLoadFactor: 1.1}, key.DefaultChunkTokens, 1.5, 1.5, DefaultLoadMargin, DefaultTieMargin},
		{"load factor above the default hard one", PrefixOptions{LoadFactor: 4}, key.DefaultChunkTokens, 4, 4, DefaultLoadMargin, DefaultTieMargin},
		{"NaN factors: the defaults", PrefixOptions{LoadFactor: math.NaN(), HardLoadFactor: math.NaN()}, key.DefaultChunkTokens, DefaultLoadFactor, DefaultHardLoadFactor, DefaultLoadMargin, DefaultTieMargin},
		{"no margin", PrefixOptions{LoadMargin: NoLoadMargin, TieMargin: NoTieMargin}, key.DefaultChunkTokens, DefaultLoadFactor, DefaultHardLoadFactor, 0, 0},
		{"negative margin", PrefixOptions{LoadMargin: -7, TieMargin: -2}, key.DefaultChunkTokens, DefaultLoadFactor, DefaultHardLoadFactor, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := NewPrefix(c.o, nil)
			s := p.sel
			if p.chunkTokens != c.chunkTokens || s.loadFactor != c.factor || s.hardFactor != c.hard || s.margin != c.margin || s.tieMargin != c.tie {
				t.Errorf("NewPrefix(%+v): chunk tokens %d, load factor %g, hard %g, margin %d, tie margin %g; want %d, %g, %g, %d, %g",
					c.o, p.chunkTokens, s.loadFactor, s.hardFactor, s.margin, s.tieMargin, c.chunkTokens, c.factor, c.hard, c.margin, c.tie)
			}
		})
	}
}

// Without margin and at load factor 1, the holder of a prompt with one request in flight
// out of one is at the cap ceil(1 × 2 / 2) = 1: with the cap alone (hard factor 1) the next
// copy of the prompt goes to the other backend. With the default margin it stays on the
// holder. Under the default hard cap ceil(2.5 × 2 / 2) = 3 it goes to the other backend too,
// by the estimate: the holder is still prefilling the first copy (queued), so the second
// would wait for that and then prefill its own rest there.
func TestNoLoadMarginOverflows(t *testing.T) {
	prompt := chunkChain(nil).extend("shared", 8)
	for _, c := range []struct {
		margin int
		hard   float64
		want   Reason
	}{{NoLoadMargin, 1, ReasonOverload}, {0, 1, ReasonMatch}, {NoLoadMargin, 0, ReasonOverload}} {
		bs := prefixBackends(t, 2)
		p := NewPrefix(PrefixOptions{LoadFactor: 1, HardLoadFactor: c.hard, LoadMargin: c.margin}, nil)
		p.SetBackends(bs)
		var rs inflight
		first := pickAndLearn(t, p, routedKey(prompt), bs, &rs)
		d := p.Pick(routedKey(prompt), bs)
		rs.releaseAll()
		if d.Reason != c.want || (c.want == ReasonOverload) == (d.Backend == first.Backend) {
			t.Errorf("margin option %d, hard factor %g: second copy %s on %s (first on %s), want %s", c.margin, c.hard, d.Reason, d.Backend.Name, first.Backend.Name, c.want)
		}
	}
}
