// The prefix policy's own state per backend: what no other package reads or writes, kept
// here, keyed by backend ID as the index keys its slots, rather than on backend.Backend.

package router

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/prefixlb/prefixlb/backend"
)

// policySlot is the prefix policy's state for one backend.
type policySlot struct {
	// recent is the decaying sum of the prefill work (tokens, RoutedWork) this policy routed
	// to the backend, and with CountPeerRoutes its peers too, on the clock of Prefix.seq
	// (RecentHalfLife).
	recent recentSum
}

// slotTable maps backend IDs to their policySlot: an immutable map swapped whole, so that
// the request path reads it without locking. SetBackends keeps the slots of the backends
// still listed and drops the others; a backend picked before it was set (the pool is
// swapped before the policy's backends are) gets its slot on its first decision.
type slotTable struct {
	mu  sync.Mutex // serialises writers
	tab atomic.Pointer[map[uint64]*policySlot]
}

// peek is b's slot, nil while b has none (nothing was counted for it).
func (t *slotTable) peek(b *backend.Backend) *policySlot {
	if m := t.tab.Load(); m != nil {
		return (*m)[b.ID]
	}
	return nil
}

// of is b's slot, added if b has none.
func (t *slotTable) of(b *backend.Backend) *policySlot {
	if s := t.peek(b); s != nil {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	if s := old[b.ID]; s != nil {
		return s
	}
	next := make(map[uint64]*policySlot, len(old)+1)
	for id, s := range old {
		next[id] = s
	}
	s := new(policySlot)
	next[b.ID] = s
	t.tab.Store(&next)
	return s
}

// set makes all the backends with slots: those already held are kept, new ones start empty,
// the others are dropped.
func (t *slotTable) set(all []*backend.Backend) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	next := make(map[uint64]*policySlot, len(all))
	for _, b := range all {
		s := old[b.ID]
		if s == nil {
			s = new(policySlot)
		}
		next[b.ID] = s
	}
	t.tab.Store(&next)
}

// load is the current map (nil before any slot); t.mu is held.
func (t *slotTable) load() map[uint64]*policySlot {
	if m := t.tab.Load(); m != nil {
		return *m
	}
	return nil
}

// recentSum is a decaying sum of weighted events with a clock of the caller's (a sequence
// number of decisions, not wall time): an event of weight w n ticks ago counts
// w × 2^(−n ÷ halfLife). The prefix policy keeps one per backend of the prefill work it routed
// there (policySlot.recent), so that a new prefix goes to the replica whose recent share of
// the work is the least, which follows the conversations a replica serves between their turns
// where its in-flight count does not. Safe for concurrent use; the zero value is ready.
type recentSum struct {
	mu sync.Mutex
	v  float64 // the sum at tick at
	at uint64
}

// Value is the sum at tick now (a tick before the last Add reads as at that Add).
func (r *recentSum) Value(now uint64, halfLife float64) float64 {
	r.mu.Lock()
	v, at := r.v, r.at
	r.mu.Unlock()
	return decay(v, at, now, halfLife)
}

// Add counts one event of weight w (≥ 0; a negative weight counts 0) at tick now.
func (r *recentSum) Add(now uint64, halfLife, w float64) {
	r.mu.Lock()
	r.v = decay(r.v, r.at, now, halfLife) + max(w, 0)
	r.at = max(r.at, now)
	r.mu.Unlock()
}

func decay(v float64, at, now uint64, halfLife float64) float64 {
	if now <= at || v == 0 {
		return v
	}
	return v * math.Exp2(-float64(now-at)/halfLife)
}
