package proxy

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/router"
)

// The dispatcher of flow control (flowctl.go): it places held requests on replicas as they
// free up, with the state of that moment (late binding), and answers them at shutdown.

// run is the dispatcher: woken when a replica may have room (backend.NotifyRoom), when a
// request is queued, at the earliest deadline and at least every dispatchPoll while
// requests wait, it expires what is past its deadline and places what the pools have room
// for.
func (fc *flowControl) run() {
	defer close(fc.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-fc.stop:
			return
		case <-fc.kick:
		case <-t.C:
		}
		next := fc.dispatch(time.Now())
		t.Reset(next)
	}
}

// dispatch expires and places what it can in every pool's queue, and returns how long to
// sleep until the next look.
func (fc *flowControl) dispatch(now time.Time) time.Duration {
	sleep := time.Hour
	for _, pq := range *fc.list.Load() {
		if n := pq.q.Expire(now); n > 0 {
			fc.m.expiredSeen.Add(n)
		}
		if pq.q.Len() == 0 {
			continue
		}
		drained := fc.place(pq, now)
		if pq.q.Len() > 0 {
			sleep = min(sleep, dispatchPoll)
			if drained > 0 {
				sleep = min(sleep, drained)
			}
			if d, ok := pq.q.NextDeadline(); ok {
				sleep = min(sleep, max(d.Sub(now), time.Millisecond))
			}
		}
	}
	return sleep
}

// maxAside bounds the requests held by the reserve rule that one placement round sets
// aside to look at those behind them (place).
const maxAside = 16

// place takes the heads of pq in the queue's order and places each on a replica of its
// pool that has room now, by the policy with the state of this moment (late binding).
// A request held by the reserve rule alone (a lower band's, or a backlogged flow's yielding
// to a flow under its share, while the pool has room by the other rules) is set aside, and
// those behind it are looked at: a higher band's request or the lighter flow's must not wait
// behind it for the room it leaves them (up to maxAside of them; all go back to their places
// at the end). The first request that finds no room otherwise is put back, and the pool
// waits for the next signal. It returns how long until the first replica of those set aside
// has its queued prefill drained under ReservePrefill at its rate (no event signals that), or
// 0 when none was.
func (fc *flowControl) place(pq *poolQueue, now time.Time) (drained time.Duration) {
	s := fc.s
	cfg := fc.config()
	rsv := pq.reserveOf(now)
	aside := fc.aside[:0]
	defer func() { fc.aside = requeueAside(pq, aside) }()
	for it := pq.q.Next(now); it != nil; it = pq.q.Next(now) {
		f := it.Value.(*flow)
		members := s.poolMembers(pq.name)
		f.cands, _ = backend.Healthy(f.cands[:0], members)
		below, keep := rsv.reserveFor(it)
		below = below && cfg.Enabled
		if cfg.Enabled {
			fc.roomy = s.appendRoomy(cfg, fc.roomy[:0], f.cands, below, keep)
		} else {
			// Turned off by a reload: what it held goes on as every request now does, at
			// once; waiting for room, it would stand behind every new request.
			fc.roomy = append(fc.roomy[:0], f.cands...)
		}
		if len(fc.roomy) == 0 {
			// Read f before it goes back: once queued, its handler may take it (shed,
			// expired, gone) and reuse it.
			saturated := cfg.Enabled && (!below || s.poolSaturated(cfg, f.cands))
			if saturated {
				pq.noteSaturated(now)
			}
			if below && !saturated && cfg.ReservePrefill > 0 && cfg.Saturation != SaturationGIE {
				if d := untilDrained(f.cands, cfg, now, keep); d > 0 && (drained == 0 || d < drained) {
					drained = d
				}
				if len(aside) < maxAside {
					aside = append(aside, it)
					continue
				}
			}
			pq.q.Requeue(it)
			if saturated {
				// Its queued sheddable requests are refused now rather than held: they would
				// be refused at once if they came now; those set aside too, back first.
				aside = requeueAside(pq, aside)
				pq.q.Shed()
			}
			return drained
		}
		f.keyed = time.Time{} // routing time counts from the dispatch, not the wait
		from := time.Now()
		f.dec = s.decider.Pick(&f.k, fc.roomy)
		if f.dec.Backend == nil {
			pq.q.Requeue(it)
			return drained
		}
		f.tr.picked(&f.dec, f.k.PromptTokens, s.m.routing.picked(from))
		s.beginLease(f, f.dec.Backend)
		f.placed, f.leased = true, true
		clear(fc.roomy)
		pq.q.Dispatched(it)
	}
	return drained
}

// requeueAside puts the requests place set aside back in pq's queue, last first (each goes
// back to its flow's head), and returns aside emptied.
func requeueAside(pq *poolQueue, aside []*flowcontrol.Item) []*flowcontrol.Item {
	for i := len(aside) - 1; i >= 0; i-- {
		pq.q.Requeue(aside[i])
	}
	clear(aside)
	return aside[:0]
}

// untilDrained is how long until cands held by the reserve rule alone (not saturated by
// cfg's other rules) have room for a lower band's request: until the replica kept for the
// higher band (keptFree, when keep) and one more have their queued prefill under
// cfg.ReservePrefill at their prefill rates, from now; at least a millisecond. 0 when too few
// are held by it alone: a replica full by count or KV cache signals its room when a request
// ends (backend.NotifyRoom), and waking early for it would only spin the dispatcher.
func untilDrained(cands []*backend.Backend, cfg *FlowControl, now time.Time, keep bool) time.Duration {
	r := ruleOf(cfg)
	r.now = now
	// The soonest drains, first and second (a pool that keeps one replica needs two).
	var first, second time.Duration
	found := 0
	for _, b := range cands {
		v := viewOf(b)
		if v.saturated(&r) {
			continue
		}
		d := v.prefillAhead(&r) - cfg.ReservePrefill
		switch {
		case found == 0 || d < first:
			first, second = d, first
		case found == 1 || d < second:
			second = d
		}
		found++
	}
	r.reserve, r.keep = cfg.ReservePrefill, keep
	need := keptFree(cands, r) + 1
	switch {
	case found < need:
		return 0
	case need == 2:
		return max(second, time.Millisecond)
	}
	return max(first, time.Millisecond)
}

// drain answers every queued request 503 (shutdown) and closes the queues; the dispatcher
// goes on placing what it already took.
func (fc *flowControl) drain() int {
	fc.mu.Lock()
	fc.closed = true
	fc.mu.Unlock()
	n := 0
	for _, pq := range *fc.list.Load() {
		n += pq.q.Drain()
	}
	return n
}

// close stops the dispatcher.
func (fc *flowControl) close() {
	fc.stopOnce.Do(func() { close(fc.stop) })
	<-fc.done
}

// beginLease begins f's lease on b with the prefill work the decision predicted there.
func (s *Server) beginLease(f *flow, b *backend.Backend) {
	work := f.dec.PrefillWork
	if work <= 0 || f.dec.Backend != b {
		work = router.PrefillWork(int64(f.k.PromptTokens), 0)
	}
	f.lease.Begin(b, work, int64(f.k.PromptTokens), f.k.Stream)
}
