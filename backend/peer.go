package backend

import "time"

// PeerInFlight is the sum of the in-flight requests that the other prefixlb replicas this one
// is peered with (package peering) last reported on the backend: 0 without peering, or
// when no live peer reported any. Load counts it.
func (b *Backend) PeerInFlight() int64 { return b.peerInFlight.Load() }

// PeerPrefillTokens is the sum of the peers' queued prefill tokens on the backend (their
// PrefillTokens), as PeerInFlight.
func (b *Backend) PeerPrefillTokens() int64 { return b.peerPrefill.Load() }

// PeerQueuedPrefill is PeerPrefillTokens less what the replica has likely worked off since
// they were last reported, at its learned prefill rate, at least 0: QueuedPrefill's drain for
// the peers' share, from the report rather than from the peers' own queue events (which a
// report does not carry), so it drains no faster than theirs. A report that repeats the
// sum does not restart the drain.
func (b *Backend) PeerQueuedPrefill(now time.Time) int64 {
	q := b.peerPrefill.Load()
	if q <= 0 {
		return 0
	}
	return remaining(q, worked(monoNanos(now)-b.peerPrefillAt.Load(), b.rate()))
}

// SetPeerLoad stores the peers' summed in-flight requests and queued prefill tokens on the
// backend (negative values are stored as 0). Peering calls it whenever a peer reports or
// expires.
func (b *Backend) SetPeerLoad(inFlight, prefillTokens int64) {
	b.peerInFlight.Store(max(inFlight, 0))
	if p := max(prefillTokens, 0); b.peerPrefill.Swap(p) != p {
		// A keepalive repeating the same work does not restart its drain.
		b.peerPrefillAt.Store(monoNanos(time.Now()))
	}
}
