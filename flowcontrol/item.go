package flowcontrol

import (
	"errors"
	"time"
)

// Cost is a request's GPU work in tokens: the prefill tokens its replica must compute (the
// prompt less the prefix found in the replica's KV cache) and the tokens it generates.
type Cost struct {
	UncachedPrefillTokens int
	OutputTokens          int
}

// Outcome is how an item left the queue; each pushed item gets exactly one, and one more
// after each Return.
type Outcome uint8

const (
	// Dispatched: placed on a replica (the caller called Dispatched).
	Dispatched Outcome = iota + 1
	// Expired: still queued at its deadline.
	Expired
	// Cancelled: removed because its client left.
	Cancelled
	// Shed: sheddable (priority < 0) and queued when the pool became saturated.
	Shed
	// Shutdown: still queued when the queue was drained.
	Shutdown
	// Displaced: the queue was full and a request of a flow with fewer queued items, or of
	// a higher priority, took its place (it was its flow's newest).
	Displaced
)

// String is the outcome's metric label.
func (o Outcome) String() string {
	switch o {
	case Dispatched:
		return "dispatched"
	case Expired:
		return "expired"
	case Cancelled:
		return "cancelled"
	case Shed:
		return "shed"
	case Shutdown:
		return "shutdown"
	case Displaced:
		return "displaced"
	}
	return "unknown"
}

// Refusals of Push; Reason gives each one's metric label.
var (
	ErrFull      = errors.New("flowcontrol: queue full (max queued requests)")
	ErrBytesFull = errors.New("flowcontrol: queue full (max queued body bytes)")
	ErrShed      = errors.New("flowcontrol: sheddable request refused: pool saturated")
	ErrClosed    = errors.New("flowcontrol: queue closed (shutting down)")
	ErrInUse     = errors.New("flowcontrol: item already queued or awaiting its outcome")
)

// Reason is the metric label of a Push refusal: queue_full, queue_bytes_full, sheddable,
// shutdown, or "" for nil and errors this package does not return.
func Reason(err error) string {
	switch err {
	case ErrFull:
		return "queue_full"
	case ErrBytesFull:
		return "queue_bytes_full"
	case ErrShed:
		return "sheddable"
	case ErrClosed:
		return "shutdown"
	}
	return ""
}

// Sheddable reports whether a request of this priority is refused at once: it is sheddable
// (priority < 0) and the caller judged every replica of the pool saturated.
func Sheddable(priority int, saturated bool) bool { return priority < 0 && saturated }

type itemState uint8

const (
	stateIdle     itemState = iota // new, or its outcome was delivered and it may be pushed again
	stateQueued                    // in the queue
	statePopped                    // returned by Next; awaiting Dispatched or Requeue
	stateInFlight                  // dispatched; awaiting Settle
)

// Item is one request waiting in a Queue. The caller fills the exported fields before Push
// and reads its outcome from Done. An item may be pushed again once its outcome was
// received and, if dispatched, it was settled.
type Item struct {
	// Priority is the item's band: higher is served first; below 0 is sheddable.
	Priority int
	// Flow is the fairness key within the band (a hashed API key, a trusted fairness
	// header): opaque to the queue, which never logs it.
	Flow string
	// Cost is the predicted GPU work, charged to the flow when the item is dispatched.
	Cost Cost
	// Bytes is the request body's size, counted against Config.MaxBytes.
	Bytes int64
	// Arrival is when the request arrived (for the snapshot's head age).
	Arrival time.Time
	// Deadline is when the item expires if still queued; zero means never.
	Deadline time.Time
	// Value is the caller's request; the queue never reads it.
	Value any

	done    chan Outcome
	state   itemState
	work    int64 // predicted work, token-equivalents, clamped to [1, MaxRequestWork]
	charged int64 // work charged to the flow's served work while popped or in flight
	ticket  int64 // what the flow's counter was charged: charged (vtc) or 1 (round-robin)
	seq     uint64
	flow    *flow
	prev    *Item // flow FIFO links
	next    *Item
	dlIndex int  // index in the deadline heap; -1 when not in it
	credit  bool // popped on its band's guaranteed share (undone by Requeue)
	// creditTaken is the band credit its dispatch spent (undone by Requeue): its work when
	// popped on credit, else as much of it as the band's credit held.
	creditTaken int64
	newest      bool // popped from its flow's tail (adaptive LIFO): put back there
	yields      bool // popped with its flow backlogged while a lighter flow was served (Yields)
	// bandSeq is the queue's band count when it was popped: the lower bands that counted
	// its work above them (band.seq ≤ bandSeq), which its Requeue or Return takes back.
	bandSeq   uint64
	fairEpoch uint32 // Queue.fairEpoch when it was charged
	placed    uint64 // Queue.placed at its Dispatched: the bands its Return takes its work from
}

// Credited reports whether the item, popped by Next, was popped on its band's guaranteed
// share (Config.MinBandShare) while a higher band was backlogged. The caller should start it
// as it would a request of the top band: a rule that holds a lower band's request for the
// higher band (proxy: ReservePrefill) would take back the share the band is guaranteed.
func (it *Item) Credited() bool { return it.credit }

// Yields reports whether the item, popped by Next, should leave room as a lower band's
// request does: its flow had more items queued behind it (or popped before it and not yet
// placed) while another flow of its band was served, within Config.BandMemory, with nothing
// of its own queued behind it but another flow backlogged (a flow under its fair share). The
// caller starts it only where the lighter flow's next request would not wait inside an
// engine behind its prefill (proxy: ReservePrefill), so that fair share holds in time to
// first token as well as in work.
func (it *Item) Yields() bool { return it.yields }

// Done delivers the item's one outcome. Valid after a successful Push.
func (it *Item) Done() <-chan Outcome { return it.done }

// Work is the predicted work charged for the item, in token-equivalents (see Config).
// Valid after a successful Push.
func (it *Item) Work() int64 { return it.work }
