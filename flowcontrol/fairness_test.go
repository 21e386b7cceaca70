package flowcontrol

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// jain is Jain's fairness index of xs: 1 when all are equal, 1/n when one has everything.
func jain(xs ...float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// tenant sends requests to the simulated pool: rate requests per tick, each with a
// predicted cost and the cost it really has (actual output = predicted × outputError).
type tenant struct {
	flow            string
	rate            int
	prefill, output [2]int // uniform ranges, tokens
	outputError     float64
}

// fleetSim drives a queue as the proxy will: each tick the tenants push, then the fleet's
// capacity (work per tick) dispatches from the head of the queue; responses end (Settle
// with the actual cost) inFlightTicks later. It returns each flow's GPU work served
// (actual) over the ticks where every tenant was backlogged, and per flow the refusals and
// displacements it got while it held less than half the queue (a flow holding half the
// queue is past any fair claim on it).
func fleetSim(t *testing.T, q *Queue, tenants []tenant, capacity int64, ticks int, seed uint64) (served map[string]float64, refused map[string]int, bothTicks int) {
	t.Helper()
	const inFlightTicks = 3
	rng := rand.New(rand.NewPCG(seed, seed+1))
	uniform := func(r [2]int) int { return r[0] + rng.IntN(r[1]-r[0]+1) }
	type running struct {
		it     *Item
		actual Cost
		ends   int
	}
	var inflight []running
	actual := map[*Item]Cost{}
	served, refused = map[string]float64{}, map[string]int{}
	var budget int64
	for tick := range ticks {
		for len(inflight) > 0 && inflight[0].ends <= tick {
			q.Settle(inflight[0].it, inflight[0].actual)
			inflight = inflight[1:]
		}
		for _, tn := range tenants {
			for range tn.rate {
				c := Cost{UncachedPrefillTokens: uniform(tn.prefill), OutputTokens: uniform(tn.output)}
				it := &Item{Flow: tn.flow, Cost: c}
				if err := q.Push(it, true); err != nil {
					// A refusal is fair only while the flow holds at least half the queue.
					if f := q.byPrio[0].flows[tn.flow]; f == nil || 2*f.count < q.cfg.MaxItems {
						refused[tn.flow]++
					}
					continue
				}
				actual[it] = Cost{UncachedPrefillTokens: c.UncachedPrefillTokens, OutputTokens: int(float64(c.OutputTokens) * tn.outputError)}
			}
		}
		all := true
		for _, tn := range tenants {
			if f := q.byPrio[0].flows[tn.flow]; f == nil || f.count == 0 {
				all = false
			}
		}
		if all {
			bothTicks++
		}
		budget += capacity
		for budget > 0 {
			it := q.Next(t0)
			if it == nil {
				budget = 0
				break
			}
			q.Dispatched(it)
			<-it.Done()
			a := actual[it]
			delete(actual, it)
			w := q.cfg.PrefillWeight*int64(a.UncachedPrefillTokens) + q.cfg.DecodeWeight*int64(a.OutputTokens)
			budget -= w
			if all {
				served[it.Flow] += float64(w)
			}
			inflight = append(inflight, running{it, a, tick + inFlightTicks})
		}
		// Displaced items' outcomes are read so nothing blocks; they are refusals.
		for it := range actual {
			select {
			case o := <-it.Done():
				if o != Displaced {
					t.Fatalf("queued item got %v", o)
				}
				if 2*q.byPrio[0].flows[it.Flow].count+2 < q.cfg.MaxItems {
					refused[it.Flow]++
				}
				delete(actual, it)
			default:
			}
		}
	}
	return served, refused, bothTicks
}

// Two equal-priority flows, one sending 10× the other's rate, both backlogged: the virtual
// token counter gives each half the GPU work (within 10% of equal, Jain ≥ 0.95), charged by
// the work each request really costs. A FIFO queue (one flow) is run beside it to show
// what the counter changes.
func TestVTCFairnessTenfold(t *testing.T) {
	chat := tenant{"light", 1, [2]int{200, 2000}, [2]int{50, 400}, 1}
	for _, tc := range []struct {
		name  string
		heavy tenant
		light tenant
	}{
		{"10x rate, same costs", tenant{"heavy", 10, [2]int{200, 2000}, [2]int{50, 400}, 1}, chat},
		// The heavy flow predicts an eighth of the tokens it generates; Settle charges the
		// real work, so its share is still half.
		{"10x rate, heavy under-predicts output 8x", tenant{"heavy", 10, [2]int{200, 2000}, [2]int{10, 60}, 8}, chat},
		// The heavy flow's prompts hit the KV cache (100-200 uncached tokens): it is charged
		// what it costs, so it gets more requests through for the same work.
		{"10x rate, heavy reuses its cache", tenant{"heavy", 10, [2]int{100, 200}, [2]int{50, 400}, 1}, chat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew(t, Config{})
			// Capacity 1.6× the light flow's own demand: half of it is less than the light
			// flow asks for, so both stay backlogged.
			lightWork := float64((tc.light.prefill[0]+tc.light.prefill[1])/2 + 2*(tc.light.output[0]+tc.light.output[1])/2)
			capacity := int64(1.6 * lightWork * float64(tc.light.rate))
			served, refused, both := fleetSim(t, q, []tenant{tc.heavy, tc.light}, capacity, 3000, 7)
			h, l := served["heavy"], served["light"]
			share := l / (h + l)
			j := jain(h, l)
			t.Logf("VTC: light share %.4f heavy share %.4f Jain %.5f over %d backlogged ticks; light refused below half the queue: %d",
				share, 1-share, j, both, refused["light"])
			if both < 2000 {
				t.Fatalf("both flows backlogged only %d of 3000 ticks: the scenario does not test fairness", both)
			}
			if math.Abs(share-0.5) > 0.05 || j < 0.95 {
				t.Fatalf("light flow's share of GPU work %.3f (want 0.5 ± 10%%), Jain %.4f (want ≥ 0.95)", share, j)
			}
			if refused["light"] > 0 {
				t.Fatalf("light flow refused %d times: the flooder kept it out of the queue", refused["light"])
			}

			// The same load through one FIFO: the flooder takes what it sends.
			sf := fleetSimFIFO(t, mustNew(t, Config{}), tc.heavy, tc.light, capacity, 3000, 7)
			t.Logf("FIFO: light share %.3f, Jain %.4f", sf, jain(sf, 1-sf))
		})
	}
}

// fleetSimFIFO runs fleetSim with both tenants in one flow (arrival order) and returns the
// light tenant's share of work over the ticks both had requests queued.
func fleetSimFIFO(t *testing.T, q *Queue, heavy, light tenant, capacity int64, ticks int, seed uint64) float64 {
	t.Helper()
	// Mark each tenant's items by their Value; the flow is shared.
	type tagged struct{ tenant string }
	rng := rand.New(rand.NewPCG(seed, seed+1))
	uniform := func(r [2]int) int { return r[0] + rng.IntN(r[1]-r[0]+1) }
	var budget int64
	served := map[string]float64{}
	queued := map[string]int{}
	for range ticks {
		for _, tn := range []tenant{heavy, light} {
			for range tn.rate {
				c := Cost{UncachedPrefillTokens: uniform(tn.prefill), OutputTokens: uniform(tn.output)}
				it := &Item{Flow: "fifo", Cost: c, Value: tagged{tn.flow}}
				it.Cost.OutputTokens = int(float64(c.OutputTokens) * tn.outputError)
				if q.Push(it, true) == nil {
					queued[tn.flow]++
				}
			}
		}
		both := queued[heavy.flow] > 0 && queued[light.flow] > 0
		budget += capacity
		for budget > 0 {
			it := q.Next(t0)
			if it == nil {
				budget = 0
				break
			}
			q.Dispatched(it)
			q.Settle(it, it.Cost)
			w := q.cfg.Work(it.Cost)
			budget -= w
			name := it.Value.(tagged).tenant
			queued[name]--
			if both {
				served[name] += float64(w)
			}
		}
	}
	return served[light.flow] / (served[light.flow] + served[heavy.flow])
}

// A flow that was idle banks at most BurstCredit: it returns lifted to the least backlogged
// counter less the credit, so it takes that much work ahead of a flow that was served all
// along, then alternates with it; without credit it alternates at once.
func TestVTCIdleFlowBurstCredit(t *testing.T) {
	for _, tc := range []struct {
		credit         int64
		minRun, maxRun int // the returning flow's first run of dispatches in a row
		maxLaterRun    int
	}{
		{credit: -1, minRun: 1, maxRun: 2, maxLaterRun: 2},
		{credit: 500, minRun: 5, maxRun: 6, maxLaterRun: 2},
	} {
		q := mustNew(t, Config{BurstCredit: tc.credit})
		for range 200 {
			push(t, q, item(0, "busy", 100))
		}
		for range 100 {
			dispatch(t, q, t0) // 10,000 of work while the other flow was away: more than any credit
		}
		for range 20 {
			push(t, q, item(0, "returning", 100))
		}
		var runs []int
		run := 0
		for range 30 {
			if dispatch(t, q, t0).Flow == "returning" {
				run++
				continue
			}
			if run > 0 {
				runs = append(runs, run)
			}
			run = 0
		}
		if len(runs) < 2 || runs[0] < tc.minRun || runs[0] > tc.maxRun || slices.Max(runs[1:]) > tc.maxLaterRun {
			t.Errorf("credit %d: runs of the returning flow %v; want a first of %d..%d, then at most %d in a row",
				tc.credit, runs, tc.minRun, tc.maxRun, tc.maxLaterRun)
		}
	}
}

// Settle clamps a correction to [0, MaxRequestWork]: one absurd actual cost delays its flow
// by at most MaxRequestWork of the others' work, never forever.
func TestSettleBoundsCorrection(t *testing.T) {
	q := mustNew(t, Config{MaxRequestWork: 1000})
	push(t, q, item(0, "a", 100))
	for range 50 {
		push(t, q, item(0, "b", 100))
	}
	it := q.Next(t0)
	q.Dispatched(it)
	q.Settle(it, Cost{UncachedPrefillTokens: 1 << 40, OutputTokens: 1 << 40})
	push(t, q, item(0, "a", 100))
	// a's counter is at most 1000 ahead: b's 100-work items catch up within 11 dispatches.
	for i := range 12 {
		if dispatch(t, q, t0).Flow == "a" {
			if i < 9 {
				t.Fatalf("a served after %d of b's items, before b caught up", i)
			}
			return
		}
	}
	t.Fatal("a not served within 12 dispatches after a huge settle: the correction is unbounded")
}

// The starvation rule: while higher bands stay backlogged, each backlogged lower band gets
// MinBandShare of the work dispatched over it. Strict bands (share 0) give it nothing.
func TestBandShareUnderSustainedOverload(t *testing.T) {
	for _, tc := range []struct {
		name  string
		share float64
		bands []int
		work  map[int]int     // prefill tokens per item, by priority
		want  map[int]float64 // share of total work, by priority
	}{
		{"strict bands starve", -1, []int{1, 0}, map[int]int{1: 100, 0: 100}, map[int]float64{1: 1, 0: 0}},
		{"default 5%", 0, []int{1, 0}, map[int]int{1: 100, 0: 100}, map[int]float64{1: 0.95, 0: 0.05}},
		{"5%, low band's items 20x larger", 0, []int{1, 0}, map[int]int{1: 100, 0: 2000}, map[int]float64{1: 0.95, 0: 0.05}},
		{"10%", 0.1, []int{1, 0}, map[int]int{1: 100, 0: 100}, map[int]float64{1: 0.9, 0: 0.1}},
		// Each band gets 5% of the work of the bands above it and itself: the lowest 5%,
		// the middle 5% of the other 95%.
		{"three bands", 0, []int{2, 1, 0}, map[int]int{2: 100, 1: 100, 0: 100}, map[int]float64{2: 0.9025, 1: 0.0475, 0: 0.05}},
		{"sheddable band", 0, []int{0, -1}, map[int]int{0: 100, -1: 100}, map[int]float64{0: 0.95, -1: 0.05}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew(t, Config{MinBandShare: tc.share, MaxItems: 1 << 20})
			for _, p := range tc.bands {
				for range 50 {
					if err := q.Push(item(p, fmt.Sprint("f", p), tc.work[p]), false); err != nil {
						t.Fatal(err)
					}
				}
			}
			served := map[int]float64{}
			var total float64
			gap, maxGap := 0, 0 // dispatches between two of the lowest band's
			lowest := tc.bands[len(tc.bands)-1]
			for range 20000 {
				it := dispatch(t, q, t0)
				w := float64(it.Work())
				served[it.Priority] += w
				total += w
				gap++
				if it.Priority == lowest {
					maxGap, gap = max(maxGap, gap), 0
				}
				// Every band stays backlogged: replace what left.
				if err := q.Push(item(it.Priority, it.Flow, tc.work[it.Priority]), false); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range tc.bands {
				got := served[p] / total
				t.Logf("band %d: %.4f of the work", p, got)
				if math.Abs(got-tc.want[p]) > 0.005 {
					t.Fatalf("band %d got %.4f of the work, want %.4f", p, got, tc.want[p])
				}
			}
			if len(tc.bands) == 2 && tc.want[lowest] > 0 {
				// The wait bound: the lowest band's head waits for at most its own work
				// times (1-f)/f of higher-band work, plus its own dispatch.
				f := tc.want[lowest]
				bound := int(math.Ceil(float64(tc.work[lowest])*(1-f)/(f*float64(tc.work[tc.bands[0]])))) + 1
				t.Logf("longest run between two of the lowest band's dispatches: %d (bound %d)", maxGap, bound)
				if maxGap > bound {
					t.Fatalf("the lowest band waited %d dispatches, over its bound %d", maxGap, bound)
				}
			}
		})
	}
}

// A band's credit accrues only while it is backlogged: a band that arrives after a long
// run of higher-band work waits for fresh credit instead of jumping ahead at once.
func TestBandShareBanksNoCreditWhileEmpty(t *testing.T) {
	q := mustNew(t, Config{MaxItems: 1 << 20})
	for range 1000 {
		push(t, q, item(1, "hi", 100))
	}
	for range 500 {
		dispatch(t, q, t0)
	}
	lo := push(t, q, item(0, "lo", 100))
	for i := range 25 {
		if dispatch(t, q, t0) == lo {
			// 100 work needs 100/(0.05/0.95) = 1900 above it: 19 high items.
			if i < 19 {
				t.Fatalf("low item served after %d high items: it used credit from before it was queued", i)
			}
			return
		}
	}
	t.Fatal("low item not served within 25 dispatches: no share while higher bands are backlogged")
}

// A band's credit is what it is owed: work it is served as the top band (the bands above it
// idle) counts toward its share as credited work does, so a lower band that was served
// while the higher band was away does not jump it, on credit banked meanwhile, when the
// higher band queues again.
func TestBandShareServedCountsAgainstCredit(t *testing.T) {
	q := mustNew(t, Config{MinBandShare: 0.2, LIFOAfter: -1}) // 0.25 of each unit above
	for i := range 4 {
		push(t, q, item(1, "hi", 1000)).Value = fmt.Sprint("h", i)
	}
	for i := range 10 {
		push(t, q, item(0, "lo", 1000)).Value = fmt.Sprint("l", i)
	}
	// Four high items earn the low band 1,000 of credit; l0, served as the top band, spends
	// it; l1 goes as the top band too.
	order := values(t, q, 6)
	for i := 4; i < 8; i++ {
		push(t, q, item(1, "hi", 1000)).Value = fmt.Sprint("h", i)
	}
	order = append(order, values(t, q, 5)...)
	if got, want := fmt.Sprint(order), "[h0 h1 h2 h3 l0 l1 h4 h5 h6 h7 l2]"; got != want {
		t.Errorf("order %v, want %v", got, want)
	}
}

// TestBandShareCreditCoversTheItemPopped: under a standing queue (Config.LIFOAfter) a flow
// is served from its tail, and the credit that lets a lower band go ahead of a higher one
// must cover that item, not the flow's head: checked against a small head, the band took a
// large newest request ahead of the higher band on credit it did not have, and went below
// zero.
func TestBandShareCreditCoversTheItemPopped(t *testing.T) {
	q := mustNew(t, Config{MinBandShare: 0.5, LIFOAfter: time.Second}) // one unit of credit per unit above
	for i := range 4 {
		push(t, q, item(1, "hi", 500)).Value = fmt.Sprint("h", i)
	}
	push(t, q, item(0, "lo", 100)).Value = "small"
	push(t, q, item(0, "lo", 5000)).Value = "large"
	now := t0.Add(2 * time.Second) // both waited past LIFOAfter: the newest goes first
	var order []string
	for range 3 {
		it := dispatch(t, q, now)
		order = append(order, it.Value.(string))
		q.mu.Lock()
		c := q.byPrio[0].credit(q.share)
		q.mu.Unlock()
		if c < 0 {
			t.Fatalf("order %v: the low band's credit is %g", order, c)
		}
	}
	if got, want := fmt.Sprint(order), "[h3 h2 h1]"; got != want {
		t.Errorf("order %v, want %v: 1,000 of credit does not cover the low band's newest request (5,000)", got, want)
	}
}

// TestWorkSaturates: a cost whose weighted tokens overflow int64 is charged the cap, as
// any cost above it is (Work on Push, Settle, Charge). Wrapped around, a huge reported
// usage came out negative: Settle left the flow's served work below zero and its counter
// below every other flow's, and Work charged such a request 1.
func TestWorkSaturates(t *testing.T) {
	const capW = 1000
	huge := []Cost{
		{OutputTokens: math.MaxInt},
		{OutputTokens: math.MaxInt/2 + 1},
		{UncachedPrefillTokens: math.MaxInt, OutputTokens: math.MaxInt},
		{UncachedPrefillTokens: math.MaxInt / 2, OutputTokens: math.MaxInt / 4},
	}
	for _, cost := range huge {
		q := mustNew(t, Config{MaxRequestWork: capW})
		if w := q.Config().Work(cost); w != capW {
			t.Errorf("Work(%+v) = %d, want the cap %d", cost, w, capW)
		}
		it := push(t, q, item(0, "a", 100))
		push(t, q, item(0, "b", 100))
		if q.Next(t0) != it || !q.Dispatched(it) || !q.Settle(it, cost) {
			t.Fatal("a not dispatched and settled")
		}
		q.Charge(0, "b", cost)
		q.mu.Lock()
		b := q.byPrio[0]
		a, bf := b.flows["a"], b.flows["b"]
		if a == nil || a.served != capW || a.counter < capW {
			t.Errorf("settled %+v: flow a kept %v with %d served, want %d", cost, a != nil, served(a), capW)
		}
		if bf == nil || bf.served != capW {
			t.Errorf("charged %+v: flow b served %v, want %d", cost, bf != nil && bf.served == capW, capW)
		}
		q.mu.Unlock()
	}
}

// served is f's served work, 0 for a flow forgotten (nil).
func served(f *flow) int64 {
	if f == nil {
		return 0
	}
	return f.served
}
