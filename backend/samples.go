package backend

import (
	"sync"
	"sync/atomic"
	"time"
)

// PrefillSample is one observation of a replica's prefill model (Lease.FirstByte): the
// prefill work that was ahead of and in a streamed request, in tokens' worth, and its time
// to first token.
type PrefillSample struct {
	Work int64
	TTFT time.Duration
}

// maxPendingSamples bounds the samples kept for TakePrefillSamples between two takes (a
// peering flusher takes them every millisecond while requests are in flight); beyond it the
// newest are dropped.
const maxPendingSamples = 256

// sampleLog keeps this proxy's own prefill observations for its peers while sharing is on.
type sampleLog struct {
	on      atomic.Bool
	pending atomic.Bool // buf is non-empty: a take without it locks nothing
	mu      sync.Mutex
	buf     []PrefillSample
}

// SharePrefillSamples turns on (or off) keeping this proxy's own observations of b's prefill
// model for TakePrefillSamples: peering sends them to the other prefixlb replicas, so that
// each learns a replica's rate from every request the fleet sent there, not from its own
// share of them (with 3 replicas, a third as many).
func (b *Backend) SharePrefillSamples(on bool) { b.samples.on.Store(on) }

// TakePrefillSamples appends the observations kept since the last take to dst and returns it.
func (b *Backend) TakePrefillSamples(dst []PrefillSample) []PrefillSample {
	if !b.samples.pending.Load() {
		return dst
	}
	b.samples.mu.Lock()
	dst = append(dst, b.samples.buf...)
	b.samples.buf = b.samples.buf[:0]
	b.samples.pending.Store(false)
	b.samples.mu.Unlock()
	return dst
}

// keep records s for TakePrefillSamples when sharing is on.
func (l *sampleLog) keep(s PrefillSample) {
	if !l.on.Load() || s.TTFT <= 0 {
		return
	}
	l.mu.Lock()
	if len(l.buf) < maxPendingSamples {
		l.buf = append(l.buf, s)
		l.pending.Store(true)
	}
	l.mu.Unlock()
}
