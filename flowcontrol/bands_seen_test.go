package flowcontrol

import (
	"testing"
	"time"
)

// TestBandsSeen: the highest band noted is reported while it and a lower band were noted
// within BandMemory; a higher band replaces it at once (the old top counts as lower), a lower
// one only once it is forgotten, and an equal one refreshes it. One band alone reports none;
// BandMemory < 0 turns the memory off.
func TestBandsSeen(t *testing.T) {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type note struct {
		prio int
		at   float64
	}
	for _, tc := range []struct {
		name   string
		memory time.Duration
		notes  []note
		at     float64
		want   int
		wantOK bool
	}{
		{"nothing noted", 0, nil, 0, 0, false},
		{"one band: nothing to reserve for", 0, []note{{1, 0}, {1, 3}}, 5, 0, false},
		{"two bands", 0, []note{{3, 0}, {0, 1}}, 5, 3, true},
		{"a higher band replaces, the old top is lower", 0, []note{{0, 0}, {3, 1}}, 2, 3, true},
		{"forgotten after the memory", 0, []note{{3, 0}, {0, 0}}, 10.5, 0, false},
		{"the lower band forgotten", 0, []note{{3, 0}, {0, 0}, {3, 9}}, 10.5, 0, false},
		{"an equal band refreshes", 0, []note{{3, 0}, {0, 1}, {3, 8}, {0, 9}}, 15, 3, true},
		{"a lower band replaces a forgotten top", 0, []note{{3, 0}, {0, 11}}, 12, 0, false},
		{"then a lower one below it", 0, []note{{3, 0}, {1, 11}, {0, 11.5}}, 12, 1, true},
		{"a short memory", 2 * time.Second, []note{{3, 0}, {0, 0}}, 2.5, 0, false},
		{"memory off", -1, []note{{3, 0}, {0, 0}}, 0, 0, false},
	} {
		q := mustNew(t, Config{BandMemory: tc.memory})
		for _, n := range tc.notes {
			q.NoteBand(n.prio, at(n.at))
		}
		got, ok := q.TopBand(at(tc.at))
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("%s: TopBand = %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.wantOK)
		}
	}
	q := mustNew(t, Config{})
	q.NoteBand(1, t0)
	q.NoteBand(0, t0)
	if err := q.Reconfigure(Config{BandMemory: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, ok := q.TopBand(at(2)); ok {
		t.Error("Reconfigure did not shorten the memory")
	}
}

func TestQueuedAtOrAbove(t *testing.T) {
	q := mustNew(t, Config{})
	if q.QueuedAtOrAbove(0) {
		t.Fatal("empty queue")
	}
	push(t, q, item(0, "batch", 100))
	for _, c := range []struct {
		prio int
		want bool
	}{{-1, true}, {0, true}, {1, false}, {5, false}} {
		if got := q.QueuedAtOrAbove(c.prio); got != c.want {
			t.Errorf("band 0 queued: QueuedAtOrAbove(%d) = %v, want %v", c.prio, got, c.want)
		}
	}
	hi := push(t, q, item(5, "chat", 100))
	if !q.QueuedAtOrAbove(1) || !q.QueuedAtOrAbove(5) || q.QueuedAtOrAbove(6) {
		t.Error("band 5 queued: want true for 1 and 5, false for 6")
	}
	if it := q.Next(t0); it != hi { // popped: out of the queue
		t.Fatal("band 5 not first")
	}
	if q.QueuedAtOrAbove(1) {
		t.Error("band 5's only request popped: still reported queued")
	}
}
