package flowcontrol

import (
	"testing"
	"time"
)

// TestBandsSeen: the highest band noted is remembered for BandMemory after its last request;
// a higher band replaces it at once, a lower one only once it is forgotten, and an equal one
// refreshes it. BandMemory < 0 turns the memory off.
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
		{"one band", 0, []note{{1, 0}}, 5, 1, true},
		{"forgotten after the memory", 0, []note{{1, 0}}, 10.5, 0, false},
		{"a higher band replaces", 0, []note{{0, 0}, {3, 1}}, 2, 3, true},
		{"a lower band does not", 0, []note{{3, 0}, {0, 1}}, 2, 3, true},
		{"an equal band refreshes", 0, []note{{3, 0}, {3, 8}}, 15, 3, true},
		{"a lower band replaces a forgotten one", 0, []note{{3, 0}, {0, 11}}, 12, 0, true},
		{"a short memory", 2 * time.Second, []note{{3, 0}}, 2.5, 0, false},
		{"memory off", -1, []note{{3, 0}}, 0, 0, false},
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
	if err := q.Reconfigure(Config{BandMemory: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, ok := q.TopBand(at(2)); ok {
		t.Error("Reconfigure did not shorten the memory")
	}
}
