package flowcontrol

import (
	"math"
	"testing"
)

// bandCredit is the credit of the band of priority p in q's snapshot.
func bandCredit(t *testing.T, q *Queue, p int) float64 {
	t.Helper()
	for _, b := range q.Snapshot(t0).Bands {
		if b.Priority == p {
			return b.Credit
		}
	}
	t.Fatalf("no band %d", p)
	return 0
}

// A reload's Reconfigure keeps the queue and the credit each band earned, and applies the new
// share, cap and bounds from then on; a wrong field changes nothing.
func TestReconfigure(t *testing.T) {
	q := mustNew(t, Config{MaxItems: 1000})
	for range 20 {
		push(t, q, item(1, "hi", 100))
		push(t, q, item(0, "lo", 1000)) // a low item costs 1000: 19 000 of high work at 5%
	}
	for range 10 {
		if it := dispatch(t, q, t0); it.Priority != 1 {
			t.Fatalf("dispatched priority %d before the low band earned its share", it.Priority)
		}
	}
	before := bandCredit(t, q, 0)
	if math.Abs(before-1000*0.05/0.95) > 1e-9 {
		t.Fatalf("credit %g after 1000 of high work", before)
	}

	if err := q.Reconfigure(Config{MinBandShare: 0.7}); err == nil {
		t.Fatal("Reconfigure accepted a share over 0.5")
	}
	if got := q.Config(); got.MaxItems != 1000 || got.MinBandShare != DefaultMinBandShare {
		t.Fatalf("a refused Reconfigure changed the config: %+v", got)
	}

	// Strict bands from now on: the credit earned stays, and does not grow.
	if err := q.Reconfigure(Config{MaxItems: 30, MinBandShare: -1, MaxRequestWork: 500}); err != nil {
		t.Fatal(err)
	}
	if got := bandCredit(t, q, 0); math.Abs(got-before) > 1 {
		t.Fatalf("credit %g after Reconfigure, had %g", got, before)
	}
	for range 9 {
		if it := dispatch(t, q, t0); it.Priority != 1 {
			t.Fatalf("strict bands dispatched priority %d while the high band was backlogged", it.Priority)
		}
	}
	if got := bandCredit(t, q, 0); math.Abs(got-before) > 1 {
		t.Fatalf("credit grew to %g under strict bands, had %g", got, before)
	}
	// The new cap applies to new pushes; queued items stay (40 pushed, 19 dispatched, 1 more).
	it := push(t, q, item(1, "hi", 2000))
	if it.Work() != 500 {
		t.Errorf("work %d after the cap was lowered to 500", it.Work())
	}
	if q.Len() != 22 {
		t.Fatalf("queue holds %d, want the 22 queued before and since", q.Len())
	}
	// The new bound: 8 more fit under 30, the 9th does not.
	for range 8 {
		push(t, q, item(1, "other", 10))
	}
	if err := q.Push(item(0, "lo", 10), false); err != ErrFull { // nothing below it to displace
		t.Errorf("push over the reconfigured bound: %v, want ErrFull", err)
	}

	// Back to a share: the band's earned credit counts again at once, and grows at 0.5.
	if err := q.Reconfigure(Config{MinBandShare: 0.5}); err != nil {
		t.Fatal(err)
	}
	if got := bandCredit(t, q, 0); math.Abs(got-before) > 1 {
		t.Fatalf("credit %g after a share was restored, had %g", got, before)
	}
	hi := dispatch(t, q, t0) // credit + its work (a band share of 0.5 earns 0.5/(1-0.5) a unit)
	if want := before + float64(hi.Work()); hi.Priority != 1 || math.Abs(bandCredit(t, q, 0)-want) > 1 {
		t.Fatalf("credit %g at share 0.5 after %d of priority %d's work, want %g of priority 1's", bandCredit(t, q, 0), hi.Work(), hi.Priority, want)
	}
}
