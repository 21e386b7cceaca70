package sim

import (
	"math/rand/v2"
	"testing"
	"time"
)

// overloadLoad is the per-replica offered load of the bench's overload workload
// (bench/workload/overload.go at --load 2 on 2 replicas): chat-shaped requests (a tenant's
// 150-token system prompt, a question and history, 128 tokens out) at chatRate per second of
// model time, document jobs (a shared 200-token instruction, a 4000–8000-token document, 256
// out) at batchRate; a request still without its first token after its tenant's patience is
// aborted, as the bench's clients give up.
type overloadLoad struct {
	chatRate, batchRate          float64
	chatPatience, batchPatience  time.Duration
	blocks, budget, seqs, outMul int // engine overrides (0: default); outMul scales max_tokens
}

var overloadDefault = overloadLoad{chatRate: 17.3, batchRate: 4.11, chatPatience: 10 * time.Second, batchPatience: 60 * time.Second}

// overloadState drives an engine with l's arrivals for dur of model time from seed, and returns
// it with the time left in a planned step (planned: a step planned but not completed, as a
// replica's engine is between Schedule and Complete most of the time).
func overloadState(tb testing.TB, l overloadLoad, seed uint64, dur time.Duration, planned bool) (*Engine, time.Duration) {
	tb.Helper()
	cfg := DefaultConfig()
	if l.blocks > 0 {
		cfg.NumGPUBlocks = l.blocks
	}
	if l.budget > 0 {
		cfg.MaxNumBatchedTokens = l.budget
	}
	if l.seqs > 0 {
		cfg.MaxNumSeqs = l.seqs
	}
	mul := max(l.outMul, 1)
	e := NewEngine(cfg)
	rnd := rand.New(rand.NewPCG(seed, 56))
	next := func(rate float64) time.Duration { return time.Duration(rnd.ExpFloat64() / rate * float64(time.Second)) }
	type live struct {
		r        *Request
		deadline time.Duration
	}
	var lives []live
	id := 0
	add := func(now time.Duration, batch bool) {
		id++
		var p []uint32
		var maxTok int
		var patience time.Duration
		if batch {
			p = overloadPrompt(0, 200, id, 4000+rnd.IntN(4001))
			maxTok, patience = 256*mul, l.batchPatience
		} else {
			p = overloadPrompt(1+rnd.IntN(2), 150, id, 130+rnd.IntN(600))
			maxTok, patience = 128*mul, l.chatPatience
		}
		if maxTok+len(p) > cfg.NumGPUBlocks*cfg.BlockSize {
			return
		}
		r := NewRequest(p, maxTok, 7, false, false)
		if err := e.Add(r, now); err != nil {
			tb.Fatal(err)
		}
		lives = append(lives, live{r, now + patience})
	}
	now := time.Duration(0)
	nextChat, nextBatch := next(l.chatRate), next(l.batchRate)
	for now < dur {
		for nextChat <= now {
			add(nextChat, false)
			nextChat += next(l.chatRate)
		}
		for nextBatch <= now {
			add(nextBatch, true)
			nextBatch += next(l.batchRate)
		}
		n := 0
		for _, lv := range lives {
			switch {
			case lv.r.Done():
			case lv.r.Generated() == 0 && now >= lv.deadline:
				e.Abort(lv.r)
			default:
				lives[n] = lv
				n++
			}
		}
		lives = lives[:n]
		d, ok := e.Schedule()
		if !ok {
			now = min(nextChat, nextBatch)
			continue
		}
		now += d
		e.Complete(now)
	}
	var left time.Duration
	if planned {
		d, _ := e.Schedule()
		left = d / 2
	}
	return e, left
}

// overloadPrompt is a prompt of a tenant's shared prefix (shared tokens, the same for every
// request of tenant) and own tokens unique to request id.
func overloadPrompt(tenant, shared, id, own int) []uint32 {
	p := make([]uint32, 0, shared+own)
	for i := range shared {
		p = append(p, uint32(10_000_000*(tenant+1)+i))
	}
	for i := range own {
		p = append(p, uint32(100_000_000+1_000_000*id+i))
	}
	return p
}

// BenchmarkPredictOverload: one PredictPending (what the oracle does per candidate, under the
// replica's lock) on an engine in the state the bench's overload workload leaves it in after
// a minute of model time at 2× its capacity: a long waiting queue, a full KV cache, requests
// preempted; the probe is a chat turn and a document job, as the workload sends.
func BenchmarkPredictOverload(b *testing.B) {
	e, left := overloadState(b, overloadDefault, 1, time.Minute, true)
	st := e.Stats()
	b.Logf("state: %d running, %d waiting, %d/%d blocks used, %d preemptions", st.Running, st.Waiting, st.UsedBlocks, st.TotalBlocks, st.Preemptions)
	bs := e.cfg.BlockSize
	for _, pr := range []struct {
		name string
		q    Pending
	}{
		{"chat", NewPending(overloadPrompt(1, 150, 1<<20, 400), 7, 128, bs)},
		{"batch", NewPending(overloadPrompt(0, 200, 1<<20, 6000), 7, 256, bs)},
	} {
		b.Run(pr.name, func(b *testing.B) {
			var p Prediction
			for b.Loop() {
				p = e.PredictPending(pr.q, left, nil)
			}
			b.ReportMetric(float64(p.TTFT)/1e6, "ttft-model-ms")
			if !p.OK {
				b.Log("not OK")
			}
		})
	}
}

// BenchmarkPredictOverloadRef is BenchmarkPredictOverload on the request-by-request walk
// (predictRef), for the speedup on the same machine.
func BenchmarkPredictOverloadRef(b *testing.B) {
	e, left := overloadState(b, overloadDefault, 1, time.Minute, true)
	q := NewPending(overloadPrompt(1, 150, 1<<20, 400), 7, 128, e.cfg.BlockSize)
	for b.Loop() {
		_ = e.predictRef(q, left, nil)
	}
}

// TestPredictFastMatchesReference: on seeded saturated engine states (the overload mix at 2×
// and 3× a replica's capacity, with small KV caches, small budgets and long outputs that
// preempt), with requests pending and probes that share prefixes with requests running,
// waiting and pending, the walk predicts exactly what the request-by-request walk
// (predictRef) does.
func TestPredictFastMatchesReference(t *testing.T) {
	rnd := rand.New(rand.NewPCG(56, 1))
	loads := []overloadLoad{
		overloadDefault,
		{chatRate: 26, batchRate: 6.2, chatPatience: 10 * time.Second, batchPatience: 60 * time.Second},
		{chatRate: 17.3, batchRate: 4.11, chatPatience: 20 * time.Second, batchPatience: 60 * time.Second, blocks: 3000},
		{chatRate: 8, batchRate: 2, chatPatience: 30 * time.Second, batchPatience: 60 * time.Second, blocks: 2000, budget: 2048, seqs: 48, outMul: 6},
		{chatRate: 12, batchRate: 1, chatPatience: 30 * time.Second, batchPatience: 30 * time.Second, blocks: 1200, budget: 512, seqs: 16, outMul: 3},
	}
	compared, preempting := 0, 0
	for li, l := range loads {
		for seed := range uint64(3) {
			e, left := overloadState(t, l, seed+10*uint64(li), time.Duration(15+rnd.IntN(30))*time.Second, seed%2 == 0)
			if e.Stats().Preemptions > 0 {
				preempting++
			}
			bs := e.cfg.BlockSize
			// Prompts to share: those of requests running and waiting now.
			var others [][]uint32
			for _, r := range e.running {
				others = append(others, r.tokens[:r.promptLen])
			}
			for i := e.whead; i < len(e.waiting); i++ {
				if r := e.waiting[i]; r != nil && r.state == stateWaiting {
					others = append(others, r.tokens[:r.promptLen])
				}
			}
			probe := func(id int) ([]uint32, int) {
				max := 1 + rnd.IntN(300)
				switch k := rnd.IntN(4); {
				case k == 0 || len(others) == 0:
					return overloadPrompt(rnd.IntN(3), 150, id, 50+rnd.IntN(6000)), max
				default: // a prefix of another request's prompt, then its own tokens
					o := others[rnd.IntN(len(others))]
					p := append([]uint32(nil), o[:rnd.IntN(len(o)+1)]...)
					p = append(p, overloadPrompt(3, 0, id, 1+rnd.IntN(500))...)
					return p, max
				}
			}
			for k := range 8 {
				var pending []Pending
				for j := range rnd.IntN(4) {
					p, m := probe(1<<20 + 10*k + j)
					pending = append(pending, NewPending(p, 7, m, bs))
					others = append(others, p)
				}
				p, m := probe(1<<21 + k)
				if (len(p)+m+bs-1)/bs > e.cfg.NumGPUBlocks {
					continue
				}
				q := NewPending(p, 7, m, bs)
				want := e.predictRef(q, left, pending)
				got := e.PredictPending(q, left, pending)
				compared++
				if got != want {
					t.Errorf("load %d seed %d probe %d (%d tokens, max %d, %d pending): walk %+v, reference %+v",
						li, seed, k, len(p), m, len(pending), got, want)
				}
			}
		}
	}
	// The small random states of TestPredictUnderKVPressure too (preemption-heavy, planned
	// steps, shared prefixes).
	for i := range 300 {
		blocks := 300 + rnd.IntN(1500)
		budget := 256 + rnd.IntN(4096)
		seqs := 2 + rnd.IntN(32)
		sc := predictScenario{
			cfg:     func(c *Config) { c.NumGPUBlocks, c.MaxNumBatchedTokens, c.MaxNumSeqs = blocks, budget, seqs },
			steps:   rnd.IntN(200),
			planned: rnd.IntN(2) == 0,
		}
		draw := func() spec {
			return spec{shared: []int{0, 0, 500, 2000}[rnd.IntN(4)], own: 1 + rnd.IntN(3000), max: 1 + rnd.IntN(2000)}
		}
		for range rnd.IntN(24) {
			if r := draw(); (r.shared+r.own+r.max+15)/16 <= blocks {
				sc.reqs = append(sc.reqs, r)
			}
		}
		sc.probe = draw()
		if (sc.probe.shared+sc.probe.own+sc.probe.max+15)/16 > blocks {
			continue
		}
		var pending []Pending
		for j := range rnd.IntN(3) {
			if ps := draw(); (ps.shared+ps.own+ps.max+15)/16 <= blocks {
				pending = append(pending, NewPending(ps.prompt(50+j), 7, ps.max, 16))
			}
		}
		e, _, planned := sc.build(t)
		q := NewPending(sc.probe.prompt(99), 7, sc.probe.max, 16)
		compared++
		if got, want := e.PredictPending(q, planned, pending), e.predictRef(q, planned, pending); got != want {
			t.Errorf("scenario %d (%+v, blocks %d budget %d seqs %d): walk %+v, reference %+v", i, sc.reqs, blocks, budget, seqs, got, want)
		}
	}
	if preempting < 3 {
		t.Errorf("only %d of the states preempted: the test no longer exercises KV pressure", preempting)
	}
	t.Logf("%d predictions compared; %d of %d overload states had preempted", compared, preempting, 3*len(loads))
}
