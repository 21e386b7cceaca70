// Package flowcontrol is prefixlb's flow-control queue: where a request waits, when every
// replica of its model pool is saturated, until a slot frees, and in what order requests
// leave it. One Queue serves one model pool.
//
// Ordering (docs/flow-control.md explains each rule and why):
//   - priority bands, higher first, with a guaranteed share of GPU work for every backlogged
//     lower band (Config.MinBandShare) so strict bands cannot starve lower ones under
//     sustained overload;
//   - within a band, fair share across flows by the virtual token counter (Sheng et al.,
//     "Fairness in Serving Large Language Models", OSDI '24): the backlogged flow that was
//     served the least GPU work goes next;
//   - within a flow, arrival order.
//
// A request that never waited (its pool had room) is charged to its flow with Charge when
// it ends, so the counters count all the service each flow received (outside.go).
//
// A Classifier (classify.go) gives each request its priority and flow from the
// flow_control section's rules and, when they are trusted, its headers.
//
// The queue is pure: it does no I/O, starts no goroutines and reads no clock (every method
// that needs the time takes now). It never sees prompt text and never logs flow IDs.
//
// Lock discipline: a Queue is safe for concurrent use; every method takes the queue's one
// mutex for its whole run and releases it before returning, and none calls back into caller
// code. Outcomes are delivered on each Item's buffered channel (capacity 1, exactly one send
// per Push), so a send under the lock never blocks. Once pushed, an Item's exported fields
// belong to the queue until its outcome is delivered: the caller reads them, never writes.
//
// Life of an item: Push (or a refusal error) → queued → one of
//   - Next pops it for placement; the caller then calls Dispatched (placed: outcome
//     Dispatched) or Requeue (no room after all: back at the head of its flow), and after
//     a dispatched response ends, Settle with the work it really cost; a dispatched item
//     whose placement was taken back before anything was sent goes back with Return (at
//     the head of its flow, queued again);
//   - Expire or Next finds it past its deadline (Expired);
//   - Remove: its client left (Cancelled);
//   - Shed: the pool became saturated and it is sheddable (Shed);
//   - Drain: shutdown (Shutdown).
package flowcontrol
