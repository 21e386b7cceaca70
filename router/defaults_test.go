package router

import (
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
		margin      int64
		tie         float64
	}{
		{"zero", PrefixOptions{}, key.DefaultChunkTokens, DefaultLoadFactor, DefaultLoadMargin, DefaultTieMargin},
		{"set", PrefixOptions{ChunkTokens: 16, LoadFactor: 1.5, LoadMargin: 5, TieMargin: 0.3}, 16, 1.5, 5, 0.3},
		{"no margin", PrefixOptions{LoadMargin: NoLoadMargin, TieMargin: NoTieMargin}, key.DefaultChunkTokens, DefaultLoadFactor, 0, 0},
		{"negative margin", PrefixOptions{LoadMargin: -7, TieMargin: -2}, key.DefaultChunkTokens, DefaultLoadFactor, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := NewPrefix(c.o, nil)
			if p.chunkTokens != c.chunkTokens || p.loadFactor != c.factor || p.margin != c.margin || p.tieMargin != c.tie {
				t.Errorf("NewPrefix(%+v): chunk tokens %d, load factor %g, margin %d, tie margin %g; want %d, %g, %d, %g",
					c.o, p.chunkTokens, p.loadFactor, p.margin, p.tieMargin, c.chunkTokens, c.factor, c.margin, c.tie)
			}
		})
	}
}

// Without margin and at load factor 1, the holder of a prompt with one request in flight
// out of one is at the cap ceil(1 × 2 / 2) = 1: the next copy of the prompt goes to the other
// backend. With the default margin it stays on the holder.
func TestNoLoadMarginOverflows(t *testing.T) {
	prompt := chunkChain(nil).extend("shared", 8)
	for _, c := range []struct {
		margin int
		want   Reason
	}{{NoLoadMargin, ReasonOverload}, {0, ReasonMatch}} {
		bs := prefixBackends(t, 2)
		p := NewPrefix(PrefixOptions{LoadFactor: 1, LoadMargin: c.margin}, nil)
		p.SetBackends(bs)
		var rs inflight
		first := pickAndLearn(t, p, routedKey(prompt), bs, &rs)
		d := p.Pick(routedKey(prompt), bs)
		rs.releaseAll()
		if d.Reason != c.want || (c.want == ReasonOverload) == (d.Backend == first.Backend) {
			t.Errorf("margin option %d: second copy %s on %s (first on %s), want %s", c.margin, d.Reason, d.Backend.Name, first.Backend.Name, c.want)
		}
	}
}
