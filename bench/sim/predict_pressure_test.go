package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPredictUnderKVPressure: on seeded random states with small caches and long outputs,
// where the engine preempts, Predict stays close and errs optimistic (it does not model the
// evictions that take a preempted request's deepest blocks, see Predict); where the engine does
// not preempt before the probe's first token, it is mostly exact (the misses are the shared
// blocks and evictions it does not track).
func TestPredictUnderKVPressure(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	var n, pre, match, matchPre, optimistic int
	var ratios []float64
	var exactNoPre int
	for i := range 400 {
		blocks := 300 + rnd.IntN(1500)
		budget := 256 + rnd.IntN(4096)
		seqs := 2 + rnd.IntN(32)
		sc := predictScenario{
			name:    fmt.Sprint(i),
			cfg:     func(c *Config) { c.NumGPUBlocks, c.MaxNumBatchedTokens, c.MaxNumSeqs = blocks, budget, seqs },
			steps:   rnd.IntN(200),
			planned: rnd.IntN(2) == 0,
		}
		draw := func() spec {
			return spec{shared: []int{0, 0, 500, 2000}[rnd.IntN(4)], own: 1 + rnd.IntN(3000), max: 1 + rnd.IntN(2000)}
		}
		for range rnd.IntN(12) {
			sc.reqs = append(sc.reqs, draw())
		}
		sc.probe = draw()
		if (sc.probe.shared+sc.probe.own+sc.probe.max+15)/16 > blocks {
			continue
		}
		ok := true
		for _, r := range sc.reqs {
			if (r.shared+r.own+r.max+15)/16 > blocks {
				ok = false
			}
		}
		if !ok {
			continue
		}
		e, now, planned := sc.build(t)
		got := e.Predict(sc.probe.prompt(99), 7, sc.probe.max, planned, nil)
		e2, now2, planned2 := sc.build(t)
		p0 := e2.stats.Preemptions
		rq := NewRequest(sc.probe.prompt(99), sc.probe.max, 7, false, false)
		want := bruteTTFT(t, e2, now2, planned2, rq)
		_ = now
		n++
		hadPre := e2.stats.Preemptions > p0
		if hadPre {
			pre++
		}
		if got.OK && got.TTFT == want {
			match++
			if hadPre {
				matchPre++
			}
		} else if got.TTFT < want {
			optimistic++
		}
		if hadPre && got.OK {
			ratios = append(ratios, float64(got.TTFT)/float64(want))
		}
		if !hadPre && got.OK && got.TTFT == want {
			exactNoPre++
		}
	}
	slices.Sort(ratios)
	if len(ratios) < 50 {
		t.Fatalf("only %d scenarios preempted: the test no longer exercises preemption", len(ratios))
	}
	p10, p50, p90 := ratios[len(ratios)/10], ratios[len(ratios)/2], ratios[len(ratios)*9/10]
	t.Logf("%d scenarios, %d with preemption before the probe's first token; exact %d (%d with preemption, %d without); optimistic %d",
		n, pre, match, matchPre, exactNoPre, optimistic)
	t.Logf("predicted/actual TTFT where the engine preempts: p10 %.3f p50 %.3f p90 %.3f min %.3f max %.3f", p10, p50, p90, ratios[0], ratios[len(ratios)-1])
	if p50 < 0.95 || p50 > 1 || p90 > 1.01 || p10 < 0.75 {
		t.Errorf("under preemption Predict is no longer close and optimistic: p10 %.3f p50 %.3f p90 %.3f", p10, p50, p90)
	}
	if float64(exactNoPre) < 0.95*float64(n-pre) {
		t.Errorf("exact in %d of %d scenarios without preemption, want ≥ 95%%", exactNoPre, n-pre)
	}
}
