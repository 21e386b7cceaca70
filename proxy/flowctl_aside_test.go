package proxy

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/flowcontrol"
)

// TestSetAsideSheddableShedOnSaturation: a sheddable request set aside by the reserve rule
// (place) is refused, reason shed, when the same round then finds the pool saturated, as a
// queued one is: set aside, it was out of the queue when Shed ran, and went back to wait.
func TestSetAsideSheddableShedOnSaturation(t *testing.T) {
	s, pq := dispatcherOnly(t, 2, 200) // room for one more by count; about 20 ms of prefill queued
	now := time.Now()
	// Sheddable requests queued while the pool had room: a heavy flow's, and a light flow's
	// served while heavy was backlogged, with nothing of its own behind it.
	var heavy []*flowcontrol.Item
	for range 4 {
		heavy = append(heavy, pushFlow(t, s, pq, now, -1, "heavy", 100, false))
	}
	light := pushFlow(t, s, pq, now, -1, "light", 5000, false)
	for _, want := range []*flowcontrol.Item{heavy[0], light} {
		if it := pq.q.Next(now); it != want || !pq.q.Dispatched(it) {
			t.Fatal("not served in the expected order")
		}
	}
	next := pushFlow(t, s, pq, now, -1, "light", 100, false)
	pushFlow(t, s, pq, now, -1, "light", 100, false)
	// heavy's requests, first by their counter, yield to light: held by the reserve rule and
	// set aside; light's next takes the last slot; the one after finds the pool saturated.
	s.fc.dispatch(now)
	select {
	case o := <-next.Done():
		if o != flowcontrol.Dispatched {
			t.Fatalf("the light flow's request: %v", o)
		}
		t.Cleanup(next.Value.(*flow).lease.Release)
	default:
		t.Fatal("the light flow's request was not placed on the replica's free slot")
	}
	for i, it := range heavy[1:] {
		select {
		case o := <-it.Done():
			if o != flowcontrol.Shed {
				t.Errorf("heavy request %d: %v, want shed", i+1, o)
			}
		default:
			t.Errorf("heavy request %d, set aside, still waits in a saturated pool (%d queued)", i+1, pq.q.Len())
		}
	}
}
