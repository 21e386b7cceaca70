package backend

// PeerInFlight is the sum of the in-flight requests that the other prefixlb replicas this one
// is peered with (package peering) last reported on the backend: 0 without peering, or
// when no live peer reported any. Load counts it.
func (b *Backend) PeerInFlight() int64 { return b.peerInFlight.Load() }

// PeerPrefillTokens is the sum of the peers' queued prefill tokens on the backend (their
// PrefillTokens), as PeerInFlight.
func (b *Backend) PeerPrefillTokens() int64 { return b.peerPrefill.Load() }

// SetPeerLoad stores the peers' summed in-flight requests and queued prefill tokens on the
// backend (negative values are stored as 0). Peering calls it whenever a peer reports or
// expires.
func (b *Backend) SetPeerLoad(inFlight, prefillTokens int64) {
	b.peerInFlight.Store(max(inFlight, 0))
	b.peerPrefill.Store(max(prefillTokens, 0))
}
