package flowcontrol

import (
	"testing"
	"time"
)

// TestYields: an item popped from a backlogged flow yields (Item.Yields) while a flow of its
// band was served, within BandMemory, with nothing of its own queued behind it and another
// flow backlogged: a flow under its share. One flow alone, the last item of a flow, a lighter
// flow of another band, a forgotten one and BandMemory < 0 yield nothing.
func TestYields(t *testing.T) {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type step struct {
		push    string // "band/flow": push one item of 1000 prefill tokens; "" pops
		at      float64
		want    string // the popped item's flow
		yielded bool
	}
	for _, tc := range []struct {
		name   string
		memory time.Duration
		steps  []step
	}{
		{"one flow alone never yields", 0, []step{
			{push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"},
			{want: "heavy"}, {want: "heavy"}, {want: "heavy"}}},
		{"a backlogged flow yields to a lighter one served", 0, []step{
			{push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"},
			{want: "heavy"}, {push: "0/light"},
			{want: "light"}, {want: "heavy", yielded: true}, {want: "heavy", yielded: true},
			{want: "heavy"}}}, // its last: nothing of its own behind it
		{"the lighter flow is forgotten after the memory", 0, []step{
			{push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"},
			{want: "heavy"}, {push: "0/light"},
			{want: "light"}, {at: 5, want: "heavy", yielded: true}, {at: 10.5, want: "heavy"}}},
		{"a short memory", 2 * time.Second, []step{
			{push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"},
			{want: "heavy"}, {push: "0/light"},
			{want: "light"}, {at: 2.5, want: "heavy"}}},
		{"memory off", -1, []step{
			{push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"},
			{want: "heavy"}, {push: "0/light"},
			{want: "light"}, {want: "heavy"}}},
		{"a lighter flow of another band", 0, []step{
			{push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"}, {push: "1/light"},
			{want: "light"}, {want: "heavy"}, {want: "heavy"}}},
		{"the lighter flow does not yield to itself", 0, []step{
			{push: "0/heavy"}, {push: "0/heavy"},
			{want: "heavy"}, {push: "0/light"},
			{want: "light"}, {want: "heavy"},
			// heavy is gone; light comes back with a burst and is the band's only flow:
			// there is nobody to leave room for.
			{push: "0/light"}, {push: "0/light"}, {push: "0/light"},
			{want: "light"}, {want: "light"}, {want: "light"}}},
		{"a flow served alone is not a lighter one", 0, []step{
			{push: "0/light"}, {want: "light"},
			{push: "0/heavy"}, {push: "0/heavy"}, {push: "0/heavy"},
			{want: "heavy"}, {want: "heavy"}}},
	} {
		q := mustNew(t, Config{BandMemory: tc.memory})
		for i, s := range tc.steps {
			if s.push != "" {
				var prio int
				var flow string
				if s.push[0] == '1' {
					prio = 1
				}
				flow = s.push[2:]
				push(t, q, item(prio, flow, 1000))
				continue
			}
			it := q.Next(at(s.at))
			if it == nil {
				t.Fatalf("%s: step %d: nothing popped", tc.name, i)
			}
			if it.Flow != s.want || it.Yields() != s.yielded {
				t.Errorf("%s: step %d: popped %s yielding %v; want %s yielding %v", tc.name, i, it.Flow, it.Yields(), s.want, s.yielded)
			}
			if !q.Dispatched(it) || outcome(it) != Dispatched {
				t.Fatalf("%s: step %d: not dispatched", tc.name, i)
			}
		}
	}
}

// TestYieldsCountsPopped: the items of a flow popped before an item and not yet placed (set
// aside by the caller) count as behind it, so its last item yields as its first did, and a
// flow is not taken for a lighter one because its other items are out of the queue.
func TestYieldsCountsPopped(t *testing.T) {
	q := mustNew(t, Config{})
	for range 2 {
		push(t, q, item(0, "heavy", 1000))
	}
	if dispatch(t, q, t0) == nil {
		t.Fatal("nothing popped")
	}
	light := push(t, q, item(0, "light", 1000))
	for range 2 {
		push(t, q, item(0, "heavy", 1000))
	}
	if it := q.Next(t0); it != light || !q.Dispatched(it) || outcome(it) != Dispatched {
		t.Fatal("the light flow was not served first")
	}
	var aside []*Item
	for i := range 3 {
		it := q.Next(t0)
		if it == nil || it.Flow != "heavy" || !it.Yields() {
			t.Fatalf("pop %d of the heavy flow, the others set aside: %+v does not yield", i, it)
		}
		aside = append(aside, it)
	}
	for i := len(aside) - 1; i >= 0; i-- {
		if !q.Requeue(aside[i]) {
			t.Fatal("Requeue refused a popped item")
		}
	}
	if q.Len() != 3 {
		t.Fatalf("%d queued after the requeues, want 3", q.Len())
	}
	if it := q.Next(t0); it != aside[0] || !it.Yields() {
		t.Error("the first item set aside is not back at its flow's head, yielding")
	}
}
