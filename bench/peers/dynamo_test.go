package peers

import (
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
)

// TestDynamoCost: each term of Dynamo's cost (selector/default.rs) on hand-made inputs, in
// blocks of 64 tokens.
func TestDynamoCost(t *testing.T) {
	tests := []struct {
		name          string
		credit, scale float64
		isl, overlap  int
		load          workerLoad
		want          float64
	}{
		{"idle, nothing cached: ISL prefill + ISL new blocks", 1, 1, 640, 0, workerLoad{newTokens: 640}, 20},
		{"6 of 10 blocks cached: 4 prefill blocks", 1, 1, 640, 384, workerLoad{newTokens: 640}, 14},
		{"active prefill adds to the raw prefill before the overlap credit", 1, 1, 640, 384, workerLoad{prefillTokens: 320, newTokens: 640}, 9 + 10},
		{"prefill never below 0", 1, 1, 64, 128, workerLoad{}, 0},
		{"blocks already active are not counted again", 1, 1, 640, 640, workerLoad{activeTokens: 640}, 10},
		{"other requests' active blocks count", 1, 1, 640, 640, workerLoad{activeTokens: 320, newTokens: 640}, 15},
		{"prefill_load_scale 2 doubles the prefill term only", 1, 2, 640, 384, workerLoad{newTokens: 640}, 8 + 10},
		{"overlap_score_credit 0.5 halves the cached blocks' credit", 0.5, 1, 640, 384, workerLoad{newTokens: 640}, 7 + 10},
	}
	for _, tc := range tests {
		if got := dynamoCost(tc.credit, tc.scale, 64, tc.isl, tc.overlap, tc.load); got != tc.want {
			t.Errorf("%s: cost %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDynamoActive: the router's own active prefill tokens and active blocks (shared keys
// once) follow routing, first token and end.
func TestDynamoActive(t *testing.T) {
	bs := testBackends(t, 1)
	a := newDynamoActive()
	w := []int32{10, 10, 10}
	l1 := a.add(bs[0], []uint64{1, 2, 3}, w, 30, 0)
	l2 := a.add(bs[0], []uint64{1, 2, 4}, w, 10, 0) // shares keys 1 and 2
	check := func(step string, keys []uint64, want workerLoad) {
		t.Helper()
		got := make([]workerLoad, 1)
		a.loads(bs, keys, w[:len(keys)], got)
		if got[0] != want {
			t.Fatalf("%s: load %+v, want %+v", step, got[0], want)
		}
	}
	check("two active", []uint64{1, 5}, workerLoad{prefillTokens: 40, activeTokens: 40, newTokens: 10})
	a.prefilled(l1)
	check("first prefilled", []uint64{1, 5}, workerLoad{prefillTokens: 10, activeTokens: 40, newTokens: 10})
	a.remove(l1)
	check("first ended", []uint64{3}, workerLoad{prefillTokens: 10, activeTokens: 30, newTokens: 10})
	a.prefilled(l2)
	a.remove(l2)
	a.remove(l2) // a second end is nothing
	check("both ended", []uint64{1}, workerLoad{newTokens: 10})
}

// TestDynamoRules: the dynamo peer's choices on hand-made candidate sets, in 64-token chunks.
// conv is 528 tokens (8.25 blocks), other another 528-token prompt.
func TestDynamoRules(t *testing.T) {
	conv, other := chain("conv", 10), chain("other", 10)
	tests := []struct {
		name   string
		setup  func(p *Dynamo, bs []*backend.Backend)
		rand   int // what the tie breaker returns (0: a later tie replaces the pick)
		want   int
		reason router.Reason
	}{
		{"nobody holds it: the worker without active requests", func(p *Dynamo, bs []*backend.Backend) {
			p.Learn(keyOf(other), bs[0], 0) // active, in prefill
		}, 1, 1, router.ReasonLeastLoad},
		{"an idle holder (8.25) beats an idle cold worker (16.5)", func(p *Dynamo, bs []*backend.Backend) {
			p.Finished(nil, bs[0], p.Learn(keyOf(conv), bs[0], 0))
		}, 1, 0, router.ReasonMatch},
		{"a holder prefilling another 8.25 blocks costs 24.75: the cold worker (16.5)", func(p *Dynamo, bs []*backend.Backend) {
			p.Finished(nil, bs[0], p.Learn(keyOf(conv), bs[0], 0))
			p.Learn(keyOf(other), bs[0], 0)
		}, 1, 1, router.ReasonLeastLoad},
		{"once that request prefilled, 16.5 each: the tie goes to the later one when the draw says so", func(p *Dynamo, bs []*backend.Backend) {
			p.Finished(nil, bs[0], p.Learn(keyOf(conv), bs[0], 0))
			p.Prefilled(nil, bs[0], p.Learn(keyOf(other), bs[0], 0))
		}, 0, 1, router.ReasonLeastLoad},
		{"the same tie kept by the first when the draw says so", func(p *Dynamo, bs []*backend.Backend) {
			p.Finished(nil, bs[0], p.Learn(keyOf(conv), bs[0], 0))
			p.Prefilled(nil, bs[0], p.Learn(keyOf(other), bs[0], 0))
		}, 1, 0, router.ReasonMatch},
		{"an active request sharing the prefix adds only the new blocks (8.25), the cold one 16.5", func(p *Dynamo, bs []*backend.Backend) {
			p.Prefilled(nil, bs[0], p.Learn(keyOf(conv[:8]), bs[0], 0)) // 400 tokens active
			p.Finished(nil, bs[0], p.Learn(keyOf(conv), bs[0], 0))
			p.Prefilled(nil, bs[1], p.Learn(keyOf(other[:3]), bs[1], 0)) // 80 tokens active
		}, 1, 0, router.ReasonMatch},
		{"a refused request is withdrawn: nothing active, nothing held", func(p *Dynamo, bs []*backend.Backend) {
			l := p.Learn(keyOf(conv), bs[1], 0)
			p.Unlearn(keyOf(conv), bs[1], l)
			p.Prefilled(nil, bs[0], p.Learn(keyOf(other[:1]), bs[0], 0))
		}, 1, 1, router.ReasonLeastLoad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := testBackends(t, 2)
			p := NewDynamo(DynamoOptions{Rand: func(int) int { return tc.rand }})
			p.SetBackends(bs)
			tc.setup(p, bs)
			d := p.Pick(keyOf(conv), bs)
			if d.Backend != bs[tc.want] || d.Reason != tc.reason {
				t.Fatalf("picked %s (%v), want %s (%v)", d.Backend.Name, d.Reason, bs[tc.want].Name, tc.reason)
			}
		})
	}
}

func TestPickMin(t *testing.T) {
	tests := []struct {
		costs []float64
		draw  int
		want  int
	}{
		{[]float64{3, 1, 2}, 1, 1},
		{[]float64{1, 1, 1}, 1, 0}, // no draw is 0: the first stays
		{[]float64{1, 1, 1}, 0, 2}, // every draw is 0: the last tie replaces
		{[]float64{2, 1, 1, 0.5}, 0, 3},
	}
	for _, tc := range tests {
		if got := pickMin(tc.costs, func(int) int { return tc.draw }); got != tc.want {
			t.Errorf("pickMin(%v, draw %d) = %d, want %d", tc.costs, tc.draw, got, tc.want)
		}
	}
}
