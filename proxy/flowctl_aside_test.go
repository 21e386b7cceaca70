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
	shed := pushFlow(t, s, pq, now, -1, "f", 100, false) // a sheddable one queued while the pool had room
	var high []*flowcontrol.Item
	for range 4 {
		high = append(high, pushFlow(t, s, pq, now, 5, "f", 1000, true))
	}
	pq.q.NoteBand(5, now)
	pq.q.NoteBand(-1, now)
	// Two of the higher band's served earn the sheddable band the credit for its request:
	// it is at the head, held by the reserve rule, and set aside.
	for _, want := range high[:2] {
		if it := pq.q.Next(now); it != want || !pq.q.Dispatched(it) {
			t.Fatal("the higher band was not served first")
		}
	}
	s.fc.dispatch(now) // high[2] takes the last slot; high[3] finds the pool saturated
	select {
	case o := <-high[2].Done():
		if o != flowcontrol.Dispatched {
			t.Fatalf("high[2]: %v", o)
		}
		t.Cleanup(high[2].Value.(*flow).lease.Release)
	default:
		t.Fatal("high[2] was not placed on the replica's free slot")
	}
	select {
	case o := <-shed.Done():
		if o != flowcontrol.Shed {
			t.Errorf("the sheddable request: %v, want shed", o)
		}
	default:
		t.Errorf("the sheddable request set aside still waits in a saturated pool (%d queued)", pq.q.Len())
	}
}
