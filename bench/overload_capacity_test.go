package bench

import (
	"math"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// The overload workload's rates rest on workload.StepCost.RequestCost being what a saturated
// sim engine spends per request. Drive the sims' own engine in model time (no clock, no
// sockets) over the workload's mix, every request queued at once so every step is full, and
// compare the model time it takes with the sum of the predicted costs.
func TestOverloadCostMatchesEngine(t *testing.T) {
	cfg := sim.DefaultConfig()
	cost := workload.StepCost{StepBase: cfg.StepBase, PrefillPerToken: cfg.PrefillPerToken,
		PrefillPerTokenPerKContext: cfg.PrefillPerTokenPerKContext, DecodePerSeq: cfg.DecodePerSeq,
		DecodePerContextToken: cfg.DecodePerContextToken, BudgetTokens: cfg.MaxNumBatchedTokens}
	e := sim.NewEngine(cfg)
	seed := sim.ChainSeed(cfg.Model, "")
	r := workload.NewRand(7)
	ids := func(prefix []uint32, n int) []uint32 {
		p := append([]uint32(nil), prefix...)
		for range n {
			p = append(p, 1000+uint32(r.IntN(30000)))
		}
		return p
	}
	instruction, system := ids(nil, workload.BatchInstructionTokens), ids(nil, workload.ChatSystemTokens)
	var predicted time.Duration
	var reqs []*sim.Request
	add := func(prefix []uint32, uncached, out int) {
		q := sim.NewRequest(ids(prefix, uncached), out, seed, false, false)
		if err := e.Add(q, 0); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, q)
		predicted += cost.RequestCost(len(prefix), uncached, out)
	}
	// The overload mix by request count: 8.2 batch jobs to 34.7 chat turns (noisy included).
	for i := range 40 {
		add(instruction, workload.BatchDocMin+r.IntN(workload.BatchDocMax-workload.BatchDocMin+1), workload.BatchOutputTokens)
		for range 4 + btoi(i%5 == 0) { // 4.2 chat turns per batch job
			add(system, workload.ChatFirstTokens, workload.ChatOutputTokens)
		}
	}
	// The first batch job and chat turn prefill their shared prefix: not in the prediction.
	predicted += cost.RequestCost(0, len(instruction), 1) + cost.RequestCost(0, len(system), 1)
	now := time.Duration(0)
	for steps := 0; ; steps++ {
		d, ok := e.Schedule()
		if !ok {
			break
		}
		now += d
		e.Complete(now)
		if steps > 1_000_000 {
			t.Fatal("engine did not drain")
		}
	}
	for _, q := range reqs {
		if !q.Done() || q.Generated() != q.MaxTokens() {
			t.Fatalf("request not finished: %d of %d tokens", q.Generated(), q.MaxTokens())
		}
	}
	// The drain's last steps decode a few sequences each and share StepBase among fewer tokens
	// than a saturated step: the engine measured 8% over the prediction here.
	ratio := float64(now) / float64(predicted)
	t.Logf("engine %.2f s of model time, predicted %.2f s (ratio %.3f) for %d requests", now.Seconds(), predicted.Seconds(), ratio, len(reqs))
	if math.Abs(ratio-1) > 0.10 {
		t.Fatalf("engine took %.3f× the predicted model time; the overload rates would not give the load they claim", ratio)
	}
}
