package flowcontrol

import "container/heap"

// What happens to a pool's flows outside the queue: work served to requests that never
// waited (Charge), and a placement taken back after Dispatched (Return).

// Active reports, without taking the queue's lock, whether the queue holds anything a
// Charge could change: some band with queued or in-flight items or remembered flows. A
// caller skips Charge (and classifying the request for it) while it is false: with no band,
// a charge is forgotten at once (there is nothing to compare it with).
func (q *Queue) Active() bool { return q.active.Load() }

// Charge charges flowID, of band priority, the work actual cost a request of it that was
// served outside the queue: one that went straight to a replica because its pool had room.
// The virtual token counter counts all the service a flow received (Sheng et al., OSDI '24),
// so a flow whose requests still ran when the pool saturated is not level with a quiet one
// once both wait.
//
// The rule for a flow that is not backlogged is VTC's for a request that arrives: the flow
// is first lifted to the band's floor (the least backlogged counter, at least the band's
// virtual time), as if the request had entered the queue, so it banks no credit, and then
// charged. A backlogged flow is charged without a lift. The work is clamped to
// [0, MaxRequestWork]. So a flow's debt above the floor is at most the work it was served
// while its band had a backlog, and it is forgotten when the backlog empties (the band's
// virtual time moves up to the flow's counter and the flow is dropped, as for any flow);
// work served while nothing of the band waits only moves the virtual time. With
// round-robin fairness nothing is charged (a turn is a request dispatched from the queue).
//
// A band that does not exist is not created: nothing could compare the charge. Charge
// allocates only to remember a flow the band does not know while the band has a backlog.
// O(log n).
func (q *Queue) Charge(priority int, flowID string, actual Cost) {
	if !q.active.Load() {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.byPrio[priority]
	if b == nil || q.cfg.roundRobin() {
		return
	}
	w := q.cfg.weigh(actual)
	if w <= 0 {
		return
	}
	f := b.flows[flowID]
	switch {
	case f != nil && f.heapIdx >= 0: // backlogged: in VTC's queue, charged as served
		f.counter += w
		f.served += w
		heap.Fix(&b.backlog, f.heapIdx)
		return
	case f != nil:
		f.counter = max(f.counter, b.floor()) + w
		f.served += w
		q.forget(f) // parks it in the idle heap, or drops it when nothing contends
		return
	case !b.contended():
		// Nothing of the band waits: the flow would be lifted to the virtual time, charged,
		// and forgotten at once, its counter becoming the virtual time (forget).
		b.vtime += w
		return
	}
	f = &flow{id: flowID, band: b, heapIdx: -1, fatIdx: -1, idleIdx: -1, counter: b.floor() + w, served: w}
	b.flows[flowID] = f
	q.forget(f)
}

// floor is the counter a flow that becomes backlogged is lifted to: the band's virtual time
// or, when higher, its least backlogged counter.
func (b *band) floor() int64 {
	fl := b.vtime
	if len(b.backlog) > 0 {
		fl = max(fl, b.backlog[0].counter)
	}
	return fl
}

// Return puts a dispatched item back at the head of its flow, its charge undone as Requeue
// undoes it, so it keeps its place: the placement was taken back before anything was sent
// (a peered prefixlb's request took the replica's slot first). Its next outcome comes on
// Done; after Drain it is Shutdown. The caller must have received Dispatched from Done. It
// reports false, doing nothing, for an item that is not dispatched and unsettled, or whose
// outcome is unread.
func (q *Queue) Return(it *Item) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.state != stateInFlight || len(it.done) > 0 {
		return false
	}
	q.putBack(it, false)
	return true
}
