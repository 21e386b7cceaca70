// The policy side: a prefix policy whose Learn calls are queued for the peers, and the
// backends the peers' updates land on.

package peering

import (
	"sync"
	"sync/atomic"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// maxQueuedHashes bounds the chunk hashes waiting for the next flush (8 MiB): a flusher that
// cannot keep up (peers unreachable) drops updates rather than grow without bound; the drops
// are counted (prefixlb_peer_updates_dropped_total).
const maxQueuedHashes = 1 << 20

// Policy is the prefix policy of a peered replica: it routes exactly as the wrapped
// *router.Prefix (it is one, embedded) and, whenever the proxy Learns that a backend took a
// request, queues the request's chunk hashes for the peers. It is safe for concurrent use.
type Policy struct {
	*router.Prefix
	n *Node
}

// Learn is router.Prefix.Learn, and queues what was learned for the peers.
func (p *Policy) Learn(k *key.Key, b *backend.Backend, held int) router.Learned {
	l := p.Prefix.Learn(k, b, held)
	if l != 0 {
		p.n.q.push(b.ID, int64(l), k.Chunks, &p.n.m)
	}
	return l
}

// SetBackends is router.Prefix.SetBackends, and makes bs the backends peers' updates name.
func (p *Policy) SetBackends(all []*backend.Backend) {
	p.Prefix.SetBackends(all)
	byID := make(map[uint64]*backend.Backend, len(all))
	for _, b := range all {
		byID[b.ID] = b
	}
	p.n.backends.Store(&backendSet{list: append([]*backend.Backend(nil), all...), byID: byID})
	p.n.loads.apply(byID, p.n.now())
}

// backendSet is an immutable snapshot of the configured backends.
type backendSet struct {
	list []*backend.Backend
	byID map[uint64]*backend.Backend
}

// queued is one Learn waiting for the flusher: hashes[off:off+n] of the queue's arena.
type queued struct {
	id     uint64
	stamp  int64
	off, n int
}

// queue holds the Learns since the last flush. push copies the chunks into an arena that
// take swaps with the flusher's, so that a steady state allocates nothing.
type queue struct {
	mu     sync.Mutex
	items  []queued
	hashes []uint64
	size   atomic.Int64 // len(hashes), for a lock-free glance
}

func (q *queue) push(id uint64, stamp int64, chunks []uint64, m *metricSet) {
	if len(chunks) == 0 {
		return
	}
	q.mu.Lock()
	if len(q.hashes)+len(chunks) > maxQueuedHashes {
		q.mu.Unlock()
		m.dropped.Inc()
		return
	}
	q.items = append(q.items, queued{id: id, stamp: stamp, off: len(q.hashes), n: len(chunks)})
	q.hashes = append(q.hashes, chunks...)
	q.size.Store(int64(len(q.hashes)))
	q.mu.Unlock()
}

// take returns what was queued and leaves the queue holding items and hashes (emptied), the
// caller's buffers from the previous take.
func (q *queue) take(items []queued, hashes []uint64) ([]queued, []uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	outI, outH := q.items, q.hashes
	q.items, q.hashes = items[:0], hashes[:0]
	q.size.Store(0)
	return outI, outH
}
