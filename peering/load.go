// The peers' loads: what each live peer last reported in flight per backend, summed into
// each local backend.Backend (SetPeerLoad) for the cost model and the bounded-load cap.

package peering

import (
	"sync"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// loadTable keeps each peer's last report. It is safe for concurrent use.
type loadTable struct {
	ttl   time.Duration
	mu    sync.Mutex
	peers map[string]*peerReport
}

// peerReport is one peer's last load report, each backend's with its own time: a report
// may take several packets, so each is merged by backend, and a backend the peer no longer
// reports (removed there, its one idle record lost) expires by itself rather than count as
// long as the peer reports the others. A peer none of whose backends is fresh is dropped.
type peerReport struct {
	loads map[uint64]timedLoad
}

// timedLoad is one backend's load in a peer's report, and when it came.
type timedLoad struct {
	peerLoad
	at time.Time
}

func newLoadTable(ttl time.Duration) *loadTable {
	return &loadTable{ttl: ttl, peers: map[string]*peerReport{}}
}

// report stores sender's loads at now and updates the sums of the backends it named.
func (t *loadTable) report(sender string, ls []peerLoad, now time.Time, byID map[uint64]*backend.Backend) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.peers[sender]
	if r == nil {
		r = &peerReport{loads: map[uint64]timedLoad{}}
		t.peers[sender] = r
	}
	for _, l := range ls {
		r.loads[l.id] = timedLoad{l, now}
	}
	for _, l := range ls {
		if b := byID[l.id]; b != nil {
			t.sumLocked(b, now)
		}
	}
}

// forget drops a peer's report (it died or left) and reports whether it had one.
func (t *loadTable) forget(peer string, now time.Time, byID map[uint64]*backend.Backend) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.peers[peer] == nil {
		return false
	}
	delete(t.peers, peer)
	t.applyLocked(byID, now)
	return true
}

// apply recomputes every backend's sum: reports older than the TTL are dropped first.
func (t *loadTable) apply(byID map[uint64]*backend.Backend, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.applyLocked(byID, now)
}

func (t *loadTable) applyLocked(byID map[uint64]*backend.Backend, now time.Time) {
	for name, r := range t.peers {
		for id, l := range r.loads {
			if now.Sub(l.at) > t.ttl {
				delete(r.loads, id)
			}
		}
		if len(r.loads) == 0 {
			delete(t.peers, name)
		}
	}
	for _, b := range byID {
		t.sumLocked(b, now)
	}
}

// sumLocked sets b's peer load to the sum over fresh reports.
func (t *loadTable) sumLocked(b *backend.Backend, now time.Time) {
	var inFlight, prefill int64
	for _, r := range t.peers {
		if l, ok := r.loads[b.ID]; ok && now.Sub(l.at) <= t.ttl {
			inFlight += l.inFlight
			prefill += l.prefill
		}
	}
	b.SetPeerLoad(inFlight, prefill)
}
