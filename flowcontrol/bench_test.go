package flowcontrol

import (
	"fmt"
	"testing"
)

// steadyQueue is the decision benchmark's queue: 1,000 items across 100 flows in 3 bands
// (flow i in band i%3, 10 items each), costs varied.
func steadyQueue(tb testing.TB) *Queue {
	q := mustNew(tb, Config{})
	for i := range 1000 {
		fl := i % 100
		it := &Item{Priority: fl % 3, Flow: fmt.Sprint("flow-", fl), Cost: Cost{UncachedPrefillTokens: 100 + (i*7919)%4000, OutputTokens: 50 + i%300}}
		if err := q.Push(it, true); err != nil {
			tb.Fatal(err)
		}
	}
	return q
}

// cycle is the steady path: pick the next item, place it, settle it with its actual cost,
// and push it back as a new request of the same flow, so the queue stays at 1,000.
func cycle(q *Queue) {
	it := q.Next(t0)
	q.Dispatched(it)
	<-it.Done()
	q.Settle(it, Cost{UncachedPrefillTokens: it.Cost.UncachedPrefillTokens, OutputTokens: it.Cost.OutputTokens + 10})
	if err := q.Push(it, true); err != nil {
		panic(err)
	}
}

// BenchmarkDispatchCycle: Next + Dispatched + Settle + Push at 1,000 items / 100 flows / 3
// bands, the whole per-request cost flow control adds on the steady path.
func BenchmarkDispatchCycle(b *testing.B) {
	q := steadyQueue(b)
	b.ReportAllocs()
	for b.Loop() {
		cycle(q)
	}
}

// BenchmarkNextRequeue: the decision alone (Next, then Requeue undoing it).
func BenchmarkNextRequeue(b *testing.B) {
	q := steadyQueue(b)
	b.ReportAllocs()
	for b.Loop() {
		q.Requeue(q.Next(t0))
	}
}

// The steady path allocates nothing.
func TestDispatchCycleAllocationFree(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	q := steadyQueue(t)
	if n := testing.AllocsPerRun(2000, func() { cycle(q) }); n != 0 {
		t.Fatalf("dispatch cycle allocates %.1f times per request, want 0", n)
	}
	if n := testing.AllocsPerRun(2000, func() { q.Requeue(q.Next(t0)) }); n != 0 {
		t.Fatalf("Next+Requeue allocates %.1f times, want 0", n)
	}
}
