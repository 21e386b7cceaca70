package flowcontrol

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustNew(t testing.TB, cfg Config) *Queue {
	t.Helper()
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func item(prio int, flow string, prefill int) *Item {
	return &Item{Priority: prio, Flow: flow, Cost: Cost{UncachedPrefillTokens: prefill}, Arrival: t0}
}

func push(t testing.TB, q *Queue, it *Item) *Item {
	t.Helper()
	if err := q.Push(it, false); err != nil {
		t.Fatalf("push %+v: %v", it, err)
	}
	return it
}

// outcome is the item's delivered outcome, or 0 when none is waiting.
func outcome(it *Item) Outcome {
	select {
	case o := <-it.done:
		return o
	default:
		return 0
	}
}

// dispatch pops the next item and completes it as placed with its predicted cost.
func dispatch(t testing.TB, q *Queue, now time.Time) *Item {
	t.Helper()
	it := q.Next(now)
	if it == nil {
		return nil
	}
	if !q.Dispatched(it) {
		t.Fatal("Dispatched refused a popped item")
	}
	if o := outcome(it); o != Dispatched {
		t.Fatalf("outcome %v, want dispatched", o)
	}
	if !q.Settle(it, it.Cost) {
		t.Fatal("Settle refused a dispatched item")
	}
	return it
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero takes defaults", Config{}, true},
		{"strict bands", Config{MinBandShare: -1}, true},
		{"share too large", Config{MinBandShare: 0.6}, false},
		{"negative items", Config{MaxItems: -1}, false},
		{"negative bytes", Config{MaxBytes: -1}, false},
		{"negative weight", Config{DecodeWeight: -2}, false},
		{"negative max work", Config{MaxRequestWork: -5}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New(%+v) error %v, want ok=%v", tc.cfg, err, tc.ok)
			}
		})
	}
	q := mustNew(t, Config{})
	if c := q.Config(); c.MaxItems != DefaultMaxItems || c.MinBandShare != DefaultMinBandShare || c.PrefillWeight != 1 || c.DecodeWeight != 2 {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if w := q.Config().Work(Cost{UncachedPrefillTokens: 100, OutputTokens: 50}); w != 200 {
		t.Fatalf("work of 100 prefill + 50 output = %d, want 200 at weights 1 and 2", w)
	}
	if w := q.Config().Work(Cost{}); w != 1 {
		t.Fatalf("work of an empty cost = %d, want the floor 1", w)
	}
	if w := q.Config().Work(Cost{UncachedPrefillTokens: 1 << 30}); w != DefaultMaxRequestWork {
		t.Fatalf("work of a huge cost = %d, want the cap %d", w, DefaultMaxRequestWork)
	}
}

// Strict bands (share 0) serve every higher band first; FIFO within a flow.
func TestBandOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		share float64
		push  []int // priorities, flow "f", in arrival order
		want  []int // indexes into push, in dispatch order
	}{
		{"higher first", -1, []int{0, 5, 1}, []int{1, 2, 0}},
		{"fifo within band", -1, []int{1, 1, 1}, []int{0, 1, 2}},
		{"negative last", -1, []int{-1, 0, -3, 2}, []int{3, 1, 0, 2}},
		{"interleaved", -1, []int{0, 2, 0, 2, 1}, []int{1, 3, 4, 0, 2}},
		// With the default share, a lower band's first item needs credit from 19 items of
		// equal work above it (5% of the total), so 3 higher items change nothing.
		{"default share, short backlog", 0, []int{0, 2, 2, 2}, []int{1, 2, 3, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew(t, Config{MinBandShare: tc.share})
			items := make([]*Item, len(tc.push))
			for i, p := range tc.push {
				items[i] = push(t, q, item(p, "f", 100))
			}
			for k, w := range tc.want {
				if got := dispatch(t, q, t0); got != items[w] {
					t.Fatalf("dispatch %d: got priority %d item, want item %d (priority %d)", k, got.Priority, w, tc.push[w])
				}
			}
			if q.Next(t0) != nil || q.Len() != 0 {
				t.Fatal("queue not empty after dispatching everything")
			}
		})
	}
}

func TestFIFOWithinFlow(t *testing.T) {
	q := mustNew(t, Config{})
	var items []*Item
	for i := range 50 {
		// Costs vary: order within a flow is arrival, never cost.
		items = append(items, push(t, q, item(0, "a", 1+(i*7919)%3000)))
	}
	for i := range items {
		if got := dispatch(t, q, t0); got != items[i] {
			t.Fatalf("dispatch %d out of arrival order", i)
		}
	}
}

func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		items     []Item
		saturated bool
		want      []error
	}{
		{"count bound", Config{MaxItems: 2}, []Item{{}, {}, {}}, true, []error{nil, nil, ErrFull}},
		{"byte bound", Config{MaxBytes: 100}, []Item{{Bytes: 60}, {Bytes: 41}, {Bytes: 40}}, true, []error{nil, ErrBytesFull, nil}},
		{"sheddable when saturated", Config{}, []Item{{Priority: -1}, {Priority: 0}}, true, []error{ErrShed, nil}},
		{"sheddable queued when not saturated", Config{}, []Item{{Priority: -1}}, false, []error{nil}},
		{"shed checked before full", Config{MaxItems: 1}, []Item{{}, {Priority: -2}}, true, []error{nil, ErrShed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew(t, tc.cfg)
			for i := range tc.items {
				it := tc.items[i]
				err := q.Push(&it, tc.saturated)
				if !errors.Is(err, tc.want[i]) {
					t.Fatalf("push %d: %v, want %v", i, err, tc.want[i])
				}
				if err != nil && Reason(err) == "" {
					t.Fatalf("refusal %v has no metric reason", err)
				}
			}
		})
	}
	q := mustNew(t, Config{MaxItems: 1})
	it := push(t, q, item(0, "a", 1))
	if err := q.Push(it, false); err != ErrInUse {
		t.Fatalf("pushing a queued item again: %v, want ErrInUse", err)
	}
	q.SetLimits(2, 0)
	push(t, q, item(0, "a", 1))
	if q.Len() != 2 {
		t.Fatal("SetLimits did not raise the bound")
	}
}

// Shed delivers Shed to queued sheddable items only.
func TestShedQueuedSheddable(t *testing.T) {
	q := mustNew(t, Config{})
	low := &Item{Priority: -1, Flow: "a"}
	if err := q.Push(low, false); err != nil {
		t.Fatal(err)
	}
	keep := push(t, q, item(0, "a", 1))
	if n := q.Shed(); n != 1 {
		t.Fatalf("Shed shed %d, want 1", n)
	}
	if o := outcome(low); o != Shed {
		t.Fatalf("sheddable item got %v, want shed", o)
	}
	if o := outcome(keep); o != 0 || q.Len() != 1 {
		t.Fatalf("priority-0 item touched by Shed: %v, len %d", o, q.Len())
	}
}

func TestDeadlines(t *testing.T) {
	q := mustNew(t, Config{})
	a := item(0, "a", 1)
	a.Deadline = t0.Add(3 * time.Second)
	b := item(0, "b", 1)
	b.Deadline = t0.Add(1 * time.Second)
	c := item(0, "c", 1) // no deadline
	push(t, q, a)
	push(t, q, b)
	push(t, q, c)
	if d, ok := q.NextDeadline(); !ok || !d.Equal(b.Deadline) {
		t.Fatalf("NextDeadline %v %v, want %v", d, ok, b.Deadline)
	}
	if n := q.Expire(t0.Add(999 * time.Millisecond)); n != 0 {
		t.Fatalf("expired %d before any deadline", n)
	}
	if n := q.Expire(t0.Add(time.Second)); n != 1 || outcome(b) != Expired {
		t.Fatalf("Expire at b's deadline expired %d", n)
	}
	if d, ok := q.NextDeadline(); !ok || !d.Equal(a.Deadline) {
		t.Fatalf("NextDeadline after expiry %v, want %v", d, a.Deadline)
	}
	// Next never dispatches an expired item: a is the head, past its deadline.
	if got := q.Next(t0.Add(4 * time.Second)); got != c {
		t.Fatalf("Next returned %v, want c (a is past its deadline)", got)
	}
	if outcome(a) != Expired {
		t.Fatal("Next skipped a without delivering Expired")
	}
	if _, ok := q.NextDeadline(); ok {
		t.Fatal("NextDeadline reports a deadline with none queued")
	}
}

func TestRemove(t *testing.T) {
	q := mustNew(t, Config{})
	a := push(t, q, item(0, "a", 1))
	b := push(t, q, item(0, "a", 1))
	b.Deadline = time.Time{}
	if !q.Remove(b) || outcome(b) != Cancelled {
		t.Fatal("Remove of a queued item did not cancel it")
	}
	if q.Remove(b) {
		t.Fatal("Remove of a removed item reported true")
	}
	got := q.Next(t0)
	if got != a {
		t.Fatal("Next did not return the remaining item")
	}
	if q.Remove(a) {
		t.Fatal("Remove of a popped item reported true: its outcome belongs to the placement")
	}
	if q.Len() != 0 || q.Bytes() != 0 {
		t.Fatalf("len %d bytes %d after remove and pop", q.Len(), q.Bytes())
	}
}

func TestDrain(t *testing.T) {
	q := mustNew(t, Config{})
	var items []*Item
	for i := range 10 {
		items = append(items, push(t, q, item(i%3, fmt.Sprint(i%4), 10)))
	}
	popped := q.Next(t0)
	placed := q.Next(t0)
	if n := q.Drain(); n != 8 {
		t.Fatalf("Drain answered %d, want 8", n)
	}
	for _, it := range items {
		if it == popped || it == placed {
			continue
		}
		if o := outcome(it); o != Shutdown {
			t.Fatalf("drained item got %v", o)
		}
	}
	if err := q.Push(item(0, "a", 1), false); err != ErrClosed {
		t.Fatalf("push after drain: %v, want ErrClosed", err)
	}
	if !q.Requeue(popped) || outcome(popped) != Shutdown {
		t.Fatal("Requeue after Drain did not deliver Shutdown")
	}
	if !q.Dispatched(placed) || outcome(placed) != Dispatched {
		t.Fatal("Dispatched after Drain did not deliver Dispatched")
	}
	if q.Len() != 0 || !q.Snapshot(t0).Closed {
		t.Fatal("queue not empty and closed after Drain")
	}
}

// A requeued item goes back to the head of its flow with its charge undone, so the next
// Next returns it again and the flows' order is as if it had never been popped.
func TestRequeueKeepsHeadPosition(t *testing.T) {
	q := mustNew(t, Config{})
	a1 := push(t, q, item(0, "a", 100))
	push(t, q, item(0, "a", 100))
	b1 := push(t, q, item(0, "b", 100))
	got := q.Next(t0)
	if got != a1 {
		t.Fatal("first Next is not a's head")
	}
	before := q.Snapshot(t0)
	if !q.Requeue(got) {
		t.Fatal("Requeue refused a popped item")
	}
	if q.Requeue(got) {
		t.Fatal("Requeue of a queued item reported true")
	}
	if again := q.Next(t0); again != a1 {
		t.Fatal("Next after Requeue is not the requeued item")
	}
	after := q.Snapshot(t0)
	if before.Bands[0].Flows[0].Counter != after.Bands[0].Flows[0].Counter {
		t.Fatalf("flow a's counter %d after requeue and pop, %d before: the charge was not undone",
			after.Bands[0].Flows[0].Counter, before.Bands[0].Flows[0].Counter)
	}
	q.Dispatched(a1)
	if got := q.Next(t0); got != b1 {
		t.Fatal("b's head did not follow a's dispatched head")
	}
}

// A lower band's credit popped and requeued is restored exactly: requeue loops grant no
// band any credit.
func TestRequeueUndoesBandCredit(t *testing.T) {
	q := mustNew(t, Config{MinBandShare: 0.5}) // credit 1 per unit of work above
	for range 4 {
		push(t, q, item(1, "hi", 100))
	}
	lo := push(t, q, item(0, "lo", 100))
	dispatch(t, q, t0) // a high item: lo earns 100 of credit
	for range 100 {
		got := q.Next(t0)
		if got != lo {
			t.Fatalf("lo (credit 100, work 100) should go next, got priority %d", got.Priority)
		}
		q.Requeue(got)
	}
	if c := q.Snapshot(t0).Bands[1].Credit; c != 100 {
		t.Fatalf("lo's credit %g after 100 pop/requeue rounds, want 100", c)
	}
	for range 100 {
		got := q.Next(t0)
		q.Requeue(got)
	}
	if got := dispatch(t, q, t0); got != lo {
		t.Fatal("lo lost its turn to requeue loops")
	}
	if got := dispatch(t, q, t0); got.Priority != 1 {
		t.Fatal("after spending its credit lo is served again before the high band")
	}
}

func TestStatesRefuseMisuse(t *testing.T) {
	q := mustNew(t, Config{})
	it := item(0, "a", 1)
	if q.Dispatched(it) || q.Requeue(it) || q.Settle(it, Cost{}) || q.Remove(it) {
		t.Fatal("an item never pushed was accepted")
	}
	push(t, q, it)
	if q.Dispatched(it) || q.Settle(it, Cost{}) {
		t.Fatal("a queued item was dispatched or settled without Next")
	}
	got := q.Next(t0)
	if q.Settle(got, Cost{}) {
		t.Fatal("a popped item was settled before Dispatched")
	}
	q.Dispatched(got)
	if q.Dispatched(got) {
		t.Fatal("Dispatched twice")
	}
	if err := q.Push(got, false); err != ErrInUse {
		t.Fatalf("re-push before settle and before its outcome was read: %v", err)
	}
	<-got.Done()
	if err := q.Push(got, false); err != ErrInUse {
		t.Fatalf("re-push before settle: %v", err)
	}
	q.Settle(got, got.Cost)
	if err := q.Push(got, false); err != nil {
		t.Fatalf("re-push after outcome and settle: %v", err)
	}
}

func TestSnapshot(t *testing.T) {
	q := mustNew(t, Config{})
	a := item(2, "tenant-a", 10)
	a.Bytes, a.Arrival = 500, t0
	push(t, q, a)
	b := item(0, "tenant-b", 10)
	b.Bytes, b.Arrival = 300, t0.Add(time.Second)
	push(t, q, b)
	s := q.Snapshot(t0.Add(3 * time.Second))
	if s.Queued != 2 || s.Bytes != 800 || len(s.Bands) != 2 || s.Bands[0].Priority != 2 {
		t.Fatalf("snapshot %+v", s)
	}
	f := s.Bands[1].Flows[0]
	if f.Flow != "tenant-b" || f.Queued != 1 || f.Bytes != 300 || f.HeadAge != 2*time.Second {
		t.Fatalf("flow snapshot %+v", f)
	}
	dispatch(t, q, t0)
	s = q.Snapshot(t0)
	if len(s.Bands) != 1 || s.Bands[0].Priority != 0 {
		// tenant-a was the only flow of its band and settled with nothing contending: the
		// queue forgets it and the band.
		t.Fatalf("bands after the only priority-2 item settled: %+v", s.Bands)
	}
}

// TestAdaptiveLIFO: within a flow, arrival order while its oldest queued request has waited
// less than LIFOAfter, newest first once it has; a newest item put back (Requeue, Return)
// goes back to the tail, its place; LIFOAfter < 0 keeps arrival order.
func TestAdaptiveLIFO(t *testing.T) {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name  string
		after time.Duration
		now   int   // ms after t0, each Next
		want  []int // arrival indexes (arrivals at 0, 100, 200, 300 ms), in dispatch order
	}{
		{"young queue: arrival order", time.Second, 900, []int{0, 1, 2, 3}},
		{"oldest at the bound: newest first", time.Second, 1000, []int{3, 2, 1, 0}},
		// At 1150 ms only arrival 0 has waited 1 s: while it is queued the newest go first,
		// then it goes.
		{"standing head", time.Second, 1150, []int{3, 2, 1, 0}},
		{"off", -1, 60_000, []int{0, 1, 2, 3}},
	} {
		q := mustNew(t, Config{LIFOAfter: tc.after})
		var items []*Item
		for i := range 4 {
			it := item(0, "a", 100)
			it.Arrival = at(100 * i)
			items = append(items, push(t, q, it))
		}
		for k, w := range tc.want {
			if got := dispatch(t, q, at(tc.now)); got != items[w] {
				t.Fatalf("%s: dispatch %d is not arrival %d", tc.name, k, w)
			}
		}
	}
	q := mustNew(t, Config{})
	var items []*Item
	for i := range 3 {
		it := item(0, "a", 100)
		it.Arrival = at(100 * i)
		items = append(items, push(t, q, it))
	}
	now := at(5000)
	got := q.Next(now)
	if got != items[2] || !q.Requeue(got) {
		t.Fatal("standing queue: the first Next is not the newest, or Requeue refused it")
	}
	if got = q.Next(now); got != items[2] {
		t.Fatal("after Requeue the newest did not keep its place at the tail")
	}
	q.Dispatched(got)
	<-got.Done()
	if !q.Return(got) {
		t.Fatal("Return refused a dispatched item")
	}
	for k, w := range []int{2, 1, 0} {
		if got := dispatch(t, q, now); got != items[w] {
			t.Fatalf("after Return, dispatch %d is not arrival %d", k, w)
		}
	}
}

// TestLIFOPutBackKeepsArrivalOrder: an item popped newest first and put back (Requeue, Return)
// after newer items of its flow were pushed goes back to its place by arrival, not to the
// tail: the newer ones stay ahead of it in a standing flow and behind it in arrival order.
func TestLIFOPutBackKeepsArrivalOrder(t *testing.T) {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, back := range []string{"requeue", "return"} {
		q := mustNew(t, Config{})
		var items []*Item
		add := func(ms int) {
			it := item(0, "a", 100)
			it.Arrival = at(ms)
			items = append(items, push(t, q, it))
		}
		add(0)
		add(100)
		now := at(5000) // the flow's head has waited past LIFOAfter: newest first
		got := q.Next(now)
		if got != items[1] {
			t.Fatalf("%s: the first Next is not the newest", back)
		}
		if back == "return" {
			q.Dispatched(got)
			<-got.Done()
		}
		add(4900) // arrives while the newest is out
		add(4950)
		ok := false
		if back == "requeue" {
			ok = q.Requeue(got)
		} else {
			ok = q.Return(got)
		}
		if !ok {
			t.Fatalf("%s refused the item", back)
		}
		for k, w := range []int{3, 2, 1, 0} {
			if d := dispatch(t, q, now); d != items[w] {
				t.Fatalf("%s: dispatch %d is not arrival %d", back, k, w)
			}
		}
	}
}
