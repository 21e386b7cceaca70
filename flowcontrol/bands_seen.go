package flowcontrol

import (
	"sync/atomic"
	"time"
)

// Which priority bands a pool serves lately (Queue.NoteBand, Queue.TopBand): the highest
// priority seen among the requests the caller classified, remembered for Config.BandMemory
// after the last one. The caller reserves room for that band: while it is seen, a request of
// a lower band may wait for room a replica could give it now (proxy: ReservePrefill), so that
// the higher band's next request does not wait inside an engine behind the lower band's
// prefill.

// bandsSeen is the queue's memory of its highest band, lock-free: top is the priority, at
// the unix nanoseconds of its last request (0: none).
type bandsSeen struct {
	top atomic.Int64
	at  atomic.Int64
}

// NoteBand records a request of priority classified at now: it becomes the top band when it
// is higher than the one remembered or that one is older than BandMemory, and refreshes the
// top band's time when equal. Lock-free and allocation-free; concurrent notes may lose one
// refresh, which the next request of the band restores.
func (q *Queue) NoteBand(priority int, now time.Time) {
	t := now.UnixNano()
	s := &q.seen
	top, at := s.top.Load(), s.at.Load()
	switch p := int64(priority); {
	case at == 0 || p > top || t-at > int64(q.memory.Load()):
		s.top.Store(p)
		s.at.Store(t)
	case p == top && t > at:
		s.at.Store(t)
	}
}

// TopBand is the highest priority noted within BandMemory before now; ok is false when none
// was (nothing classified lately, or BandMemory < 0: the memory off).
func (q *Queue) TopBand(now time.Time) (priority int, ok bool) {
	m := q.memory.Load()
	at := q.seen.at.Load()
	if m < 0 || at == 0 || now.UnixNano()-at > m {
		return 0, false
	}
	return int(q.seen.top.Load()), true
}
