package flowcontrol

import (
	"fmt"
	"testing"
)

// order pops every queued item (dispatching and settling each at its predicted cost) and
// returns their flows in the order they left.
func order(t *testing.T, q *Queue) []string {
	t.Helper()
	var got []string
	for it := dispatch(t, q, t0); it != nil; it = dispatch(t, q, t0) {
		got = append(got, it.Flow)
	}
	return got
}

// values dispatches n items (settling each at its predicted cost) and returns their Values,
// strings, in the order they left.
func values(t *testing.T, q *Queue, n int) []string {
	t.Helper()
	var got []string
	for range n {
		got = append(got, dispatch(t, q, t0).Value.(string))
	}
	return got
}

// TestChargeOutsideQueue: the work of a request that went straight through is charged to its
// flow by VTC's rules: a backlogged flow as served, a flow that is not backlogged lifted to
// the band's floor first (no credit banked), clamped to MaxRequestWork, forgotten once
// nothing of the band waits, and nothing without a band or with round-robin fairness.
func TestChargeOutsideQueue(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		run  func(t *testing.T, q *Queue) []string
		want string
	}{
		{"backlogged flow charged goes after a quiet one", Config{}, func(t *testing.T, q *Queue) []string {
			push(t, q, item(0, "flood", 100))
			push(t, q, item(0, "quiet", 100)) // lifted to flood's counter; flood's head is older
			q.Charge(0, "flood", Cost{UncachedPrefillTokens: 500, OutputTokens: 100})
			return order(t, q)
		}, "quiet flood"},
		{"uncharged: arrival order breaks the tie", Config{}, func(t *testing.T, q *Queue) []string {
			push(t, q, item(0, "flood", 100))
			push(t, q, item(0, "quiet", 100))
			return order(t, q)
		}, "flood quiet"},
		{"a flow not backlogged keeps its debt when it queues", Config{}, func(t *testing.T, q *Queue) []string {
			for range 3 {
				push(t, q, item(0, "quiet", 100))
			}
			q.Charge(0, "flood", Cost{UncachedPrefillTokens: 250}) // lifted to quiet's 0, then +250
			push(t, q, item(0, "flood", 100))
			return order(t, q)
		}, "quiet quiet quiet flood"},
		{"no credit: a flow far behind is lifted before its charge", Config{}, func(t *testing.T, q *Queue) []string {
			first := push(t, q, item(0, "quiet", 100))
			for range 4 {
				push(t, q, item(0, "busy", 1000))
			}
			if q.Next(t0) != first || !q.Dispatched(first) { // quiet 100, in flight
				t.Fatal("quiet's item did not leave first")
			}
			dispatch(t, q, t0) // busy 1000
			dispatch(t, q, t0) // busy 2000, the band's floor
			// quiet is lifted from 100 to the floor before its charge: 2000 + 1500 = 3500,
			// after busy's next two items. Charged from 100 it would be 1600, lifted to
			// 2000 when it queues, and go before busy's last item.
			q.Charge(0, "quiet", Cost{UncachedPrefillTokens: 1500})
			<-first.Done()
			q.Settle(first, first.Cost)
			push(t, q, item(0, "quiet", 100))
			return order(t, q)
		}, "busy busy quiet"},
		{"clamped to MaxRequestWork", Config{MaxRequestWork: 300}, func(t *testing.T, q *Queue) []string {
			push(t, q, item(0, "flood", 100))
			for range 5 {
				push(t, q, item(0, "quiet", 100))
			}
			q.Charge(0, "flood", Cost{UncachedPrefillTokens: 1 << 40})
			return order(t, q)
		}, "quiet quiet quiet flood quiet quiet"},
		{"forgotten once nothing waits", Config{}, func(t *testing.T, q *Queue) []string {
			push(t, q, item(0, "other", 100))
			q.Charge(0, "flood", Cost{UncachedPrefillTokens: 5000})
			order(t, q) // the backlog empties: the virtual time moves up to flood's counter
			push(t, q, item(0, "flood", 100))
			push(t, q, item(0, "quiet", 100))
			return order(t, q)
		}, "flood quiet"},
		{"no band, no state", Config{}, func(t *testing.T, q *Queue) []string {
			q.Charge(0, "flood", Cost{UncachedPrefillTokens: 5000})
			if q.Active() || len(q.Snapshot(t0).Bands) != 0 {
				t.Error("a charge without a band created one")
			}
			push(t, q, item(0, "flood", 100))
			push(t, q, item(0, "quiet", 100))
			return order(t, q)
		}, "flood quiet"},
		{"round-robin counts turns, not outside work", Config{Fairness: FairnessRoundRobin}, func(t *testing.T, q *Queue) []string {
			push(t, q, item(0, "flood", 100))
			push(t, q, item(0, "quiet", 100))
			q.Charge(0, "flood", Cost{UncachedPrefillTokens: 5000})
			return order(t, q)
		}, "flood quiet"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew(t, tc.cfg)
			got := fmt.Sprint(tc.run(t, q))
			if want := "[" + tc.want + "]"; got != want {
				t.Errorf("order %s, want %s", got, want)
			}
			checkInvariants(t, q)
			if q.Len() == 0 && q.Active() {
				t.Errorf("empty queue with nothing in flight still active: %+v", q.Snapshot(t0))
			}
		})
	}
}

// TestChargeForgetsOneOffFlows: flows charged while their band has a backlog are remembered
// only while they owe something the band's virtual time has not passed.
func TestChargeForgetsOneOffFlows(t *testing.T) {
	q := mustNew(t, Config{})
	for range 20 {
		push(t, q, item(0, "steady", 100))
	}
	for i := range 5000 {
		q.Charge(0, fmt.Sprint("straight-", i), Cost{UncachedPrefillTokens: 50 + i%100})
		push(t, q, item(0, "steady", 100))
		dispatch(t, q, t0)
	}
	q.mu.Lock()
	n := len(q.byPrio[0].flows)
	q.mu.Unlock()
	if n > 50 {
		t.Fatalf("%d flows remembered: flows charged once leak", n)
	}
	order(t, q)
	if q.Active() {
		t.Fatal("a drained queue keeps its band")
	}
}

// TestChargeAllocations: a charge allocates nothing while the queue is idle or its band has
// no backlog.
func TestChargeAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	q := mustNew(t, Config{})
	c := Cost{UncachedPrefillTokens: 100, OutputTokens: 10}
	if n := testing.AllocsPerRun(1000, func() { q.Charge(0, "flow", c) }); n != 0 {
		t.Errorf("Charge on an idle queue allocates %.1f", n)
	}
	push(t, q, item(0, "a", 100))
	q.Next(t0) // a in flight: the band stays, without a backlog
	if n := testing.AllocsPerRun(1000, func() { q.Charge(0, "flow", c) }); n != 0 {
		t.Errorf("Charge in a band without a backlog allocates %.1f", n)
	}
}

// TestReturnKeepsPlace: a dispatched item whose placement was taken back goes back to the
// head of its flow with its charge undone, so it leaves next, as it would have; misuse is
// refused and a drained queue answers it Shutdown.
func TestReturnKeepsPlace(t *testing.T) {
	q := mustNew(t, Config{})
	a1 := push(t, q, item(0, "a", 100))
	push(t, q, item(0, "a", 100))
	push(t, q, item(0, "b", 100))
	if q.Return(a1) {
		t.Fatal("Return accepted a queued item")
	}
	got := q.Next(t0)
	if got != a1 || q.Return(a1) {
		t.Fatal("Return accepted a popped item (Requeue's)")
	}
	q.Dispatched(a1)
	if q.Return(a1) {
		t.Fatal("Return accepted an item whose Dispatched was not read")
	}
	if o := outcome(a1); o != Dispatched {
		t.Fatalf("outcome %v", o)
	}
	if !q.Return(a1) {
		t.Fatal("Return refused a dispatched item")
	}
	if q.Len() != 3 {
		t.Fatalf("%d queued after Return, want 3", q.Len())
	}
	s := q.Snapshot(t0)
	for _, f := range s.Bands[0].Flows {
		if f.Counter != 0 || f.InFlight != 0 {
			t.Fatalf("flow %s: counter %d, %d in flight after Return; the charge was not undone", f.Flow, f.Counter, f.InFlight)
		}
	}
	if got := fmt.Sprint(order(t, q)); got != "[a b a]" {
		t.Fatalf("order after Return %s, want [a b a] (a1 first, as before)", got)
	}
	if dispatch(t, q, t0) != nil {
		t.Fatal("a returned item left twice")
	}
	if q.Settle(a1, Cost{}) {
		t.Fatal("a returned item settled twice")
	}

	push(t, q, a1)
	got = q.Next(t0)
	q.Dispatched(got)
	<-got.Done()
	q.Drain()
	if !q.Return(got) || outcome(got) != Shutdown {
		t.Fatal("Return after Drain did not deliver Shutdown")
	}
	checkInvariants(t, q)
}

// TestReturnDebitsOnlyWhatWasCounted: a higher band's placement taken back (Return) after a
// lower band became backlogged was never work the lower band earned on (its credit base was
// taken after the dispatch), so it takes nothing from that band's credit: debited, the band
// owed its share of work never served, and waited that much longer for its turn, for good
// once the returned request's client left.
func TestReturnDebitsOnlyWhatWasCounted(t *testing.T) {
	run := func(returned bool) []string {
		q := mustNew(t, Config{LIFOAfter: -1, MinBandShare: 0.5}) // one unit of credit per unit above
		// The low band exists (a request of it in flight) and is not backlogged.
		pre := push(t, q, item(0, "pre", 1000))
		if q.Next(t0) != pre || !q.Dispatched(pre) || outcome(pre) != Dispatched {
			t.Fatal("not dispatched")
		}
		var back *Item
		if returned {
			back = push(t, q, item(1, "gone", 1000))
			if q.Next(t0) != back || !q.Dispatched(back) || outcome(back) != Dispatched {
				t.Fatal("not dispatched")
			}
		}
		for i := range 4 {
			push(t, q, item(1, "hi", 1000)).Value = fmt.Sprint("h", i)
		}
		push(t, q, item(0, "lo", 1000)).Value = "l"
		if returned {
			if !q.Return(back) || !q.Remove(back) || outcome(back) != Cancelled {
				t.Fatal("not returned and removed")
			}
		}
		order := values(t, q, 5)
		return order
	}
	if got, want := run(true), run(false); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a higher band's request dispatched before the low band queued, returned and cancelled: order %v; without it: %v", got, want)
	}
}
