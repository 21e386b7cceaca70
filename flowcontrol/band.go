package flowcontrol

import "container/heap"

// band holds the flows of one priority. Its backlogged flows are a min-heap by served work
// (the virtual token counter); its idle flows that were served more than the band's
// virtual time are kept, in a second heap, until the band's virtual time passes them.
type band struct {
	priority int
	flows    map[string]*flow
	backlog  flowHeap // flows with queued items, least counter first
	fat      fatHeap  // the same flows, most queued items first (the victims of a full queue)
	idle     idleHeap // flows with nothing queued or in flight whose counter > vtime
	// vtime is the band's virtual time, never decreasing: the counter a dispatched flow had
	// before its charge (the least backlogged counter then), and, once the backlog empties,
	// the highest counter of its flows. A flow that becomes backlogged is lifted to at least
	// vtime and the least backlogged counter, so idle time banks no credit.
	vtime int64
	// lightAt is when, in unix nanoseconds, a flow was popped with nothing of its own
	// queued behind it while another flow was backlogged (0: never): Item.Yields.
	lightAt int64
	// lightFlow is the flow that lightAt noted: it yields to no one but another flow.
	lightFlow string
	// popped is the band's items popped by Next, not yet dispatched or requeued: while
	// any is out, an empty backlog is not settled (settleHistory), as a requeue refills it.
	popped int
	count  int
	bytes  int64

	// Guaranteed share: while this band is backlogged (items queued or popped), its credit
	// is share × (work dispatched from higher bands since it became backlogged) − work it was
	// served since then (Item.creditTaken). aboveServed is cumulative, so Requeue undoes a pop exactly.
	aboveServed int64
	creditBase  int64
	creditSpent int64
	// pendingAbove is the part of aboveServed from higher bands' items popped and not yet
	// dispatched or requeued: not served yet (a Requeue takes it back), so it earns no
	// credit (credit) and a credit base taken now leaves it out (enqueue, Reconfigure).
	pendingAbove int64
	seq          uint64 // creation order (Queue.bandSeq)
	baseAt       uint64 // Queue.placed when creditBase was taken (enqueue, Reconfigure)
}

// contended reports whether flows of the band compete now: some are backlogged, or have
// items popped that a Requeue may put back (the dispatcher sets requests aside).
func (b *band) contended() bool { return len(b.backlog) > 0 || b.popped > 0 }

func newBand(priority int) *band {
	return &band{priority: priority, flows: map[string]*flow{}}
}

// settleHistory runs when the band's backlog empties: fairness is a matter between
// contending flows, so the virtual time moves up to the highest idle counter and the idle
// flows are forgotten (each returns lifted to the virtual time, owing nothing, owed nothing).
// Flows with items in flight are forgotten the same way when they settle.
func (b *band) settleHistory() {
	for _, f := range b.idle {
		b.vtime = max(b.vtime, f.counter)
		f.idleIdx = -1
		delete(b.flows, f.id)
	}
	clear(b.idle)
	b.idle = b.idle[:0]
}

// restartFairness levels the band's flows (Reconfigure to another Fairness): every counter
// and the virtual time go to 0, the idle flows are forgotten, and the backlogged flows are
// then served by their heads' arrival until the new policy's counters tell them apart. The
// charges of items popped or in flight are wiped with the counters: their Requeue or Settle
// does not touch the counter (Queue.fairEpoch).
func (b *band) restartFairness() {
	b.vtime = 0
	for _, f := range b.idle {
		f.idleIdx = -1
		delete(b.flows, f.id)
	}
	clear(b.idle)
	b.idle = b.idle[:0]
	for _, f := range b.flows {
		f.counter = 0
	}
	heap.Init(&b.backlog)
}

// credit is the work the band may take ahead of higher bands now: its share of the work
// dispatched above, items popped and held out (set aside) not counted until placed.
func (b *band) credit(share float64) float64 {
	return share*float64(b.aboveServed-b.pendingAbove-b.creditBase) - float64(b.creditSpent)
}

// flow is one fairness key's FIFO within a band.
type flow struct {
	id       string
	band     *band
	counter  int64 // virtual token counter: served work plus lifts, token-equivalents
	served   int64 // work charged on dispatch, corrected by Settle, token-equivalents
	head     *Item
	tail     *Item
	count    int
	bytes    int64
	inflight int // popped or dispatched, not yet settled or requeued
	popped   int // popped, not yet dispatched or requeued
	heapIdx  int // index in band.backlog; -1 when not backlogged
	fatIdx   int // index in band.fat; -1 when not backlogged
	idleIdx  int // index in band.idle; -1 when not in it
}

func (f *flow) pushBack(it *Item) {
	it.prev, it.next = f.tail, nil
	if f.tail != nil {
		f.tail.next = it
	} else {
		f.head = it
	}
	f.tail = it
}

func (f *flow) pushFront(it *Item) {
	it.prev, it.next = nil, f.head
	if f.head != nil {
		f.head.prev = it
	} else {
		f.tail = it
	}
	f.head = it
}

// insertBySeq links it in arrival order (Item.seq), searching from the tail (fromTail: it was
// taken from the tail, and the items pushed after it are few) or from the head (it was taken
// from the head, and only the items of its flow put back before it are ahead of it).
func (f *flow) insertBySeq(it *Item, fromTail bool) {
	var p *Item // the item it goes after; nil: none, it is the head
	if fromTail {
		for p = f.tail; p != nil && p.seq > it.seq; p = p.prev {
		}
	} else {
		for n := f.head; n != nil && n.seq < it.seq; n = n.next {
			p = n
		}
	}
	if p == nil {
		f.pushFront(it)
		return
	}
	it.prev, it.next = p, p.next
	if p.next != nil {
		p.next.prev = it
	} else {
		f.tail = it
	}
	p.next = it
}

func (f *flow) unlink(it *Item) {
	if it.prev != nil {
		it.prev.next = it.next
	} else {
		f.head = it.next
	}
	if it.next != nil {
		it.next.prev = it.prev
	} else {
		f.tail = it.prev
	}
	it.prev, it.next = nil, nil
}

// flowHeap orders backlogged flows by counter, then by their head's arrival order.
type flowHeap []*flow

func (h flowHeap) Len() int { return len(h) }
func (h flowHeap) Less(i, j int) bool {
	if h[i].counter != h[j].counter {
		return h[i].counter < h[j].counter
	}
	return h[i].head.seq < h[j].head.seq
}
func (h flowHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *flowHeap) Push(x any) {
	f := x.(*flow)
	f.heapIdx = len(*h)
	*h = append(*h, f)
}
func (h *flowHeap) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	f.heapIdx = -1
	return f
}

// fatHeap orders backlogged flows by queued items, most first, then newest tail first.
type fatHeap []*flow

func (h fatHeap) Len() int { return len(h) }
func (h fatHeap) Less(i, j int) bool {
	if h[i].count != h[j].count {
		return h[i].count > h[j].count
	}
	return h[i].tail.seq > h[j].tail.seq
}
func (h fatHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].fatIdx, h[j].fatIdx = i, j
}
func (h *fatHeap) Push(x any) {
	f := x.(*flow)
	f.fatIdx = len(*h)
	*h = append(*h, f)
}
func (h *fatHeap) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	f.fatIdx = -1
	return f
}

// idleHeap orders idle flows by counter, so those the band's virtual time passed are
// forgotten first (forgetting them loses nothing: a returning flow is lifted to vtime).
type idleHeap []*flow

func (h idleHeap) Len() int           { return len(h) }
func (h idleHeap) Less(i, j int) bool { return h[i].counter < h[j].counter }
func (h idleHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idleIdx, h[j].idleIdx = i, j
}
func (h *idleHeap) Push(x any) {
	f := x.(*flow)
	f.idleIdx = len(*h)
	*h = append(*h, f)
}
func (h *idleHeap) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	f.idleIdx = -1
	return f
}

// deadlineHeap orders queued items that have a deadline, earliest first.
type deadlineHeap []*Item

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].Deadline.Before(h[j].Deadline) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].dlIndex, h[j].dlIndex = i, j
}
func (h *deadlineHeap) Push(x any) {
	it := x.(*Item)
	it.dlIndex = len(*h)
	*h = append(*h, it)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	it.dlIndex = -1
	return it
}

var (
	_ heap.Interface = (*flowHeap)(nil)
	_ heap.Interface = (*fatHeap)(nil)
	_ heap.Interface = (*idleHeap)(nil)
	_ heap.Interface = (*deadlineHeap)(nil)
)
