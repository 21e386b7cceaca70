package sim

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// spec is one request of a prediction scenario: shared prefix tokens (the same ids in every
// request that has them), then own tokens unique to the request.
type spec struct{ shared, own, max int }

func (s spec) prompt(id int) []uint32 {
	p := make([]uint32, 0, s.shared+s.own)
	for i := range s.shared {
		p = append(p, uint32(1+i))
	}
	for i := range s.own {
		p = append(p, uint32(1_000_000*(id+1)+i))
	}
	return p
}

// predictScenario builds an engine state: reqs added at time 0, steps engine steps run, and
// (planned) one more step planned but not completed.
type predictScenario struct {
	name    string
	cfg     func(*Config)
	reqs    []spec
	steps   int
	planned bool
	probe   spec
}

// build runs the scenario on a fresh engine and returns it with the model time now and the
// duration of the planned step (0 if none).
func (sc predictScenario) build(t *testing.T) (*Engine, time.Duration, time.Duration) {
	t.Helper()
	cfg := DefaultConfig()
	if sc.cfg != nil {
		sc.cfg(&cfg)
	}
	e := NewEngine(cfg)
	for i, s := range sc.reqs {
		if err := e.Add(NewRequest(s.prompt(i), s.max, 7, false, false), 0); err != nil {
			t.Fatalf("add %d: %v", i, err)
		}
	}
	now := time.Duration(0)
	for range sc.steps {
		d, ok := e.Schedule()
		if !ok {
			break
		}
		now += d
		e.Complete(now)
	}
	var planned time.Duration
	if sc.planned {
		planned, _ = e.Schedule()
	}
	return e, now, planned
}

// bruteTTFT adds the probe to the engine and runs it until the probe's first token.
func bruteTTFT(t *testing.T, e *Engine, now, planned time.Duration, probe *Request, before ...*Request) time.Duration {
	t.Helper()
	for _, r := range before {
		if err := e.Add(r, now); err != nil {
			t.Fatalf("add pending: %v", err)
		}
	}
	if err := e.Add(probe, now); err != nil {
		t.Fatalf("add probe: %v", err)
	}
	if planned > 0 {
		now += planned
		e.Complete(now)
	}
	for i := 0; probe.Generated() == 0; i++ {
		if i > 1_000_000 {
			t.Fatal("probe never got a first token")
		}
		d, ok := e.Schedule()
		if !ok {
			t.Fatal("engine stalled before the probe's first token")
		}
		now += d
		e.Complete(now)
	}
	return probe.TTFT()
}

// TestPredictMatchesBruteForce: with no later arrivals, Predict gives exactly the TTFT the
// engine then produces when the request is added and the engine is run (brute force on a
// second engine built identically).
func TestPredictMatchesBruteForce(t *testing.T) {
	small := func(c *Config) { c.NumGPUBlocks = 600 } // 9600 tokens: admissions wait for blocks
	tiny := func(c *Config) { c.MaxNumBatchedTokens = 512; c.MaxNumSeqs = 4 }
	for _, sc := range []predictScenario{
		{name: "idle", probe: spec{own: 3000, max: 10}},
		{name: "cached prefix", reqs: []spec{{shared: 4000, own: 10, max: 2}}, steps: 10, probe: spec{shared: 4000, own: 50, max: 10}},
		{name: "queue of prefills", reqs: []spec{{own: 9000, max: 20}, {own: 7000, max: 5}, {own: 3000, max: 50}}, probe: spec{own: 2000, max: 10}},
		{name: "decoders slow the steps", reqs: []spec{{own: 100, max: 400}, {own: 100, max: 400}, {own: 100, max: 400}, {own: 2000, max: 400}}, steps: 5, probe: spec{own: 12000, max: 5}},
		{name: "step in flight", reqs: []spec{{own: 6000, max: 30}, {shared: 3000, own: 100, max: 8}}, steps: 1, planned: true, probe: spec{shared: 3000, own: 500, max: 4}},
		{name: "blocks free only when requests finish", cfg: small, reqs: []spec{{own: 4000, max: 30}, {own: 4000, max: 60}}, steps: 3, probe: spec{own: 3000, max: 10}},
		{name: "a waiting request gains the prefix of one ahead", cfg: tiny, reqs: []spec{{shared: 3000, own: 10, max: 3}, {shared: 3000, own: 400, max: 3}}, probe: spec{shared: 3000, own: 40, max: 2}},
		{name: "a decode preempts the request ahead, which recomputes first", cfg: func(c *Config) { c.NumGPUBlocks = 20 },
			reqs: []spec{{own: 160, max: 20}, {own: 120, max: 60}}, steps: 1, probe: spec{own: 60, max: 2}},
		{name: "budget and seat limits", cfg: tiny, reqs: []spec{{own: 700, max: 9}, {own: 300, max: 40}, {own: 900, max: 3}, {own: 200, max: 12}, {own: 600, max: 7}}, steps: 2, planned: true, probe: spec{own: 1000, max: 2}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			e, now, planned := sc.build(t)
			probe := sc.probe.prompt(99)
			got := e.Predict(probe, 7, sc.probe.max, planned, nil)
			if !got.OK {
				t.Fatalf("Predict: not OK (%+v)", got)
			}
			e2, now2, planned2 := sc.build(t)
			if now2 != now || planned2 != planned {
				t.Fatalf("scenario is not deterministic: now %v/%v planned %v/%v", now, now2, planned, planned2)
			}
			rq := NewRequest(sc.probe.prompt(99), sc.probe.max, 7, false, false)
			want := bruteTTFT(t, e2, now2, planned2, rq)
			if got.TTFT != want {
				t.Errorf("Predict TTFT %v, engine %v", got.TTFT, want)
			}
			if got.CachedTokens != rq.CachedTokens() {
				t.Errorf("Predict cached %d, engine %d", got.CachedTokens, rq.CachedTokens())
			}
		})
	}
}

// TestPredictLeavesEngineUnchanged: predicting twice gives the same answer and the engine's
// own run afterwards is what it would have been without the predictions.
func TestPredictLeavesEngineUnchanged(t *testing.T) {
	sc := predictScenario{reqs: []spec{{own: 9000, max: 20}, {shared: 2000, own: 10, max: 30}}, steps: 2, planned: true,
		probe: spec{shared: 2000, own: 100, max: 5}}
	e, now, planned := sc.build(t)
	a := e.Predict(sc.probe.prompt(1), 7, sc.probe.max, planned, nil)
	b := e.Predict(sc.probe.prompt(1), 7, sc.probe.max, planned, nil)
	if a != b {
		t.Fatalf("two predictions differ: %+v vs %+v", a, b)
	}
	e2, _, _ := sc.build(t)
	r1 := NewRequest(sc.probe.prompt(1), sc.probe.max, 7, false, false)
	r2 := NewRequest(sc.probe.prompt(1), sc.probe.max, 7, false, false)
	if x, y := bruteTTFT(t, e, now, planned, r1), bruteTTFT(t, e2, now, planned, r2); x != y {
		t.Fatalf("the engine that was asked to predict ran differently: %v vs %v", x, y)
	}
}

// TestPredictBlocked: a request whose blocks never fit (nothing running to free any) is not OK.
func TestPredictBlocked(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NumGPUBlocks = 100 // 1600 tokens
	e := NewEngine(cfg)
	if p := e.Predict(make([]uint32, 1700), 7, 10, 0, nil); p.OK {
		t.Fatalf("a request larger than the KV cache predicted OK: %+v", p)
	}
	if p := e.Predict(nil, 7, 10, 0, nil); p.OK {
		t.Fatalf("an empty prompt predicted OK: %+v", p)
	}
}

// TestPredictMatchesBruteForceRandom: the same agreement on seeded random states (mixed
// shared prefixes, sizes, small budgets and caches, a step in flight or not, up to two
// requests pending ahead of the new one).
func TestPredictMatchesBruteForceRandom(t *testing.T) {
	rnd := rand.New(rand.NewPCG(14, 15))
	for i := range 200 {
		blocks := 2000 + rnd.IntN(30000)
		budget := 256 + rnd.IntN(8192)
		seqs := 2 + rnd.IntN(64)
		sc := predictScenario{
			name:    fmt.Sprint(i),
			cfg:     func(c *Config) { c.NumGPUBlocks, c.MaxNumBatchedTokens, c.MaxNumSeqs = blocks, budget, seqs },
			steps:   rnd.IntN(40),
			planned: rnd.IntN(2) == 0,
		}
		draw := func() spec {
			return spec{shared: []int{0, 0, 500, 4000}[rnd.IntN(4)], own: 1 + rnd.IntN(6000), max: 1 + rnd.IntN(200)}
		}
		for range rnd.IntN(12) {
			sc.reqs = append(sc.reqs, draw())
		}
		sc.probe = draw()
		var pending []Pending
		var before []*Request
		for j := range rnd.IntN(3) {
			ps := draw()
			pending = append(pending, NewPending(ps.prompt(50+j), 7, ps.max, DefaultConfig().BlockSize))
			before = append(before, NewRequest(ps.prompt(50+j), ps.max, 7, false, false))
		}
		e, now, planned := sc.build(t)
		got := e.Predict(sc.probe.prompt(99), 7, sc.probe.max, planned, pending)
		e2, now2, planned2 := sc.build(t)
		rq := NewRequest(sc.probe.prompt(99), sc.probe.max, 7, false, false)
		want := bruteTTFT(t, e2, now2, planned2, rq, before...)
		if !got.OK || got.TTFT != want || got.CachedTokens != rq.CachedTokens() {
			t.Errorf("scenario %d (%+v, blocks %d budget %d seqs %d): Predict %+v, engine TTFT %v cached %d (now %v)",
				i, sc.reqs, blocks, budget, seqs, got, want, rq.CachedTokens(), now)
		}
	}
}
