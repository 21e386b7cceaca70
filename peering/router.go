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

// maxQueuedHashes bounds the chunk hashes waiting for the next flush (8 MiB), and
// maxQueuedItems the Learns (3 MiB; decisions without hashes, a Hold's or a prompt held
// whole, add none): a flusher that cannot keep up (starved of CPU) drops updates rather than
// grow without bound; the drops are counted (prefixlb_peer_updates_dropped_total).
const (
	maxQueuedHashes = 1 << 20
	maxQueuedItems  = 1 << 16
)

// Policy is the prefix policy of a peered replica: it routes exactly as the wrapped
// *router.Prefix (it is one, embedded) and, whenever the proxy Learns that a backend took a
// request, queues the request's chunk hashes for the peers; a request held to settle sends
// its decision at Hold and its hashes at Release (settle.go). It is safe for concurrent use.
type Policy struct {
	*router.Prefix
	n      *Node
	learns atomic.Uint64 // Learns with a held prefix, for fullChainEvery
}

// fullChainEvery: a Learn queues for the peers only the chunks the backend did not hold
// when the request was routed (the held prefix went out with an earlier request), and every
// fullChainEvery-th Learn of this replica the whole chain, so that a peer whose own traffic
// does not touch a hot prefix still refreshes it before its LRU ages it out. On agent
// sessions, each request its session's previous one plus a step, this sends the step instead
// of the ~100k-token context.
const fullChainEvery = 16

// Learn is router.Prefix.Learn, and queues what was learned for the peers: the chunks beyond
// held (see fullChainEvery), up to where this replica's Record cut a prompt longer than the
// backend's capacity.
func (p *Policy) Learn(k *key.Key, b *backend.Backend, held int) router.Learned {
	l := p.Prefix.Learn(k, b, held)
	work := p.Prefix.RoutedWork(k, held) // what this replica counted for the decision
	switch {
	case l != 0:
		p.queueLearned(k, b, held, l, work)
	case b != nil:
		// Recorded nothing, routed all the same (a prompt under one chunk; a backend the
		// index does not list): an empty group, so that the peers count the decision. Stamp 0
		// is no Learn's, and nothing withdraws it (Unlearn of 0 does nothing). A body that did
		// not parse is not learned at all (router.Decider.Ticket): this replica counts its
		// decision, its peers do not.
		p.n.q.push(b.ID, 0, work, nil, &p.n.m)
	}
	return l
}

// queueLearned queues the Learn l of k on b for the peers, with the decision's work.
func (p *Policy) queueLearned(k *key.Key, b *backend.Backend, held int, l router.Learned, work int64) {
	// What this replica recorded: a prompt over b's capacity was cut (index.Index.Fit).
	chunks := k.Chunks[:p.Prefix.Index().Fit(k.Chunks, b)]
	if held > 0 && p.learns.Add(1)%fullChainEvery != 0 {
		chunks = chunks[min(held, len(chunks)):]
	}
	// Pushed even when empty (the backend held the whole prompt): the peers count every
	// decision (router.Prefix.NotePeerRouted).
	p.n.q.push(b.ID, int64(l), work, chunks, &p.n.m)
}

func (p *Policy) Unlearn(k *key.Key, b *backend.Backend, l router.Learned) {
	p.Prefix.Unlearn(k, b, l)
	if k == nil || b == nil || l == 0 {
		return
	}
	if !p.n.q.cancel(b.ID, int64(l)) {
		p.n.q.pushForget(b.ID, int64(l), k.Chunks, &p.n.m)
	}
}

// SetBackends is router.Prefix.SetBackends, and makes bs the backends peers' updates name;
// their prefill observations are kept for the peers (backend.SharePrefillSamples), and a
// change of their load wakes the flusher (backend.NotifyLoad); the backends of the previous
// set that bs does not hold stop both (their leases may still end).
func (p *Policy) SetBackends(all []*backend.Backend) {
	p.Prefix.SetBackends(all)
	byID := make(map[uint64]*backend.Backend, len(all))
	for _, b := range all {
		byID[b.ID] = b
		b.SharePrefillSamples(true)
		b.NotifyLoad(p.n.loadKick)
	}
	if old := p.n.backends.Load(); old != nil {
		for _, b := range old.list {
			if byID[b.ID] != b { // removed, or replaced by a new one (a reload)
				b.SharePrefillSamples(false)
				b.NotifyLoad(nil)
			}
		}
	}
	p.n.backends.Store(&backendSet{list: append([]*backend.Backend(nil), all...), byID: byID})
	p.n.loads.apply(byID, p.n.now())
}

// The wrapped prefix policy's abilities are the peered policy's too (the proxy finds them by
// type assertion), and it settles besides (settle.go).
var (
	_ router.Fleet     = (*Policy)(nil)
	_ router.Learner   = (*Policy)(nil)
	_ router.Inspector = (*Policy)(nil)
)

// backendSet is an immutable snapshot of the configured backends.
type backendSet struct {
	list []*backend.Backend
	byID map[uint64]*backend.Backend
}

// queued is one Learn (or, forget set, one Unlearn of a Learn already sent) waiting for the
// flusher: hashes[off:off+n] of the queue's arena (n 0: a Learn of a prompt the backend held
// whole, or a Hold, sent as an empty group so that the peers count the decision,
// NotePeerRouted), and the decision's prefill work (router.Prefix.RoutedWork; 0 for a forget,
// and for the hashes of a Hold that Release kept, whose decision the Hold counted).
type queued struct {
	id     uint64
	stamp  int64
	work   int64
	off, n int
	class  class // how the decision goes out (settle.go)
	forget bool
}

// queue holds the Learns since the last flush. push copies the chunks into an arena that
// take swaps with the flusher's, so that a steady state allocates nothing.
type queue struct {
	mu     sync.Mutex
	items  []queued
	hashes []uint64
	size   atomic.Int64 // len(hashes), for a lock-free glance
	// kick (capacity 1; nil: none) is signalled when something is queued, to wake the
	// flusher (a load change signals the node's loadKick).
	kick chan struct{}
}

func (q *queue) push(id uint64, stamp, work int64, chunks []uint64, m *metricSet) {
	q.add(queued{id: id, stamp: stamp, work: work}, chunks, m)
}

// pushForget queues the withdrawal of the Learn stamped stamp on backend id, sent already.
func (q *queue) pushForget(id uint64, stamp int64, chunks []uint64, m *metricSet) {
	q.add(queued{id: id, stamp: stamp, forget: true}, chunks, m)
}

// cancel drops the chunks of the queued Learn stamped stamp on backend id, and reports whether
// it was still queued (then no peer ever hears of them). The decision stays, an empty group
// with its prefill work (0 for a Release's hashes: the Hold sent the decision), so that the
// peers count it in the backend's recent share as this replica did when it routed it
// (router.Prefix.NotePeerRouted). It scans what was queued since the last flush, a few items
// at a few hundred requests per second.
func (q *queue) cancel(id uint64, stamp int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := len(q.items) - 1; i >= 0; i-- {
		if it := &q.items[i]; it.id == id && it.stamp == stamp && !it.forget {
			it.n = 0
			return true
		}
	}
	return false
}

func (q *queue) add(it queued, chunks []uint64, m *metricSet) {
	if len(chunks) == 0 && it.forget {
		return
	}
	q.mu.Lock()
	if len(q.hashes)+len(chunks) > maxQueuedHashes || len(q.items) >= maxQueuedItems {
		q.mu.Unlock()
		m.dropped.Inc()
		return
	}
	it.off, it.n = len(q.hashes), len(chunks)
	q.items = append(q.items, it)
	q.hashes = append(q.hashes, chunks...)
	q.size.Store(int64(len(q.hashes)))
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
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
