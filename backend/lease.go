// The Lease: this proxy's count of one request on one backend (Counts), and what its
// first byte teaches the prefill model.

package backend

import (
	"sync/atomic"
	"time"
)

// Lease accounts one request on one backend. Begin increments the backend's counters;
// FirstByte and Release decrement them, each at most once, whatever the order or the number
// of calls (EOF, error and cancel may all try). The zero Lease is unused; it must not be
// copied after Begin.
type Lease struct {
	b       *Backend
	prefill int64
	ahead   int64 // prefill work queued on b before this request (this proxy's and its peers', QueuedPrefill)
	decode  int64 // DecodeWork of b's decoding sequences at Begin
	context int64 // the prompt's tokens: its KV cache while it decodes (Decoding)
	began   time.Time
	timed   bool          // the first byte is the first token: observe the prefill model
	state   atomic.Uint32 // bit 0: first byte accounted; bit 1: released; bit 2: counted decoding
}

// Lease states.
const (
	leaseAnswered = 1 << iota // the first byte was accounted
	leaseReleased
	leaseDecoding // counted in Decoding until Release
)

// Begin dispatches one request to b whose prefill is work prompt tokens (those the policy
// predicts b does not hold) of a prompt of prompt tokens. streamed says that the response's
// first byte comes with its first token (a streamed completion), so that its time teaches
// b's prefill model and it counts as decoding (Decoding) from then on; a non-streamed
// response's first byte comes at its end.
func (l *Lease) Begin(b *Backend, work, prompt int64, streamed bool) {
	l.b = b
	l.prefill = work
	l.context = max(prompt, 0)
	l.timed = streamed
	l.state.Store(0)
	l.began = time.Now()
	b.counts.inFlight.Add(1)
	// Under the drain's lock, as SetPeerLoad decides, so that one of the two starts the drain.
	b.drain.mu.Lock()
	rate, raw := b.PrefillRate(), b.queuedRaw()
	l.ahead = b.drain.queuedLocked(l.began, raw, rate) // QueuedPrefill
	seqs, ctx := b.Decoding()
	l.decode = DecodeWork(seqs, ctx, l.ahead, work)
	b.counts.prefillTokens.Add(work)
	if b.counts.prefillReqs.Add(1) == 1 && b.peers.prefill.Load() == 0 {
		b.drain.startLocked(l.began) // the queue was empty: it starts now
	} else {
		b.drain.holdLocked(l.began, rate, raw) // this request's work counts in full
	}
	b.drain.mu.Unlock()
	b.counts.served.Add(1)
	b.loadChanged()
}

// Sent marks the request sent, for a lease begun before the request was held (the proxy's
// settle, a few milliseconds): its prefill sample (FirstByte) times from now, with the work
// queued ahead of it less what b likely worked off meanwhile at its prefill rate. Call it
// before FirstByte, from the goroutine that began the lease.
func (l *Lease) Sent() {
	if l.b == nil {
		return
	}
	now := time.Now()
	l.ahead = max(l.ahead-int64(now.Sub(l.began).Seconds()*l.b.PrefillRate()), 0)
	l.began = now
}

// Backend is the leased backend (nil before Begin).
func (l *Lease) Backend() *Backend { return l.b }

// FirstByte marks the end of prefill: the backend started answering. For a streamed request
// the time since Begin is an observation of the backend's prefill model.
func (l *Lease) FirstByte() { l.firstByte(true) }

// Refused marks a request the backend answered with an error status (a 400 for a prompt
// over the context, a 429): its prefill work leaves the queue as at FirstByte, but its answer
// came without a prefill and teaches the prefill model nothing: a fast 400 for a huge prompt
// taken as its TTFT would make the replica look far faster than it is, and every replica
// that had not learned its own rate would take that one's (the fleet median). Safe to call
// after FirstByte or Release (then it does nothing).
func (l *Lease) Refused() { l.firstByte(false) }

func (l *Lease) firstByte(observe bool) {
	for {
		s := l.state.Load()
		if s&(leaseAnswered|leaseReleased) != 0 {
			return
		}
		decoding := observe && l.timed
		next := s | leaseAnswered
		if decoding {
			next |= leaseDecoding
		}
		if l.state.CompareAndSwap(s, next) {
			if decoding { // counted first: Release takes them back once the bit is set
				l.b.counts.decodeSeqs.Add(1)
				l.b.counts.decodeCtx.Add(l.context)
			}
			l.b.leaveQueue(l.prefill, true) // a prefill finished: the queue moved
			if decoding {
				// The sample's work is what the estimate charged: the queue ahead, this
				// prompt's, and the decodes' (router.estimate), so that the learned rate is
				// the replica's prefill speed with decode interference taken apart.
				s := PrefillSample{Work: l.ahead + l.prefill + l.decode, TTFT: time.Since(l.began)}
				l.b.ObservePrefill(s.Work, s.TTFT)
				l.b.samples.keep(s)
			}
			return
		}
	}
}

// Release ends the request: finished, failed or cancelled. Safe to call more than once.
func (l *Lease) Release() {
	for {
		s := l.state.Load()
		if s&leaseReleased != 0 || l.b == nil {
			return
		}
		if l.state.CompareAndSwap(s, s|leaseReleased) {
			if s&leaseDecoding != 0 {
				l.b.counts.decodeSeqs.Add(-1)
				l.b.counts.decodeCtx.Add(-l.context)
			}
			if s&leaseAnswered == 0 {
				l.b.leaveQueue(l.prefill, false) // it leaves the queue undone
			}
			l.b.counts.inFlight.Add(-1)
			l.b.loadChanged()
			l.b.roomChanged()
			return
		}
	}
}

// Complete counts the request as answered in full with a success status: the counterpart of
// the replica's own finished-requests counter. Call it before Release, at most once.
func (l *Lease) Complete() {
	if l.b != nil && l.state.Load()&leaseReleased == 0 {
		l.b.counts.completed.Add(1)
	}
}
