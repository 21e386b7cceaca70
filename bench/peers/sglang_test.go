package peers

import (
	"testing"

	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

func TestSGLangRules(t *testing.T) {
	conv := chain("conv", 10)
	// Small thresholds so that a few leases make the load imbalanced; the rules are SGLang's.
	small := SGLangOptions{BalanceAbs: 2, BalanceRel: 1.5, CacheThreshold: 0.5}
	tests := []struct {
		name    string
		o       SGLangOptions
		held    map[int]int // backend → leading chunks of conv it was taught
		extra   map[int]int // backend → chunks of an unrelated prompt it was taught
		loads   []int
		chunks  int // the request: the first chunks of conv
		want    int
		reason  router.Reason
		matched int
	}{
		{"imbalanced (max−min > abs and max > rel×min): least loaded, though another holds it all", small,
			map[int]int{0: 10}, nil, []int{5, 1, 2}, 10, 1, router.ReasonLeastLoad, 0},
		{"max−min over abs but max within rel×min: balanced, the holder", small,
			map[int]int{0: 10}, nil, []int{9, 6, 7}, 10, 0, router.ReasonMatch, 10},
		{"max within abs of min: balanced, the holder", small,
			map[int]int{0: 10}, nil, []int{2, 0, 1}, 10, 0, router.ReasonMatch, 10},
		{"match ratio over the threshold: the deepest holder", small,
			map[int]int{0: 4, 1: 10}, nil, []int{0, 2, 1}, 10, 1, router.ReasonMatch, 10},
		{"several deepest holders: the least loaded of them", small,
			map[int]int{0: 10, 1: 10}, nil, []int{2, 1, 0}, 10, 1, router.ReasonMatch, 10},
		{"match ratio not over the threshold: least loaded", small,
			map[int]int{0: 2}, nil, []int{1, 2, 0}, 10, 2, router.ReasonCold, 0},
		{"a miss with SmallestTree: fewest entries, not least loaded",
			SGLangOptions{BalanceAbs: 2, BalanceRel: 1.5, CacheThreshold: 0.5, SmallestTree: true},
			nil, map[int]int{0: 8, 1: 3, 2: 6}, []int{0, 1, 0}, 10, 1, router.ReasonCold, 0},
		{"defaults: a 60-request spread is balanced (abs 64)", SGLangOptions{},
			map[int]int{0: 10}, nil, []int{60, 0, 0}, 10, 0, router.ReasonMatch, 10},
		{"defaults: a 65-request spread is imbalanced", SGLangOptions{},
			map[int]int{0: 10}, nil, []int{65, 0, 1}, 10, 1, router.ReasonLeastLoad, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := testBackends(t, len(tc.loads))
			p := NewSGLang(tc.o)
			p.SetBackends(bs)
			for b, n := range tc.held {
				p.Learn(keyOf(conv[:n]), bs[b], 0)
			}
			for b, n := range tc.extra {
				p.Learn(keyOf(chain("other", n)), bs[b], 0)
			}
			loads(t, bs, tc.loads...)
			d := p.Pick(keyOf(conv[:tc.chunks]), bs)
			if d.Backend != bs[tc.want] || d.Reason != tc.reason || d.MatchedChunks != tc.matched {
				t.Fatalf("picked %s (%v, %d chunks), want %s (%v, %d chunks)", d.Backend.Name, d.Reason, d.MatchedChunks,
					bs[tc.want].Name, tc.reason, tc.matched)
			}
		})
	}
}

func TestSGLangNoKeyAndNoCandidates(t *testing.T) {
	bs := testBackends(t, 3)
	p := NewSGLang(SGLangOptions{})
	p.SetBackends(bs)
	if d := p.Pick(keyOf(nil), nil); d.Backend != nil {
		t.Fatalf("no candidates gave %s", d.Backend.Name)
	}
	loads(t, bs, 1, 0, 1)
	if d := p.Pick(&key.Key{Routed: true}, bs); d.Backend != bs[1] || d.Reason != router.ReasonCold {
		t.Fatalf("an unparsed request went to %s (%v), want the least loaded", d.Backend.Name, d.Reason)
	}
}
