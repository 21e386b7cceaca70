package flowcontrol

import (
	"fmt"
	"testing"
)

// TestSetAsideIsANoOp: items popped by Next and all put back by Requeue, last first (the
// proxy's place sets up to 16 aside in one round), leave the queue as it was: a flow that
// becomes backlogged afterwards is lifted, and served, exactly as without the round. The
// band's virtual time must not keep the counters the popped items were charged.
func TestSetAsideIsANoOp(t *testing.T) {
	run := func(aside int) []string {
		q := mustNew(t, Config{LIFOAfter: -1})
		for i := range 12 {
			push(t, q, item(0, "heavy", 20000)).Value = fmt.Sprint("h", i)
		}
		for range 2 { // heavy served a while: its counter is above zero
			if dispatch(t, q, t0) == nil {
				t.Fatal("nothing popped")
			}
		}
		var set []*Item
		for range aside {
			it := q.Next(t0)
			if it == nil {
				t.Fatal("nothing popped")
			}
			set = append(set, it)
		}
		for i := len(set) - 1; i >= 0; i-- {
			if !q.Requeue(set[i]) {
				t.Fatal("Requeue refused a popped item")
			}
		}
		push(t, q, item(0, "light", 1000)).Value = "l"
		order := values(t, q, 4)
		return order
	}
	want := run(0)
	for _, n := range []int{1, 2, 8} {
		if got := run(n); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("after %d set aside and put back: order %v; without: %v", n, got, want)
		}
	}
}

// TestSetAsideKeepsIdleFlows: a round that pops every queued item of a band and puts them
// all back does not settle the band's history (settleHistory: the idle flows forgotten, the
// virtual time raised to the highest idle counter), as a band that really emptied does: a
// flow that comes afterwards is served as it would be without the round.
func TestSetAsideKeepsIdleFlows(t *testing.T) {
	run := func(aside bool) []string {
		q := mustNew(t, Config{LIFOAfter: -1})
		var idle []*Item
		for range 5 {
			push(t, q, item(0, "idle", 20000))
		}
		for range 5 {
			it := q.Next(t0)
			if it == nil || !q.Dispatched(it) || outcome(it) != Dispatched {
				t.Fatal("not dispatched")
			}
			idle = append(idle, it)
		}
		for i := range 2 {
			push(t, q, item(0, "a", 20000)).Value = fmt.Sprint("a", i)
		}
		for _, it := range idle {
			if !q.Settle(it, Cost{UncachedPrefillTokens: 20000}) {
				t.Fatal("Settle refused")
			}
		}
		if aside {
			a0, a1 := q.Next(t0), q.Next(t0)
			if a0 == nil || a1 == nil {
				t.Fatal("nothing popped")
			}
			q.Requeue(a1)
			q.Requeue(a0)
		}
		push(t, q, item(0, "new", 20000)).Value = "n"
		order := values(t, q, 3)
		return order
	}
	if got, want := run(true), run(false); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the band's items were set aside and put back: order %v; without: %v", got, want)
	}
}

// orderAroundPop is the order of the first n items dispatched from a queue of cfg after
// setup and then action; with popped, one item is popped by Next before action and put back
// by Requeue after it. Action then must leave the queue as it would without the pop.
func orderAroundPop(t *testing.T, cfg Config, setup, action func(*Queue), n int, popped bool) []string {
	t.Helper()
	q := mustNew(t, cfg)
	setup(q)
	var it *Item
	if popped {
		if it = q.Next(t0); it == nil {
			t.Fatal("nothing popped")
		}
	}
	action(q)
	if popped && !q.Requeue(it) {
		t.Fatal("Requeue refused")
	}
	order := values(t, q, n)
	return order
}

// pushNamed pushes n items of priority prio, flow fl and prefill tokens, valued name0, name1...
func pushNamed(t *testing.T, q *Queue, n, prio int, fl string, prefill int, name string) {
	t.Helper()
	for i := range n {
		push(t, q, item(prio, fl, prefill)).Value = fmt.Sprint(name, i)
	}
}

// TestReconfigureWhilePopped: Reconfigure to another MinBandShare while an item is popped
// (the dispatcher sets it aside, a reload comes meanwhile) and its Requeue after leave the
// lower band's credit as the Reconfigure alone does: the rebase counted the popped item's
// work above the lower band, which the Requeue then took back below the new base.
func TestReconfigureWhilePopped(t *testing.T) {
	setup := func(q *Queue) {
		pushNamed(t, q, 4, 5, "high", 1000, "h")
		push(t, q, item(0, "low", 500)).Value = "l"
	}
	reload := func(q *Queue) {
		if err := q.Reconfigure(Config{LIFOAfter: -1, MinBandShare: 0.5}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{LIFOAfter: -1}
	if got, want := orderAroundPop(t, cfg, setup, reload, 5, true), orderAroundPop(t, cfg, setup, reload, 5, false); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Reconfigure while an item was popped, then Requeue: order %v; Reconfigure alone: %v", got, want)
	}
}

// TestBandCreatedWhilePopped: a lower band that first gets an item while a higher band's item
// is popped (set aside) earns no credit from that item, and loses none when it is put back:
// the item's work was never counted above the new band, and a Requeue must not take it out
// of it.
func TestBandCreatedWhilePopped(t *testing.T) {
	setup := func(q *Queue) { pushNamed(t, q, 4, 5, "high", 1000, "h") }
	low := func(q *Queue) { push(t, q, item(0, "low", 1000)).Value = "l" }
	cfg := Config{LIFOAfter: -1, MinBandShare: 0.5}
	if got, want := orderAroundPop(t, cfg, setup, low, 5, true), orderAroundPop(t, cfg, setup, low, 5, false); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the low band created while a high item was popped, then Requeue: order %v; without the pop: %v", got, want)
	}
}

// TestFairnessReloadWhilePopped: a reload to another Fairness while an item is popped levels
// the flows (restartFairness); the item's Requeue then leaves its flow level, not behind
// the others by the charge the restart already wiped (a negative counter, served first for
// as many turns as that charge was worth).
func TestFairnessReloadWhilePopped(t *testing.T) {
	setup := func(q *Queue) {
		for i := range 3 {
			push(t, q, item(0, "a", 5000)).Value = fmt.Sprint("a", i)
			push(t, q, item(0, "b", 5000)).Value = fmt.Sprint("b", i)
		}
	}
	reload := func(q *Queue) {
		if err := q.Reconfigure(Config{LIFOAfter: -1, Fairness: FairnessRoundRobin}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{LIFOAfter: -1}
	if got, want := orderAroundPop(t, cfg, setup, reload, 6, true), orderAroundPop(t, cfg, setup, reload, 6, false); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a fairness reload while an item was popped, then Requeue: order %v; the reload alone: %v", got, want)
	}
}

// TestSettleWhileAllSetAside: a flow whose request settles while every queued item of its
// band is popped (set aside for one dispatcher round) is a flow among contending ones: it is
// remembered, and the band's virtual time stays. Raised to its counter, the virtual time
// would lift the next flow to arrive above the backlogged one.
func TestSettleWhileAllSetAside(t *testing.T) {
	run := func(aside bool) []string {
		q := mustNew(t, Config{LIFOAfter: -1})
		light := push(t, q, item(0, "light", 1000))
		if it := q.Next(t0); it != light || !q.Dispatched(light) || outcome(light) != Dispatched {
			t.Fatal("light not dispatched")
		}
		for i := range 3 {
			push(t, q, item(0, "heavy", 1000)).Value = fmt.Sprint("h", i)
		}
		var set []*Item
		if aside {
			for range 3 {
				set = append(set, q.Next(t0))
			}
		}
		// It generated a long answer: the most one request is charged.
		if !q.Settle(light, Cost{OutputTokens: DefaultMaxRequestWork}) {
			t.Fatal("Settle refused")
		}
		for i := len(set) - 1; i >= 0; i-- {
			q.Requeue(set[i])
		}
		push(t, q, item(0, "new", 1000)).Value = "n"
		order := values(t, q, 4)
		return order
	}
	if got, want := run(true), run(false); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a flow settled while the band's items were set aside: order %v; without: %v", got, want)
	}
}

// TestSetAsideEarnsNoCredit: a higher band's items popped and held out (the dispatcher sets
// them aside) are not work served above the lower band: within that round the lower band is
// not popped on credit they would earn it (Credited, which the reserve rule does not hold),
// and once they are put back its credit is not below zero. Counted, the lower band took a
// request ahead of the higher band on a loan that the Requeues then called in.
func TestSetAsideEarnsNoCredit(t *testing.T) {
	q := mustNew(t, Config{LIFOAfter: -1, MinBandShare: 0.5}) // one unit of credit per unit above
	for i := range 4 {
		push(t, q, item(5, fmt.Sprint("h", i), 1000))
	}
	push(t, q, item(0, "low", 1000))
	var set []*Item
	for range 3 { // the round sets the higher band's heads aside, and looks behind them
		it := q.Next(t0)
		if it == nil {
			t.Fatal("nothing popped")
		}
		set = append(set, it)
		if it.Priority != 5 || it.Credited() {
			t.Fatalf("popped priority %d (credited %v) with nothing placed above it: the set-aside work counted as served", it.Priority, it.Credited())
		}
	}
	for i := len(set) - 1; i >= 0; i-- {
		q.Requeue(set[i])
	}
	if c := bandCredit(t, q, 0); c != 0 {
		t.Fatalf("low band's credit %g after a round that placed nothing, want 0", c)
	}
	q.mu.Lock()
	lb := q.byPrio[0]
	c := lb.credit(q.share)
	q.mu.Unlock()
	if c < 0 {
		t.Fatalf("low band's credit %g after the set-aside items went back: it was lent and called in", c)
	}
}

// TestPutBackKeepsFlowOrder: items of one flow put back in another order than they were
// popped go back to their places by arrival: a placement taken back (Return, on the
// request's handler) while the dispatcher holds the flow's next item aside, or requeues in
// pop order. Put at the flow's head each time, the later item went before the earlier one.
func TestPutBackKeepsFlowOrder(t *testing.T) {
	for _, returned := range []bool{false, true} {
		q := mustNew(t, Config{LIFOAfter: -1})
		for i := range 3 {
			push(t, q, item(0, "a", 1000)).Value = fmt.Sprint("a", i)
		}
		first := q.Next(t0)
		if returned && (!q.Dispatched(first) || outcome(first) != Dispatched) {
			t.Fatal("first not dispatched")
		}
		second := q.Next(t0)
		if returned {
			q.Return(first)
		} else {
			q.Requeue(first)
		}
		q.Requeue(second)
		order := values(t, q, 3)
		if got, want := fmt.Sprint(order), "[a0 a1 a2]"; got != want {
			t.Errorf("returned %v: order %v, want %v", returned, got, want)
		}
	}
}

// TestPushWhileSetAsideKeepsCredit: a lower band whose only queued request is popped on its
// credit and held out (set aside, or no room found) still waits; a request of the band
// pushed meanwhile does not start its credit afresh. Started afresh, the Requeue left the
// band only the credit the popped request had spent, and the band lost the rest of what it
// was owed (here the second low request went after the higher band's next one).
func TestPushWhileSetAsideKeepsCredit(t *testing.T) {
	q := mustNew(t, Config{LIFOAfter: -1, MinBandShare: 0.5}) // one unit of credit per unit above
	for i := range 3 {
		push(t, q, item(5, "hi", 300)).Value = fmt.Sprint("h", i)
	}
	push(t, q, item(0, "lo", 100)).Value = "l0"
	if it := dispatch(t, q, t0); it.Value != "h0" { // earns the low band 300
		t.Fatalf("first %v, want h0", it.Value)
	}
	l0 := q.Next(t0)
	if l0 == nil || l0.Value != "l0" || !l0.Credited() {
		t.Fatalf("popped %v, want l0 on credit", l0)
	}
	push(t, q, item(0, "lo", 100)).Value = "l1" // while l0 is out
	q.Requeue(l0)                               // no room for it after all
	if c := bandCredit(t, q, 0); c != 300 {
		t.Errorf("low band's credit %g after l0 went back, want the 300 it had", c)
	}
	var order []string
	for range 3 {
		it := dispatch(t, q, t0)
		order = append(order, fmt.Sprint(it.Value, "/", it.Credited()))
	}
	if got, want := fmt.Sprint(order), "[l0/true l1/true h1/false]"; got != want {
		t.Errorf("order %v, want %v", got, want)
	}
}
