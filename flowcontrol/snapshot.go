package flowcontrol

import (
	"slices"
	"strings"
	"time"
)

// Snapshot is the queue's state for an admin view: counts, bytes, ages and work, never a
// request's content.
type Snapshot struct {
	Queued int   `json:"queued"`
	Bytes  int64 `json:"bytes"`
	Closed bool  `json:"closed"`
	// Bands, highest priority first.
	Bands []BandSnapshot `json:"bands"`
}

// BandSnapshot is one priority band.
type BandSnapshot struct {
	Priority int   `json:"priority"`
	Queued   int   `json:"queued"`
	Bytes    int64 `json:"bytes"`
	// Credit is the work (token-equivalents) the band may take ahead of higher bands now.
	Credit float64 `json:"credit"`
	// VirtualTime is the band's virtual token counter floor.
	VirtualTime int64 `json:"virtual_time"`
	// Flows with queued, in-flight or remembered work, by flow ID.
	Flows []FlowSnapshot `json:"flows"`
}

// FlowSnapshot is one flow of a band.
type FlowSnapshot struct {
	// Flow is the caller's opaque flow ID (a hash, never a raw key).
	Flow     string `json:"flow"`
	Queued   int    `json:"queued"`
	Bytes    int64  `json:"bytes"`
	InFlight int    `json:"in_flight"`
	// HeadAge is how long the flow's head has waited since its Arrival; 0 when none queued.
	HeadAge time.Duration `json:"head_age_ns"`
	// ServedWork is the work dispatched for the flow while the queue remembered it, and
	// the work its requests that went straight through were served meanwhile (Charge)
	// (token-equivalents, predicted until settled).
	ServedWork int64 `json:"served_work"`
	// Counter is the flow's virtual token counter; the least backlogged one goes next.
	Counter int64 `json:"counter"`
}

// Snapshot copies the queue's state at now. O(flows).
func (q *Queue) Snapshot(now time.Time) Snapshot {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := Snapshot{Queued: q.count, Bytes: q.bytes, Closed: q.closed, Bands: make([]BandSnapshot, 0, len(q.bands))}
	for _, b := range q.bands {
		bs := BandSnapshot{
			Priority: b.priority, Queued: b.count, Bytes: b.bytes, VirtualTime: b.vtime,
			Flows: make([]FlowSnapshot, 0, len(b.flows)),
		}
		if b.count > 0 {
			bs.Credit = max(b.credit(q.share), 0)
		}
		for _, f := range b.flows {
			fs := FlowSnapshot{
				Flow: f.id, Queued: f.count, Bytes: f.bytes, InFlight: f.inflight,
				ServedWork: f.served, Counter: f.counter,
			}
			if f.head != nil {
				fs.HeadAge = max(now.Sub(f.head.Arrival), 0)
			}
			bs.Flows = append(bs.Flows, fs)
		}
		slices.SortFunc(bs.Flows, func(a, b FlowSnapshot) int { return strings.Compare(a.Flow, b.Flow) })
		s.Bands = append(s.Bands, bs)
	}
	return s
}
