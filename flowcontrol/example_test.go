package flowcontrol_test

import (
	"fmt"
	"time"

	"github.com/prefixlb/prefixlb/flowcontrol"
)

// The proxy's side: a request handler pushes when its pool is saturated and waits; the
// dispatcher, woken when a replica frees a slot, pops, places and settles.
func Example() {
	q, err := flowcontrol.New(flowcontrol.Config{MaxItems: 100})
	if err != nil {
		panic(err)
	}
	now := time.Now()
	batch := &flowcontrol.Item{Priority: 0, Flow: "key:batch", Cost: flowcontrol.Cost{UncachedPrefillTokens: 8000, OutputTokens: 200}, Arrival: now}
	chat := &flowcontrol.Item{Priority: 1, Flow: "key:chat", Cost: flowcontrol.Cost{UncachedPrefillTokens: 300, OutputTokens: 150}, Arrival: now, Deadline: now.Add(30 * time.Second)}
	for _, it := range []*flowcontrol.Item{batch, chat} {
		if err := q.Push(it, true); err != nil {
			fmt.Println("refused:", flowcontrol.Reason(err)) // 429/503 with Retry-After
		}
	}

	// A slot freed: place the head with the state of this moment.
	it := q.Next(now)
	q.Dispatched(it) // placement found room; Requeue(it) when it did not
	fmt.Println(it.Flow, <-it.Done())
	// The response ended: charge what it really cost.
	q.Settle(it, flowcontrol.Cost{UncachedPrefillTokens: 300, OutputTokens: 90})

	// The batch request's client leaves while queued: no replica sees it.
	q.Remove(batch)
	fmt.Println(batch.Flow, <-batch.Done())
	// Output:
	// key:chat dispatched
	// key:batch cancelled
}
