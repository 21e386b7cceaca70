package backend

import (
	"sync"
	"time"
)

// clockBase anchors monoNanos: durations from it use the monotonic clock, so a wall-clock
// step (NTP) neither empties nor freezes a queue's drain.
var clockBase = time.Now()

// monoNanos is t as nanoseconds since clockBase (monotonic when t carries a monotonic reading,
// as time.Now's does).
func monoNanos(t time.Time) int64 { return int64(t.Sub(clockBase)) }

// drain is what QueuedPrefill has credited the replica with: the prefill work it has likely
// done by since, at the rate in force at each event, that is still in PrefillTokens (the
// requests it belongs to have not answered). Events fold the time since the last one into the
// credit, so a request that answers or leaves does not forget what was done of the others.
type drain struct {
	mu     sync.Mutex
	since  int64   // monoNanos of the last event
	credit float64 // work done by since and not yet removed from PrefillTokens
}

// holdLocked folds the time up to now into the credit at rate and holds the credit to q
// tokens, what was queued before new work arrives: idle time the drain ran past the queue
// (its requests slower than the rate) is not credited against the new work. d.mu is held.
func (d *drain) holdLocked(now time.Time, rate float64, q int64) {
	d.foldLocked(now, rate)
	d.credit = min(d.credit, float64(q))
}

// startLocked begins a queue that was empty at now; d.mu is held.
func (d *drain) startLocked(now time.Time) { d.since, d.credit = monoNanos(now), 0 }

// foldLocked folds the time up to now into the credit at rate; d.mu is held.
func (d *drain) foldLocked(now time.Time, rate float64) {
	if t := monoNanos(now); t > d.since {
		d.credit += worked(t-d.since, rate)
		d.since = t
	}
}

// leaveQueue takes a request of work tokens off b's queue, folding the time up to now into
// the drain's credit first: done (it answered) its work was part of what was done, so it
// leaves the credit too; not done (it failed or was cancelled first) it takes none of the
// credit. The queue's counters change under the drain's lock, so that a Begin never holds
// the credit to a queue that still lists a request whose work has left the credit.
func (b *Backend) leaveQueue(work int64, done bool) {
	d := &b.drain
	d.mu.Lock()
	d.foldLocked(time.Now(), b.PrefillRate())
	if done {
		d.credit = max(d.credit-float64(work), 0)
	}
	b.counts.prefillTokens.Add(-work)
	b.counts.prefillReqs.Add(-1)
	d.mu.Unlock()
	b.loadChanged()
}

// queued is q tokens of queued work less the credit and what the time since the last event
// adds to it at rate, at least 0.
func (d *drain) queued(now time.Time, q int64, rate float64) int64 {
	if q <= 0 {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queuedLocked(now, q, rate)
}

// queuedLocked is queued with d.mu held.
func (d *drain) queuedLocked(now time.Time, q int64, rate float64) int64 {
	if q <= 0 {
		return 0
	}
	done := d.credit
	if dt := monoNanos(now) - d.since; dt > 0 {
		done += worked(dt, rate)
	}
	return remaining(q, done)
}

// worked is the prefill work done in dt nanoseconds at rate tokens/s.
func worked(dt int64, rate float64) float64 { return float64(dt) / float64(time.Second) * rate }

// remaining is q tokens of queued work less done, at least 0 (q when done ≤ 0).
func remaining(q int64, done float64) int64 {
	switch {
	case done <= 0:
		return q
	case done >= float64(q):
		return 0
	}
	return q - int64(done)
}

// QueuedPrefill is PrefillTokens plus PeerPrefillTokens (the peers' queued work, see
// SetPeerLoad) less what the replica has likely worked off since that queue started (its
// first request arrived at an empty queue) at its learned prefill rate (the fleet's until
// learned, see SetFleetPrefill; DefaultPrefillRate before either), at least 0: a 120k-token
// prompt 15 s into its 17 s prefill is no longer 120k tokens ahead of the next request. What
// was worked off stays credited when a request answers (what it needed is taken off the
// credit, the rest carries over) or leaves unanswered. What the rate overestimates comes back
// through the prefill model: a request's queue ahead (Begin) is this too, so a replica that
// drains slower than its rate is seen to answer later, and its learned rate falls. A replica
// that hangs is seen drained after q ÷ rate: the bounded-load cap, which counts requests,
// still holds it. One queue for both, own and peers': drained apart, each share would drain
// at the full rate (twice the replica's speed with both queued).
func (b *Backend) QueuedPrefill(now time.Time) int64 {
	return b.drain.queued(now, b.queuedRaw(), b.PrefillRate())
}

// queuedRaw is the prefill work queued on b before any drain: this proxy's and its peers'.
func (b *Backend) queuedRaw() int64 { return b.counts.prefillTokens.Load() + b.peers.prefill.Load() }

// PrefillRate is the prefill rate the cost model uses for b, in tokens per second: b's
// learned one, the fleet's until learned (SetFleetPrefill), else DefaultPrefillRate.
func (b *Backend) PrefillRate() float64 {
	if r, ok := b.LearnedPrefillRate(); ok {
		return r
	}
	return DefaultPrefillRate
}

// LearnedPrefillRate is the prefill rate learned for b, in tokens per second: b's own, else
// the fleet's (SetFleetPrefill); ok is false while neither has learned one (MinPrefillSamples
// streamed requests), when PrefillRate assumes DefaultPrefillRate.
func (b *Backend) LearnedPrefillRate() (tokensPerSecond float64, ok bool) {
	if r, ok := b.prefill.Rate(); ok {
		return r, true
	}
	if f := b.fleet.Load(); f != nil {
		return f.Rate()
	}
	return 0, false
}
