package proxy

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
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
		fc.place(pq, now)
		if pq.q.Len() > 0 {
			sleep = min(sleep, dispatchPoll)
			if d, ok := pq.q.NextDeadline(); ok {
				sleep = min(sleep, max(d.Sub(now), time.Millisecond))
			}
		}
	}
	return sleep
}

// place takes the heads of pq in the queue's order and places each on a replica of its
// pool that has room now, by the policy with the state of this moment (late binding);
// the first that finds none is put back, and the pool waits for the next signal.
func (fc *flowControl) place(pq *poolQueue, now time.Time) {
	s := fc.s
	cfg := fc.config()
	for it := pq.q.Next(now); it != nil; it = pq.q.Next(now) {
		f := it.Value.(*flow)
		members := s.poolMembers(pq.name)
		f.cands, _ = backend.Healthy(f.cands[:0], members)
		if cfg.Enabled {
			fc.roomy = s.appendRoomy(cfg, fc.roomy[:0], f.cands)
		} else {
			// Turned off by a reload: what it held goes on as every request now does, at
			// once; waiting for room, it would stand behind every new request.
			fc.roomy = append(fc.roomy[:0], f.cands...)
		}
		if len(fc.roomy) == 0 {
			pq.q.Requeue(it)
			return
		}
		f.keyed = time.Time{} // routing time counts from the dispatch, not the wait
		from := time.Now()
		f.dec = s.decider.Pick(&f.k, fc.roomy)
		if f.dec.Backend == nil {
			pq.q.Requeue(it)
			return
		}
		f.tr.picked(&f.dec, f.k.PromptTokens, s.m.routing.picked(from))
		s.beginLease(f, f.dec.Backend)
		f.placed, f.leased = true, true
		clear(fc.roomy)
		pq.q.Dispatched(it)
	}
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
