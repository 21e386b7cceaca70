package flowcontrol

import (
	"sync/atomic"
	"time"
)

// Which priority bands a pool serves lately (Queue.NoteBand, Queue.TopBand): the highest
// priority seen among the requests the caller classified, and whether a lower one was seen
// too, each remembered for Config.BandMemory after its last request. The caller reserves
// room for the highest band while both are seen: a request of a lower band may wait for room
// a replica could give it now (proxy: ReservePrefill), so that the higher band's next
// request does not wait inside an engine behind the lower band's prefill. A pool that serves
// one band reports none, so its caller need not classify requests for the rule.

// bandsSeen is the queue's memory of its bands, lock-free: top is the highest priority, at
// the unix nanoseconds of its last request, and below the unix nanoseconds of the last
// request of a lower one (0: none).
type bandsSeen struct {
	top   atomic.Int64
	at    atomic.Int64
	below atomic.Int64
}

// NoteBand records a request of priority classified at now: it becomes the top band when it
// is higher than the one remembered (which then counts as a lower band seen at its last
// request) or that one is older than BandMemory (forgetting any lower band too); it
// refreshes the top band's time when equal, and the lower bands' when lower. Lock-free and
// allocation-free; concurrent notes may lose one refresh, which the next request of the band
// restores.
func (q *Queue) NoteBand(priority int, now time.Time) {
	t := now.UnixNano()
	s := &q.seen
	top, at := s.top.Load(), s.at.Load()
	switch p := int64(priority); {
	case at == 0 || t-at > q.memory.Load():
		s.top.Store(p)
		s.at.Store(t)
		s.below.Store(0)
	case p > top:
		s.below.Store(max(s.below.Load(), at))
		s.top.Store(p)
		s.at.Store(t)
	case p == top:
		if t > at {
			s.at.Store(t)
		}
	default:
		if t > s.below.Load() {
			s.below.Store(t)
		}
	}
}

// BandMemory is Config.BandMemory as the queue applies it (negative: the memory off);
// lock-free.
func (q *Queue) BandMemory() time.Duration { return time.Duration(q.memory.Load()) }

// TopBand is the highest priority noted within BandMemory before now; ok is false unless a
// lower priority was noted within BandMemory too (one band, nothing classified lately, or
// BandMemory < 0: the memory off).
func (q *Queue) TopBand(now time.Time) (priority int, ok bool) {
	m := q.memory.Load()
	t := now.UnixNano()
	at, below := q.seen.at.Load(), q.seen.below.Load()
	if m < 0 || at == 0 || below == 0 || t-at > m || t-below > m {
		return 0, false
	}
	return int(q.seen.top.Load()), true
}

// QueuedAtOrAbove reports whether a request of priority or a higher one is queued. A request
// that finds only lower bands queued has nothing to wait behind: the caller may send it on at
// once where its pool has room (proxy: a batch request held by the reserve rule does not make
// the chat band queue behind it). O(bands).
func (q *Queue) QueuedAtOrAbove(priority int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, b := range q.bands { // highest first
		if b.priority < priority {
			return false
		}
		if b.count > 0 {
			return true
		}
	}
	return false
}
