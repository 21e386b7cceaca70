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
