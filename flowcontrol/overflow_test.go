package flowcontrol

import (
	"testing"
	"time"
)

// A full queue displaces the newest item of the fattest flow at the same or a lower
// priority, so a flooding flow cannot keep a light one out by filling the queue first.
func TestFullQueueDisplacesFattestFlow(t *testing.T) {
	type p struct {
		prio  int
		flow  string
		bytes int64
	}
	for _, tc := range []struct {
		name      string
		cfg       Config
		fill      []p
		push      p
		err       error
		displaced int // index into fill, -1 for none
	}{
		{"light flow displaces flooder's newest", Config{MaxItems: 4},
			[]p{{0, "heavy", 0}, {0, "heavy", 0}, {0, "heavy", 0}, {0, "heavy", 0}}, p{0, "light", 0}, nil, 3},
		{"own flow is never the victim", Config{MaxItems: 2},
			[]p{{0, "a", 0}, {0, "a", 0}}, p{0, "a", 0}, ErrFull, -1},
		{"equal flows: refused", Config{MaxItems: 4},
			[]p{{0, "a", 0}, {0, "a", 0}, {0, "b", 0}, {0, "b", 0}}, p{0, "b", 0}, ErrFull, -1},
		{"one more than own after push: refused", Config{MaxItems: 3},
			[]p{{0, "a", 0}, {0, "a", 0}, {0, "b", 0}}, p{0, "b", 0}, ErrFull, -1},
		{"higher priority displaces lower band first", Config{MaxItems: 3},
			[]p{{0, "low", 0}, {1, "mid", 0}, {1, "mid", 0}}, p{2, "x", 0}, nil, 0},
		{"lower priority never displaces higher", Config{MaxItems: 2},
			[]p{{1, "a", 0}, {1, "a", 0}}, p{0, "b", 0}, ErrFull, -1},
		{"bytes: victim frees enough", Config{MaxBytes: 100},
			[]p{{0, "a", 30}, {0, "a", 30}, {0, "a", 30}}, p{0, "b", 30}, nil, 2},
		{"bytes: victim frees too little", Config{MaxBytes: 100},
			[]p{{0, "a", 30}, {0, "a", 30}, {0, "a", 30}}, p{0, "b", 50}, ErrBytesFull, -1},
		{"bigger than the bound", Config{MaxBytes: 100}, nil, p{0, "b", 101}, ErrBytesFull, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew(t, tc.cfg)
			var fill []*Item
			for _, f := range tc.fill {
				fill = append(fill, push(t, q, &Item{Priority: f.prio, Flow: f.flow, Bytes: f.bytes}))
			}
			n, b := q.Len(), q.Bytes()
			it := &Item{Priority: tc.push.prio, Flow: tc.push.flow, Bytes: tc.push.bytes}
			if err := q.Push(it, false); err != tc.err {
				t.Fatalf("push: %v, want %v", err, tc.err)
			}
			for i, f := range fill {
				o := outcome(f)
				if i == tc.displaced && o != Displaced {
					t.Fatalf("item %d got %v, want displaced", i, o)
				}
				if i != tc.displaced && o != 0 {
					t.Fatalf("item %d got %v, want still queued", i, o)
				}
			}
			if tc.err != nil && (q.Len() != n || q.Bytes() != b) {
				t.Fatalf("a refused push changed the queue: len %d→%d bytes %d→%d", n, q.Len(), b, q.Bytes())
			}
		})
	}
}

// TestFullQueueDisplacesStaleUnderLIFO: the victim of a full queue is the request its flow
// would serve last: the newest while the flow keeps arrival order, the oldest once the flow
// stands past LIFOAfter and is served newest first (the oldest is the one most likely
// abandoned by its client; the newest is the one adaptive LIFO would serve next).
func TestFullQueueDisplacesStaleUnderLIFO(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pushAt    time.Duration // the light flow's push, after the first heavy arrival
		displaced int
	}{
		{"young flow: the newest", 500 * time.Millisecond, 2},
		{"standing flow: the oldest", 5 * time.Second, 0},
	} {
		q := mustNew(t, Config{MaxItems: 3})
		var heavy []*Item
		for i := range 3 {
			heavy = append(heavy, push(t, q, &Item{Flow: "heavy", Arrival: t0.Add(time.Duration(i) * 100 * time.Millisecond)}))
		}
		if err := q.Push(&Item{Flow: "light", Arrival: t0.Add(tc.pushAt)}, false); err != nil {
			t.Fatalf("%s: push: %v", tc.name, err)
		}
		for i, it := range heavy {
			o := outcome(it)
			if i == tc.displaced && o != Displaced {
				t.Fatalf("%s: heavy %d got %v, want displaced", tc.name, i, o)
			}
			if i != tc.displaced && o != 0 {
				t.Fatalf("%s: heavy %d got %v, want still queued", tc.name, i, o)
			}
		}
	}
}
