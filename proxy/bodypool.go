package proxy

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// The body budget (limits.max_buffered_body_bytes) bounds the memory that request bodies
// take, not only what they hold: the heap they use is their live buffers plus those dropped
// and not yet collected.
//
//   - used counts every live buffer byte: a buffer's capacity is reserved before it is
//     allocated, and during a growth both the old buffer and the new one are reserved,
//     the old given back after the copy.
//   - debt counts the large buffers dropped (given to the garbage collector) that no
//     collection has reclaimed yet. A reservation must fit beside used and debt together.
//     Without it a burst of large bodies takes fresh heap while the last round's buffers
//     wait for the collector: up to twice the live heap at GOGC=100, and, even with
//     collections forced as buffers are dropped, whatever arrives while one runs.
//   - Once debt reaches gcAfter, a background goroutine (collect) runs a collection (rate
//     limited: gcEvery, gcSpacing), which pays back the debt that was there when it began. A growth
//     that only the debt keeps out waits for that (at most gcWaitMax) instead of being
//     refused; one that the live bytes keep out is refused at once.
//   - After a burst (trimDelay without a collection due) the goroutine returns the heap to
//     the OS (debug.FreeOSMemory, at most once per trimEvery) and ends.
//
// Pooled buffers of up to debtFrom bytes belong to small bodies: the pool keeps few of
// them idle, and those it drops are the runtime's ordinary garbage, not debt.
const (
	// gcAfter is an eighth of the budget, within [gcAfterMin, gcAfterMax].
	gcAfterMin = 4 << 20
	gcAfterMax = 64 << 20
	// Collections start gcEvery apart at least, and gcSpacing times as long as the last one
	// took: collecting takes a fifth of the time at most, however large the rest of the heap
	// (the prefix index) that each collection marks.
	gcEvery   = 10 * time.Millisecond
	gcSpacing = 5
	// gcWaitMax bounds the wait of a growth for a collection to pay back the debt.
	gcWaitMax = time.Second
	trimDelay = time.Second
	trimEvery = 10 * time.Second
	// debtFrom is the smallest dropped buffer counted as debt.
	debtFrom = 256 << 10
)

// bodyClasses are the sizes of the pooled body buffers, and bodyClassMax how many of each
// the pool keeps: 4 MiB in each of the two small classes, 8 MiB of 256 KiB buffers and 32
// MiB of 1 MiB ones, 48 MiB in all (under 5% of DefaultMaxBufferedBodyBytes). A growing
// buffer steps from class to class (four times larger). Larger bodies get a buffer of their
// own that is dropped after the request.
//
// The 1 MiB class is a coding agent's: its requests are 0.5–1.2 MB of JSON (a ~120k-token
// conversation). Keeping 32 of them idle lets that many agents' requests in flight reuse
// buffers instead of each taking a fresh, zeroed 1 MiB from the heap and dropping it as debt
// that a forced collection must pay back; with fewer kept, the zeroing and the forced
// collections show in prefixlb's CPU per request (`prefixlb bench overhead --sizes 1m`).
var (
	bodyClasses  = [...]int{16 << 10, 64 << 10, 256 << 10, 1 << 20}
	bodyClassMax = [...]int{256, 64, 32, 32}
)

// maxClass is the largest pooled buffer.
const maxClass = 1 << 20

// bodyBudget is the shared allowance of buffered request-body bytes, the pool of body
// buffers, and the collector of dropped large ones. Every method is safe for concurrent use.
type bodyBudget struct {
	limit    int64
	used     atomic.Int64 // reserved: live buffer bytes
	debt     atomic.Int64 // dropped buffer bytes no collection has reclaimed yet
	rejected *metrics.Counter

	classes [len(bodyClasses)]bufClass

	gcAfter    int64
	kick       chan struct{}                 // a collection is due; capacity 1
	collecting atomic.Bool                   // the collect goroutine runs
	cycle      atomic.Pointer[chan struct{}] // closed when the next collection has paid back its debt
	lastTrim   atomic.Int64                  // unix nanoseconds of the last trim
	gc         func()                        // collects the heap: runtime.GC
	trim       func()                        // collects and returns freed memory to the OS: debug.FreeOSMemory
}

// bufClass is a bounded free list of buffers of one size.
type bufClass struct {
	mu   sync.Mutex
	free [][]byte
}

// bodyLease is what one request holds of the budget: reserved bytes and its buffer. n is
// the buffer's capacity (0 for a body of at most bodyPrefetch bytes, which is not
// reserved), and during a growth that of the old buffer too.
type bodyLease struct {
	n   int64
	buf []byte
}

func newBodyBudget(limit int64, set *metrics.Set) *bodyBudget {
	b := &bodyBudget{
		limit:   limit,
		gcAfter: min(max(limit/8, gcAfterMin), gcAfterMax),
		kick:    make(chan struct{}, 1),
		gc:      runtime.GC,
		trim:    debug.FreeOSMemory,
	}
	next := make(chan struct{})
	b.cycle.Store(&next)
	set.NewGauge(`prefixlb_buffered_request_body_bytes`, func() float64 { return float64(b.used.Load()) })
	b.rejected = set.NewCounter(`prefixlb_request_body_budget_exhausted_total`)
	return b
}

// reserve adds n bytes to bl's reservation if they fit the budget beside the live bytes and
// the debt; false leaves both as they were.
func (b *bodyBudget) reserve(bl *bodyLease, n int64) bool {
	for {
		u := b.used.Load()
		if u+b.debt.Load()+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			bl.n += n
			return true
		}
	}
}

// reserveWait is reserve, except that when only the debt keeps n out it has a collection
// run and waits for it to pay the debt back, for at most gcWaitMax in all. It returns false
// at once when the live bytes alone leave no room for n.
func (b *bodyBudget) reserveWait(bl *bodyLease, n int64) bool {
	if b.reserve(bl, n) {
		return true
	}
	var deadline *time.Timer
	for b.used.Load()+n <= b.limit {
		done := *b.cycle.Load()
		b.due()
		if deadline == nil {
			deadline = time.NewTimer(gcWaitMax)
			defer deadline.Stop()
		}
		select {
		case <-done:
		case <-deadline.C:
			return b.reserve(bl, n)
		}
		if b.reserve(bl, n) {
			return true
		}
	}
	return false
}

// unreserve gives n bytes of bl's reservation back.
func (b *bodyBudget) unreserve(bl *bodyLease, n int64) {
	if n != 0 {
		b.used.Add(-n)
		bl.n -= n
	}
}

// allocSize is the capacity of the buffer get(n) returns: the smallest class that holds n
// bytes, or n past the classes.
func allocSize(n int) int {
	for _, size := range bodyClasses {
		if n <= size {
			return size
		}
	}
	return n
}

// get returns a buffer of length n and capacity allocSize(n), pooled when n fits a class.
func (b *bodyBudget) get(n int) []byte {
	for i, size := range bodyClasses {
		if n <= size {
			c := &b.classes[i]
			c.mu.Lock()
			var buf []byte
			if k := len(c.free); k > 0 {
				buf = c.free[k-1]
				c.free[k-1] = nil
				c.free = c.free[:k-1]
			}
			c.mu.Unlock()
			if buf == nil {
				buf = make([]byte, size)
			}
			return buf[:n]
		}
	}
	return make([]byte, n)
}

// put gives a buffer back: to its class's free list when it has room, else to the garbage
// collector, a large one as debt.
func (b *bodyBudget) put(buf []byte) {
	size := cap(buf)
	for i, cs := range bodyClasses {
		if size == cs {
			c := &b.classes[i]
			c.mu.Lock()
			kept := len(c.free) < bodyClassMax[i]
			if kept {
				c.free = append(c.free, buf[:size])
			}
			c.mu.Unlock()
			if kept {
				return
			}
			break
		}
	}
	if size >= debtFrom && b.debt.Add(int64(size)) >= b.gcAfter {
		b.due()
	}
}

// due asks the collect goroutine for a collection, starting it if it is not running.
func (b *bodyBudget) due() {
	select {
	case b.kick <- struct{}{}:
	default: // one is due already
	}
	if b.collecting.CompareAndSwap(false, true) {
		go b.collect()
	}
}

// collect runs a collection per kick (rate limited: gcEvery, gcSpacing), so that dropped
// buffers are reused before the heap grows; once no kick came for trimDelay it returns the heap to the
// OS (no sooner than trimEvery after the last time) and ends.
func (b *bodyBudget) collect() {
	idle := time.NewTimer(trimDelay)
	defer idle.Stop()
	var next time.Time // the earliest the next collection may start
	for {
		select {
		case <-b.kick:
			if wait := time.Until(next); wait > 0 {
				time.Sleep(wait) // rate limit: what is dropped meanwhile waits for this collection
			}
			start := time.Now()
			b.payBack(b.gc)
			next = start.Add(max(gcEvery, gcSpacing*time.Since(start)))
			idle.Reset(trimDelay)
		case <-idle.C:
			if wait := time.Until(time.Unix(0, b.lastTrim.Load()).Add(trimEvery)); wait > 0 {
				idle.Reset(wait)
				continue
			}
			b.payBack(b.trim)
			b.lastTrim.Store(time.Now().UnixNano())
			b.collecting.Store(false)
			// A kick that came after the timer fired and found this goroutine still running
			// started none: take it on, unless a new goroutine already did.
			if len(b.kick) == 0 || !b.collecting.CompareAndSwap(false, true) {
				return
			}
			idle.Reset(trimDelay)
		}
	}
}

// payBack runs collection (gc or trim), pays back the debt there was when it began (what is
// dropped meanwhile may have been marked live, and waits for the next) and wakes the
// reservations waiting for it.
func (b *bodyBudget) payBack(collection func()) {
	next := make(chan struct{})
	done := b.cycle.Swap(&next)
	d := b.debt.Load()
	collection()
	b.debt.Add(-d)
	close(*done)
}

// release gives back everything bl holds; bl is empty afterwards.
func (b *bodyBudget) release(bl *bodyLease) {
	b.unreserve(bl, bl.n)
	if bl.buf != nil {
		b.put(bl.buf)
	}
	*bl = bodyLease{}
}

// grow replaces bl's buffer, whose first n bytes are body, by one of length want holding
// them: it reserves the new buffer's capacity (allocSize(want)) before allocating it, while
// the old one is still reserved (reserveWait), and gives the old one back after the copy.
// False, leaving bl as it was, when the budget has no room.
func (b *bodyBudget) grow(bl *bodyLease, n, want int) bool {
	if !b.reserveWait(bl, int64(allocSize(want))) {
		return false
	}
	nb := b.get(want)
	old := bl.buf
	copy(nb, old[:n])
	bl.buf = nb
	if old != nil {
		b.unreserve(bl, int64(cap(old)))
		b.put(old)
	}
	return true
}

// nextLen is the length a full body buffer of length cur (its capacity) grows to on its way
// to at most total bytes (the Content-Length, or max_request_body_bytes for a chunked
// body): the next class (four times cur) within the classes; past them, the largest of
// total/2, total/4, ... (rounded up) within twice cur, so that the steps end at half of
// total and the last growth holds 1.5 times total at most (the old half and the new
// whole). A step of less than a quarter of cur is skipped.
func nextLen(cur, total int) int {
	switch {
	case cur < maxClass:
		return min(4*cur, total)
	case 2*cur >= total:
		return total
	}
	d := 2
	for ceilDiv(total, d) > 2*cur {
		d *= 2
	}
	next := ceilDiv(total, d)
	if 4*next < 5*cur {
		next = ceilDiv(total, d/2)
	}
	return next
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
