package backend

import (
	"math"
	"sync"
)

// RecentSum is a decaying sum of weighted events with a clock of the caller's (a sequence
// number of decisions, not wall time): an event of weight w n ticks ago counts
// w × 2^(−n ÷ halfLife). The prefix policy keeps one per backend of the prefill work it routed
// there (Backend.Routed), so that a new prefix goes to the replica whose recent share of the
// work is the least, which follows the conversations a replica serves between their turns
// where its in-flight count does not. Safe for concurrent use; the zero value is ready.
type RecentSum struct {
	mu sync.Mutex
	v  float64 // the sum at tick at
	at uint64
}

// Value is the sum at tick now (a tick before the last Add reads as at that Add).
func (r *RecentSum) Value(now uint64, halfLife float64) float64 {
	r.mu.Lock()
	v, at := r.v, r.at
	r.mu.Unlock()
	return decay(v, at, now, halfLife)
}

// Add counts one event of weight w (≥ 0; a negative weight counts 0) at tick now.
func (r *RecentSum) Add(now uint64, halfLife, w float64) {
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

// Routed is the prefix policy's decaying sum of the prefill work (tokens) it routed to the
// backend (router.Prefix.RoutedWork).
func (b *Backend) Routed() *RecentSum { return &b.routed }
