// What the peers report: the other prefixlb replicas' load on the replica.

package backend

import (
	"sync/atomic"
	"time"
)

// PeerLoad is what the other prefixlb replicas this one is peered with last reported of
// their own requests on the replica, summed over the live peers: 0 without peering. Only
// package peering writes it (SetPeerLoad; writers_test.go). Backend.PeerLoad reads each
// field once.
type PeerLoad struct {
	// InFlight is the peers' in-flight requests there (their Counts.InFlight).
	InFlight int64
	// PrefillTokens is their queued prefill work there (their Counts.PrefillTokens), which
	// joins this proxy's in one queue (QueuedPrefill).
	PrefillTokens int64
}

// peerState is PeerLoad as atomics; prefill changes under the drain's lock (SetPeerLoad).
type peerState struct {
	inFlight atomic.Int64
	prefill  atomic.Int64
}

// PeerLoad reads the peers' load, each field once.
func (b *Backend) PeerLoad() PeerLoad {
	return PeerLoad{InFlight: b.peers.inFlight.Load(), PrefillTokens: b.peers.prefill.Load()}
}

// PeerInFlight is PeerLoad().InFlight: the sum of the in-flight requests that the other
// prefixlb replicas this one is peered with (package peering) last reported on the
// backend: 0 without peering, or when no live peer reported any. Load counts it.
func (b *Backend) PeerInFlight() int64 { return b.peers.inFlight.Load() }

// PeerPrefillTokens is the sum of the peers' queued prefill tokens on the backend (their
// PrefillTokens), as PeerInFlight.
func (b *Backend) PeerPrefillTokens() int64 { return b.peers.prefill.Load() }

// SetPeerLoad stores the peers' summed in-flight requests and queued prefill tokens on the
// backend (negative values are stored as 0). Peering calls it whenever a peer reports or
// expires. The peers' prefill work joins this proxy's in one queue (QueuedPrefill): the
// replica works off both at one rate, so a sum that grows from nothing, with none of this
// proxy's queued either, starts the queue's drain, and a sum that falls (the peers' requests
// answered) takes what left off the credit, as this proxy's own answered requests do. A
// report that repeats the sum changes nothing.
func (b *Backend) SetPeerLoad(inFlight, prefillTokens int64) {
	if b.peers.inFlight.Swap(max(inFlight, 0)) > inFlight {
		b.roomChanged() // a peer's request there ended: room, maybe
	}
	p := max(prefillTokens, 0)
	now := time.Now()
	d := &b.drain
	// Under the drain's lock, as Lease.Begin decides the queue was empty, so that one of
	// them sees the other's work and the drain is started once.
	d.mu.Lock()
	defer d.mu.Unlock()
	old := b.peers.prefill.Swap(p)
	switch {
	case p == old:
		return
	case old == 0 && b.counts.prefillReqs.Load() == 0:
		d.startLocked(now)
		return
	}
	d.holdLocked(now, b.PrefillRate(), b.counts.prefillTokens.Load()+old) // the report's new work counts in full
	if p < old {
		d.credit = max(d.credit-float64(old-p), 0)
	}
	// A sum hides what answered when as much arrived in the same report: what was worked
	// off cannot exceed what is queued, so the credit is held to it.
	d.credit = min(d.credit, float64(b.queuedRaw()))
}

// NotifyLoad makes every change of this proxy's own load on b (InFlight and PrefillTokens:
// a Lease's Begin, its first byte, its Release) signal c without blocking (a send on a
// full channel is dropped), so that peering's flusher sends a load change when it happens
// instead of polling for it; nil stops it. One channel a backend: the last call wins.
func (b *Backend) NotifyLoad(c chan<- struct{}) {
	if c == nil {
		b.loadNotify.Store(nil)
		return
	}
	b.loadNotify.Store(&c)
}

// loadChanged signals NotifyLoad's channel, if any.
func (b *Backend) loadChanged() {
	if c := b.loadNotify.Load(); c != nil {
		select {
		case *c <- struct{}{}:
		default:
		}
	}
}

// NotifyRoom makes every event that may give the replica room for one more request signal
// c without blocking (a send on a full channel is dropped): one of this proxy's requests
// there ends (Lease.Release), the peers' in-flight count there falls (SetPeerLoad), a scrape
// changes what the replica reported (SetScrapedRequests). The proxy's flow-control
// dispatcher waits on it; nil stops it. One channel a backend: the last call wins. It is
// apart from NotifyLoad (peering's flusher), which only this proxy's own load wakes.
func (b *Backend) NotifyRoom(c chan<- struct{}) {
	if c == nil {
		b.roomNotify.Store(nil)
		return
	}
	b.roomNotify.Store(&c)
}

// roomChanged signals NotifyRoom's channel, if any.
func (b *Backend) roomChanged() {
	if c := b.roomNotify.Load(); c != nil {
		select {
		case *c <- struct{}{}:
		default:
		}
	}
}
