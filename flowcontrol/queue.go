package flowcontrol

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"
)

// Queue is the flow-control queue of one model pool. Create it with New; see the package
// documentation for the ordering, the life of an item and the lock discipline.
type Queue struct {
	mu        sync.Mutex
	cfg       Config
	share     float64 // credit per unit of work dispatched above: f/(1-f) gives a band f of the total
	bands     []*band // highest priority first
	byPrio    map[int]*band
	deadlines deadlineHeap
	count     int
	bytes     int64
	seq       uint64
	closed    bool
	// bandSeq numbers the bands as they are created (band.seq): an item popped counted its
	// work above the bands that existed then (Item.bandSeq), and only those take it back.
	bandSeq uint64
	// fairEpoch counts the Fairness changes (Reconfigure): an item charged under an earlier
	// one has its charge to the flow's counter wiped by the restart (restartFairness), so
	// neither Requeue nor Settle undoes or corrects it.
	fairEpoch uint32
	// placed numbers the dispatches (Item.placed): a Return takes an item's work back only
	// from the bands whose credit base was taken before it (band.baseAt), which counted it.
	placed uint64
	// active is len(bands) > 0, readable without the lock (Active).
	active atomic.Bool
	// seen is the highest band noted lately (NoteBand), memory its Config.BandMemory in
	// nanoseconds (negative: off), both readable without the lock.
	seen   bandsSeen
	memory atomic.Int64
}

// New returns an empty queue; zero fields of cfg take the defaults. It fails on a field out
// of range, naming it.
func New(cfg Config) (*Queue, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	q := &Queue{
		cfg:    cfg,
		share:  cfg.MinBandShare / (1 - cfg.MinBandShare),
		byPrio: map[int]*band{},
	}
	q.memory.Store(int64(cfg.BandMemory))
	return q, nil
}

// Config is the queue's configuration, defaults filled in.
func (q *Queue) Config() Config {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cfg
}

// SetLimits changes the bounds (a reload): items already queued stay, new pushes see the new
// bounds. Zero means the default; negative values are ignored.
func (q *Queue) SetLimits(maxItems int, maxBytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if maxItems == 0 {
		maxItems = DefaultMaxItems
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxBytes
	}
	if maxItems > 0 {
		q.cfg.MaxItems = maxItems
	}
	if maxBytes > 0 {
		q.cfg.MaxBytes = maxBytes
	}
}

// Reconfigure applies cfg to a queue in use (a reload; zero fields take the defaults, as in
// New): the bounds as SetLimits applies them, and the band share, the work cap and the
// weights to the work dispatched, charged and settled from now on. Queued items stay, with
// the work computed at their Push; each band keeps the credit it had earned, which then
// grows at the new share. It fails, changing nothing, on a field out of range.
func (q *Queue) Reconfigure(cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if share := cfg.MinBandShare / (1 - cfg.MinBandShare); share != q.share {
		for _, b := range q.bands {
			// Rebase: the credit earned so far, at the old share, becomes credit not yet
			// spent. Work of higher bands' items popped and not yet placed is not in it, and
			// counts at the new share once dispatched (a Requeue takes it back out of
			// aboveServed and pendingAbove together).
			c := b.credit(q.share)
			b.creditBase, b.creditSpent, b.baseAt = b.aboveServed-b.pendingAbove, -int64(c), q.placed
		}
		q.share = share
	}
	if cfg.Fairness != q.cfg.Fairness {
		// The counters were kept in the old policy's units (work or turns): every band's
		// fairness starts afresh, its flows level, in the new units.
		for _, b := range q.bands {
			b.restartFairness()
		}
		q.fairEpoch++
	}
	q.cfg = cfg
	q.memory.Store(int64(cfg.BandMemory))
	return nil
}

// Len is the number of queued items (popped and in-flight ones excluded).
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.count
}

// Bytes is the body bytes of the queued items.
func (q *Queue) Bytes() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes
}

// Push queues it, or refuses it at once: ErrShed when it is sheddable and the caller judged
// the pool saturated, ErrFull or ErrBytesFull when it would exceed a bound, ErrClosed after
// Drain, ErrInUse when it is already queued or awaiting its outcome. A refused item gets no
// outcome on Done. O(log n).
func (q *Queue) Push(it *Item, saturated bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case it.state != stateIdle || (it.done != nil && len(it.done) > 0):
		return ErrInUse
	case q.closed:
		return ErrClosed
	case Sheddable(it.Priority, saturated):
		return ErrShed
	case it.Bytes > q.cfg.MaxBytes:
		return ErrBytesFull
	}
	if q.count >= q.cfg.MaxItems || q.bytes+max(it.Bytes, 0) > q.cfg.MaxBytes {
		if err := q.makeRoom(it); err != nil {
			return err
		}
	}
	if it.done == nil {
		it.done = make(chan Outcome, 1)
	}
	it.Bytes = max(it.Bytes, 0)
	it.work = q.cfg.Work(it.Cost)
	it.charged, it.ticket, it.credit, it.creditTaken, it.newest, it.dlIndex = 0, 0, false, 0, false, -1
	q.seq++
	it.seq = q.seq
	b := q.byPrio[it.Priority]
	if b == nil {
		b = q.addBand(it.Priority)
	}
	f := b.flows[it.Flow]
	if f == nil {
		f = &flow{id: it.Flow, band: b, heapIdx: -1, fatIdx: -1, idleIdx: -1}
		b.flows[it.Flow] = f
	}
	q.enqueue(it, f, false)
	return nil
}

// Next pops the item to place now, or nil when none is queued. Items found past their
// deadline on the way get Expired. The item's flow is charged its predicted work at once,
// so consecutive calls share fairly; the caller then calls Dispatched or Requeue.
// O(bands + log n), allocation-free.
func (q *Queue) Next(now time.Time) *Item {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		b, bi, credited := q.pick(now)
		if b == nil {
			return nil
		}
		f := b.backlog[0]
		it, newest := q.nextOf(b, now)
		b.popped++ // settled when it is dispatched (Dispatched), not while it may come back
		q.dequeue(it)
		if !it.Deadline.IsZero() && !now.Before(it.Deadline) {
			b.popped--
			q.settleIfEmpty(b)
			q.finish(it, Expired)
			continue
		}
		it.yields = q.yields(b, f, now)
		if f.popped == 0 {
			// Its counter before the charge; not while items of its own popped before
			// this one are out: their charges go if they are put back (Requeue).
			b.vtime = max(b.vtime, f.counter)
		}
		f.popped++
		it.ticket, it.fairEpoch = it.work, q.fairEpoch
		if q.cfg.roundRobin() {
			it.ticket = 1 // one turn per request, whatever it costs
		}
		f.counter += it.ticket
		f.served += it.work
		it.charged = it.work
		f.inflight++
		if f.heapIdx >= 0 {
			heap.Fix(&b.backlog, f.heapIdx)
		}
		it.credit, it.newest = credited, newest
		// Any work the band is served counts toward its guaranteed share: popped on credit,
		// its whole work is spent from the credit; popped as the top band, as much of it as
		// the credit holds (a band served while the bands above were idle is owed nothing
		// for that time: its credit does not bank up to jump them when they queue again).
		it.creditTaken = it.work
		if !credited {
			it.creditTaken = min(it.work, max(int64(b.credit(q.share)), 0))
		}
		b.creditSpent += it.creditTaken
		for _, lb := range q.bands[bi+1:] {
			lb.aboveServed += it.work
			lb.pendingAbove += it.work
		}
		it.bandSeq = q.bandSeq
		it.state = statePopped
		q.pruneIdle(b)
		return it
	}
}

// Requeue puts an item popped by Next back at the head of its flow (placement found no room
// after all), undoing its charge, so it keeps its place. After Drain it gets Shutdown
// instead. It reports false, doing nothing, for an item not popped by Next.
func (q *Queue) Requeue(it *Item) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.state != statePopped {
		return false
	}
	unpop(it)
	q.putBack(it, true)
	q.settleIfEmpty(it.flow.band) // after Drain: not put back
	return true
}

// putBack undoes the charge Next made for it (its flow's counter and served work, the band
// credit it spent, the work it added above the lower bands; popped: it was not placed) and
// queues it at the head of its flow, or delivers Shutdown after Drain.
func (q *Queue) putBack(it *Item, popped bool) {
	f := it.flow
	b := f.band
	if it.fairEpoch == q.fairEpoch {
		f.counter -= it.ticket
	}
	f.served -= it.charged
	it.charged, it.ticket = 0, 0
	f.inflight--
	for _, lb := range q.bandsBelow(it) {
		switch {
		case lb.seq > it.bandSeq: // created after its pop: it was not counted there
		case popped:
			lb.aboveServed -= it.work
			lb.pendingAbove -= it.work
		case lb.baseAt < it.placed:
			// Dispatched and counted since the band's credit base: taken back. Dispatched
			// before it, it is in the base and the band never earned on it (after a
			// Reconfigure rebase, the credit it earned at the old share stays: bounded by
			// share × MaxRequestWork, and never below zero).
			lb.aboveServed -= it.work
		}
	}
	b.creditSpent -= it.creditTaken
	it.credit, it.creditTaken = false, 0
	if q.closed {
		q.finish(it, Shutdown)
		return
	}
	q.enqueue(it, f, true)
	if it.next != nil && it.next.seq < it.seq {
		// Back to its place by arrival (the flow stays in arrival order, which the flow
		// heaps and newest-first read): taken from the tail (adaptive LIFO), behind the
		// items of its flow pushed while it was out; or put back after an item of its flow
		// popped before it (a Requeue in pop order, a Return while the dispatcher holds the
		// next one aside), behind that one.
		f.unlink(it)
		f.insertBySeq(it, it.newest)
		heap.Fix(&f.band.backlog, f.heapIdx)
		heap.Fix(&f.band.fat, f.fatIdx)
	}
	it.newest = false
}

// Dispatched delivers Dispatched to an item popped by Next that the caller placed. Its flow
// keeps the predicted charge until Settle. It reports false for an item not popped by Next.
func (q *Queue) Dispatched(it *Item) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.state != statePopped {
		return false
	}
	unpop(it)
	for _, lb := range q.bandsBelow(it) {
		if lb.seq <= it.bandSeq {
			lb.pendingAbove -= it.work
		}
	}
	q.placed++
	it.placed = q.placed
	q.settleIfEmpty(it.flow.band)
	it.state = stateInFlight
	it.done <- Dispatched
	return true
}

// Settle corrects a dispatched item's charge to the work it really cost (call it once, when
// the response ends; with a zero Cost when the replica did no work), clamped to
// [0, MaxRequestWork] so a wrong prediction moves its flow by a bounded amount. The item may
// then be pushed again. It reports false for an item that is not dispatched and unsettled.
func (q *Queue) Settle(it *Item, actual Cost) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.state != stateInFlight {
		return false
	}
	w := q.cfg.weigh(actual)
	f := it.flow
	if !q.cfg.roundRobin() && it.fairEpoch == q.fairEpoch {
		f.counter += w - it.ticket // round-robin's turn stays one turn
	}
	f.served += w - it.charged
	it.charged, it.ticket = 0, 0
	f.inflight--
	it.state = stateIdle
	if f.heapIdx >= 0 {
		heap.Fix(&f.band.backlog, f.heapIdx)
	}
	q.forget(f)
	return true
}

// Remove takes a queued item out (its client left) and delivers Cancelled. It reports false
// when the item is not queued: popped (its outcome is coming) or already out.
func (q *Queue) Remove(it *Item) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.state != stateQueued {
		return false
	}
	q.dequeue(it)
	q.finish(it, Cancelled)
	return true
}

// Expire delivers Expired to every queued item whose deadline is at or before now, and
// returns how many. O(k log n) for k expired.
func (q *Queue) Expire(now time.Time) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for len(q.deadlines) > 0 && !now.Before(q.deadlines[0].Deadline) {
		it := q.deadlines[0]
		q.dequeue(it)
		q.finish(it, Expired)
		n++
	}
	return n
}

// NextDeadline is the earliest deadline of a queued item, for the caller's one timer; false
// when no queued item has one.
func (q *Queue) NextDeadline() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.deadlines) == 0 {
		return time.Time{}, false
	}
	return q.deadlines[0].Deadline, true
}

// Shed delivers Shed to every queued sheddable item (priority < 0): the caller calls it when
// it finds the pool saturated. It returns how many.
func (q *Queue) Shed() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.clear(func(b *band) bool { return b.priority < 0 }, Shed)
}

// Drain closes the queue (Push then fails with ErrClosed) and delivers Shutdown to every
// queued item, returning how many. Items popped by Next stay the caller's: Dispatched still
// works, Requeue delivers Shutdown.
func (q *Queue) Drain() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	return q.clear(func(*band) bool { return true }, Shutdown)
}

func (q *Queue) clear(match func(*band) bool, o Outcome) int {
	n := 0
	for _, b := range append([]*band(nil), q.bands...) {
		if !match(b) {
			continue
		}
		for len(b.backlog) > 0 {
			it := b.backlog[0].head
			q.dequeue(it)
			q.finish(it, o)
			n++
		}
	}
	return n
}

// yields notes a flow under its share served in b (f popped with nothing of its own left
// queued while another flow is backlogged) and reports whether f, backlogged, yields to
// one served within the band memory (Item.Yields).
func (q *Queue) yields(b *band, f *flow, now time.Time) bool {
	t := now.UnixNano()
	if f.count == 0 && f.popped == 0 { // its items popped and not yet placed count as behind it
		if len(b.backlog) > 0 {
			b.lightAt, b.lightFlow = t, f.id
		}
		return false
	}
	m := q.memory.Load()
	return m >= 0 && b.lightAt != 0 && t-b.lightAt <= m && b.lightFlow != f.id
}

// nextOf is the item Next pops from backlogged band b at now: the head of its least-served
// flow or, once that head waited LIFOAfter (a standing queue), the flow's newest.
func (q *Queue) nextOf(b *band, now time.Time) (it *Item, newest bool) {
	f := b.backlog[0]
	it = f.head
	if q.cfg.LIFOAfter > 0 && !it.Arrival.IsZero() && now.Sub(it.Arrival) >= q.cfg.LIFOAfter {
		return f.tail, true // a standing queue: the newest first (Config.LIFOAfter)
	}
	return it, false
}

// pick chooses the band to dispatch from at now: the lowest-index (highest-priority) band
// below the top backlogged one whose credit covers the item it would pop (nextOf), else the
// top backlogged band.
func (q *Queue) pick(now time.Time) (b *band, index int, credited bool) {
	top := -1
	for i, b := range q.bands {
		if b.count > 0 {
			top = i
			break
		}
	}
	if top < 0 {
		return nil, -1, false
	}
	if q.share > 0 {
		for i := top + 1; i < len(q.bands); i++ {
			lb := q.bands[i]
			if lb.count > 0 {
				if it, _ := q.nextOf(lb, now); lb.credit(q.share) >= float64(it.work) {
					return lb, i, true
				}
			}
		}
	}
	return q.bands[top], top, false
}

// enqueue links it into f, at the back for a push or the front for a requeue.
func (q *Queue) enqueue(it *Item, f *flow, front bool) {
	b := f.band
	if b.count == 0 && b.popped == 0 && !front {
		// Backlogged from now: it earns on work dispatched above from now, which a higher
		// band's item popped and not yet placed is not yet (a Requeue takes it back). A band
		// whose items are all popped (set aside, or placed this instant) still waits: it
		// keeps its credit, and what those items spent comes back if they are put back.
		b.creditBase, b.creditSpent, b.baseAt = b.aboveServed-b.pendingAbove, 0, q.placed
	}
	if f.heapIdx < 0 {
		if f.idleIdx >= 0 {
			heap.Remove(&b.idle, f.idleIdx)
		}
		if !front {
			// Lifted to the least backlogged counter less its burst credit
			// (Config.BurstCredit), and at least one token-equivalent under it: it goes
			// before the flows it ties with, which were served while it was away. A
			// round-robin turn is a whole request: it joins the rotation.
			lift := b.floor()
			if !q.cfg.roundRobin() {
				lift -= max(q.cfg.BurstCredit, 1)
			}
			f.counter = max(f.counter, lift)
		}
	}
	if front {
		f.pushFront(it)
	} else {
		f.pushBack(it)
	}
	it.flow = f
	it.state = stateQueued
	f.count++
	f.bytes += it.Bytes
	b.count++
	b.bytes += it.Bytes
	q.count++
	q.bytes += it.Bytes
	if !it.Deadline.IsZero() {
		heap.Push(&q.deadlines, it)
	}
	if f.heapIdx < 0 {
		heap.Push(&b.backlog, f)
		heap.Push(&b.fat, f)
		return
	}
	if front {
		heap.Fix(&b.backlog, f.heapIdx)
	}
	heap.Fix(&b.fat, f.fatIdx)
}

// dequeue unlinks a queued item from its flow, band, the deadline heap and the counts.
func (q *Queue) dequeue(it *Item) {
	f := it.flow
	b := f.band
	wasHead := f.head == it
	f.unlink(it)
	f.count--
	f.bytes -= it.Bytes
	b.count--
	b.bytes -= it.Bytes
	q.count--
	q.bytes -= it.Bytes
	if it.dlIndex >= 0 {
		heap.Remove(&q.deadlines, it.dlIndex)
	}
	switch {
	case f.count == 0:
		heap.Remove(&b.backlog, f.heapIdx)
		heap.Remove(&b.fat, f.fatIdx)
		q.settleIfEmpty(b)
	default:
		if wasHead {
			heap.Fix(&b.backlog, f.heapIdx)
		}
		heap.Fix(&b.fat, f.fatIdx)
	}
}

// unpop uncounts a popped item from its flow's and band's popped items (Next counts them).
func unpop(it *Item) {
	it.flow.popped--
	it.flow.band.popped--
}

// settleIfEmpty settles b's history (settleHistory) when nothing of it is queued or popped
// (band.contended).
func (q *Queue) settleIfEmpty(b *band) {
	if !b.contended() {
		b.settleHistory()
	}
}

// finish delivers an outcome other than Dispatched to an item no longer queued.
func (q *Queue) finish(it *Item, o Outcome) {
	it.state = stateIdle
	it.done <- o
	q.forget(it.flow)
}

// forget drops or parks a flow with nothing queued or in flight. While its band has a
// backlog, it is dropped when its counter is at or below the band's virtual time (a
// returning flow is lifted at least that far, so nothing is lost), else kept in the band's
// idle heap until the virtual time passes it, MaxItems idle flows a band at most: beyond,
// the one the least above the virtual time is dropped (it may return that much early).
// Without the bound a backlog that never empties, fed by one-off flows (a new API key per
// request), keeps the virtual time at the fresh flows' level and every one of them forever.
// When its band has no backlog, nothing contends: the virtual time moves up to its counter
// and it is dropped.
func (q *Queue) forget(f *flow) {
	if f.count > 0 || f.inflight > 0 {
		return
	}
	b := f.band
	if !b.contended() {
		b.vtime = max(b.vtime, f.counter)
	}
	switch {
	case f.counter <= b.vtime:
		if f.idleIdx >= 0 {
			heap.Remove(&b.idle, f.idleIdx)
		}
		delete(b.flows, f.id)
		q.dropBandIfEmpty(b)
	case f.idleIdx >= 0:
		heap.Fix(&b.idle, f.idleIdx)
	default:
		heap.Push(&b.idle, f)
		for len(b.idle) > q.cfg.MaxItems {
			delete(b.flows, heap.Pop(&b.idle).(*flow).id)
		}
	}
}

// pruneIdle forgets the idle flows the band's virtual time has passed.
func (q *Queue) pruneIdle(b *band) {
	for len(b.idle) > 0 && b.idle[0].counter <= b.vtime {
		f := heap.Pop(&b.idle).(*flow)
		delete(b.flows, f.id)
	}
	q.dropBandIfEmpty(b)
}

// bandsBelow is the bands below it's band, lowest priority last. It is popped or in flight,
// so its band is there (a band with a flow is never dropped).
func (q *Queue) bandsBelow(it *Item) []*band {
	b := it.flow.band
	for i := range q.bands {
		if q.bands[i] == b {
			return q.bands[i+1:]
		}
	}
	return nil
}

func (q *Queue) addBand(priority int) *band {
	b := newBand(priority)
	q.bandSeq++
	b.seq = q.bandSeq
	i := 0
	for i < len(q.bands) && q.bands[i].priority > priority {
		i++
	}
	q.bands = append(q.bands, nil)
	copy(q.bands[i+1:], q.bands[i:])
	q.bands[i] = b
	q.byPrio[priority] = b
	q.active.Store(true)
	return b
}

func (q *Queue) dropBandIfEmpty(b *band) {
	if len(b.flows) > 0 || b.count > 0 {
		return
	}
	for i := range q.bands {
		if q.bands[i] == b {
			q.bands = append(q.bands[:i], q.bands[i+1:]...)
			break
		}
	}
	delete(q.byPrio, b.priority)
	q.active.Store(len(q.bands) > 0)
}
