package peers

import (
	"testing"

	"github.com/prefixlb/prefixlb/router"
)

func TestDynamoRules(t *testing.T) {
	conv := chain("conv", 10) // 528 tokens: 8.25 blocks of 64
	tests := []struct {
		name    string
		weight  float64
		held    map[int]int // backend → leading chunks of conv it holds
		loads   []int       // in flight
		scraped []int64     // the replica's reported running + waiting (nil: none)
		want    int         // -1: either of the two
		reason  router.Reason
	}{
		// cost = weight × uncached blocks + load × 8.25 (the mean of the one request seen)
		{"nobody holds it: the least loaded", 1, nil, []int{2, 1, 3}, nil, 1, router.ReasonLeastLoad},
		{"a holder as loaded as the rest: the holder", 1, map[int]int{2: 10}, []int{1, 1, 1}, nil, 2, router.ReasonMatch},
		{"an idle holder of all of it beats an idle cold one", 1, map[int]int{0: 10}, []int{0, 0}, nil, 0, router.ReasonMatch},
		{"a holder two requests busier costs 16.5 against 8.25: the cold one", 1, map[int]int{0: 10}, []int{2, 0}, nil, 1, router.ReasonLeastLoad},
		{"overlap weight 3 makes the cold one's prefill cost 24.75: the holder", 3, map[int]int{0: 10}, []int{2, 0}, nil, 0, router.ReasonMatch},
		{"a partial holder: 5 of 10 chunks (5 blocks uncached) at load 0 beats a full one at load 1",
			1, map[int]int{0: 10, 1: 5}, []int{1, 0}, nil, 1, router.ReasonMatch},
		{"the scraped load counts when above the proxy's own", 1, map[int]int{0: 10}, []int{0, 0}, []int64{2, 0}, 1, router.ReasonLeastLoad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := testBackends(t, len(tc.loads))
			p := NewDynamo(DynamoOptions{OverlapWeight: tc.weight})
			p.SetBackends(bs)
			for b, n := range tc.held {
				p.Learn(keyOf(conv[:n]), bs[b], 0)
			}
			loads(t, bs, tc.loads...)
			for i, s := range tc.scraped {
				bs[i].SetScrapedLoad(s, 0)
			}
			d := p.Pick(keyOf(conv), bs)
			if d.Backend != bs[tc.want] || d.Reason != tc.reason {
				t.Fatalf("picked %s (%v), want %s (%v)", d.Backend.Name, d.Reason, bs[tc.want].Name, tc.reason)
			}
		})
	}
}

func TestDynamoMeanBlocks(t *testing.T) {
	p := NewDynamo(DynamoOptions{})
	if m := p.mean.Observe(8); m != 8 {
		t.Fatalf("first request: mean %v, want its own 8 blocks", m)
	}
	if m := p.mean.Observe(40); m != 8+32.0/32 { // router.RunningMean weighs a new value 1/32
		t.Fatalf("second request: mean %v, want %v", m, 8+32.0/32)
	}
}
