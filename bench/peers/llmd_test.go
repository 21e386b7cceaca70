package peers

import (
	"testing"

	"github.com/prefixlb/prefixlb/router"
)

func TestLLMDRules(t *testing.T) {
	conv := chain("conv", 10) // 528 tokens
	tests := []struct {
		name   string
		held   map[int]int // backend → leading chunks of conv it holds
		loads  []int
		kv     []int64 // KV capacity in tokens per backend (0: the test default, 400k)
		want   int
		reason router.Reason
	}{
		// score = 3 × matched tokens/528 + 2 × queue + 2 × (1 − Load × 528 / capacity)
		{"prefix scorer: equal loads, the deeper holder", map[int]int{0: 4, 1: 9}, []int{1, 1, 1}, nil, 1, router.ReasonMatch},
		{"queue scorer: nobody holds it, the shortest queue", nil, []int{3, 1, 2}, nil, 1, router.ReasonLeastLoad},
		{"a full match (3) outweighs the longest queue (0 against 2)", map[int]int{0: 10}, []int{4, 0}, nil, 0, router.ReasonMatch},
		{"five of ten chunks (208 of 528 tokens: 1.2) do not", map[int]int{0: 5}, []int{4, 0}, nil, 1, router.ReasonLeastLoad},
		{"kv-cache-utilization scorer: a small cache at 53% use loses a 3-chunk match",
			map[int]int{0: 3}, []int{1, 1}, []int64{1000, 0}, 1, router.ReasonLeastLoad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := testBackends(t, len(tc.loads))
			for i, c := range tc.kv {
				if c > 0 {
					bs[i].SetKVCacheTokens(c)
				}
			}
			p := NewLLMD(LLMDOptions{})
			p.SetBackends(bs)
			for b, n := range tc.held {
				p.Learn(keyOf(conv[:n]), bs[b], 0)
			}
			loads(t, bs, tc.loads...)
			d := p.Pick(keyOf(conv), bs)
			if d.Backend != bs[tc.want] || d.Reason != tc.reason {
				t.Fatalf("picked %s (%v), want %s (%v)", d.Backend.Name, d.Reason, bs[tc.want].Name, tc.reason)
			}
		})
	}
}

func TestLLMDTiesRotate(t *testing.T) {
	bs := testBackends(t, 3)
	p := NewLLMD(LLMDOptions{})
	p.SetBackends(bs)
	seen := map[string]bool{}
	for range 3 {
		seen[p.Pick(keyOf(chain("cold", 4)), bs).Backend.Name] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three picks among equal scores went to %v, want each candidate once", seen)
	}
}
