// Settling: peered replicas that decide at the same instant cannot see each other's
// decisions, which reach them a flush later. A burst of long cold prompts spread over three
// replicas (per-request spreading behind a Service) is placed by each on the backend that
// looks lightest to all of them, where one replica alone would have spread it (the Mooncake
// trace's arrivals come in such bursts; reproduce with `bench compare --workload mooncake
// --count 200 --time-scale 3 --router-replicas 3 --peering`). A request long enough for it
// to pay is therefore held (Hold: its decision, without its chunks, goes out to the peers)
// for SettleWait, and decided again (Release) when a peer's decision on the same backend
// arrived meanwhile that ranks ahead of it: of two alike, the earlier keeps the backend and
// the later sees it, in every replica alike, since the stamps say which came first.
//
// Which decision yields is not by stamp alone when both were held: a held decision placed by
// load (classFlexible: its reason is not a match, so its cache there is no reason to keep
// it) yields to a peer's held match whatever their stamps and sizes, and a held match never
// yields to a flexible one; by stamp alone, a long match would be moved off its cache for a
// cold prompt that could have gone anywhere. A decision sent at once (classSent: too short
// to hold) cannot move, and ranks by its stamp against any. The order (rank) is the same in
// every replica: of a held match and a held flexible decision that contend, the flexible one
// moves.

package peering

import (
	"sync"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

const (
	// DefaultSettleWait is 3 ms: three flush intervals, the time for a peer's decision made
	// at the same instant to go out (a flush interval after it, plus the timer's lateness),
	// cross the network and be applied here, with a margin for a busy sender.
	DefaultSettleWait = 3 * time.Millisecond
	// settleShare: only a request whose own prefill is predicted to take at least
	// settleShare × the wait is held (60 ms by default: a wait of at most 5% of its TTFT,
	// which a collision costs many times over; a short request's collision costs little).
	settleShare = 20
	// contendedShare: a peer's decisions unseen at the decision count as contention when
	// their prefill work is at least 1/contendedShare of this request's (a few short requests
	// do not make a long one move).
	contendedShare = 10
	// maxArrivals bounds the peers' recent decisions kept for Release: a few seconds of
	// bursts at hundreds of requests per second; older ones are overwritten (a wait is
	// milliseconds).
	maxArrivals = 1024
)

// class is how a decision went out, for settling's order (rank).
type class uint8

const (
	classSent     class = iota // not held (Learn): on its way already, it cannot move
	classMatch                 // held (Hold) for a match (router.ReasonMatch)
	classFlexible              // held, placed by load: cold, overload-fallback, ...
	numClasses
)

// classOf is the class of a held decision d.
func classOf(d router.Decision) class {
	if d.Reason == router.ReasonMatch {
		return classMatch
	}
	return classFlexible // a Decision without a Reason is round-robin's: placed by load
}

// arrival is one peer decision as this replica received it.
type arrival struct {
	id      uint64 // backend
	stamp   int64  // the peer's Learn stamp (unix ns, its clock)
	work    int64  // its prefill work (router.Prefix.RoutedWork)
	class   class  // how it went out (rank)
	arrived int64  // when it was applied here (unix ns, this replica's clock)
}

// arrivals is a ring of the peers' recent decisions. It is safe for concurrent use.
type arrivals struct {
	mu   sync.Mutex
	ring [maxArrivals]arrival
	next int
}

func (a *arrivals) add(x arrival) {
	a.mu.Lock()
	a.ring[a.next] = x
	a.next = (a.next + 1) % maxArrivals
	a.mu.Unlock()
}

// unseenAhead looks at the decisions on backend id that arrived after decided (unix ns), not
// seen by a held decision of class c stamped stamp made then: work sums those that weigh on it
// (rank), and yield reports one it yields to whatever the work.
func (a *arrivals) unseenAhead(id uint64, c class, stamp, decided int64) (work int64, yield bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.ring {
		x := &a.ring[i]
		if x.id != id || x.stamp == 0 || x.arrived <= decided {
			continue
		}
		switch rank(c, stamp, x.class, x.stamp) {
		case weighs:
			work += x.work
		case yields:
			yield = true
		}
	}
	return work, yield
}

// verdict is what a peer's decision means to a held one it contends with (rank).
type verdict uint8

const (
	unaffected verdict = iota // it ranks behind: the held decision keeps the backend
	weighs                    // it ranks ahead: its work counts (contended)
	yields                    // the held decision moves, whatever the work
)

// rank is what a peer's decision (class xc, stamped xs) means to a held decision (class c,
// stamped s) on the same backend: a held flexible decision yields to a held match, a held
// match is unaffected by a held flexible one, and otherwise (two alike, or a decision sent at
// once, which cannot move) the earlier stamp ranks ahead and weighs. For any two held
// decisions the verdicts agree in every replica: of a match and a flexible one, the flexible
// one moves; of two alike, the later may (contended), the earlier does not. Equal stamps of
// two senders weigh on neither.
func rank(c class, s int64, xc class, xs int64) verdict {
	switch {
	case c == classFlexible && xc == classMatch:
		return yields
	case c == classMatch && xc == classFlexible:
		return unaffected
	case xs < s:
		return weighs
	}
	return unaffected
}

// SettleWait is router.Settler's: how long a request decided d waits, learned, before it is
// sent. 0 (sent at once) while no peer is alive, with settling off (Options.SettleWait < 0),
// or when the request's own prefill on d.Backend is predicted under settleShare × the wait
// (d.PrefillWork at the backend's learned prefill rate).
func (p *Policy) SettleWait(_ *key.Key, d router.Decision) time.Duration {
	w := p.n.o.SettleWait
	if w <= 0 || d.Backend == nil || d.PrefillWork <= 0 || p.n.Alive() == 0 {
		return 0
	}
	rate := d.Backend.PrefillRate()
	if !(rate > 0) || time.Duration(float64(d.PrefillWork)/rate*float64(time.Second)) < settleShare*w {
		return 0
	}
	return w
}

// Hold is router.Settler's: Learn for a request held by SettleWait, whose decision goes to
// the peers at once, stamped l, with its prefill work and class (classOf), and its chunks
// only once Release keeps it: a decision made again sends no chunks to withdraw.
//
// When nothing was learned (0: a backend the index does not list) nothing is sent: the
// request is then sent at once, and its Learn sends the decision.
func (p *Policy) Hold(k *key.Key, d router.Decision) router.Learned {
	l := p.Prefix.Learn(k, d.Backend, d.MatchedChunks) // 0 for a nil backend
	if l != 0 {
		work := p.Prefix.RoutedWork(k, d.MatchedChunks)
		p.n.q.add(queued{id: d.Backend.ID, stamp: int64(l), work: work, class: classOf(d)}, nil, &p.n.m)
		p.n.m.settles.Inc()
	}
	return l
}

// Release is router.Settler's: it ends the hold of d's request, which Hold learned as l at
// decided. When peers' decisions on d.Backend that it yields to (rank: a held match, for a
// decision placed by load) or that rank ahead of it with prefill work at least
// 1/contendedShare of d.PrefillWork between them arrived since decided, what Hold learned is
// withdrawn here and Release reports true: the request is decided again with them in view,
// and the peers' later decisions on that backend see it. The withdrawn decision still counts
// where it was counted: in this replica's recent share (Pick noted it) and the peers' (they
// hold no chunk of it), decaying as any decision (router.RecentHalfLife), and in the peers'
// arrivals for a few seconds; a withdrawal on the wire would cost more than the share it
// corrects.
// Otherwise the decision stands and its chunks go to the peers as Learn's would, with work 0
// (counted once, at Hold); Unlearn withdraws it as a Learn.
func (p *Policy) Release(k *key.Key, d router.Decision, l router.Learned, decided time.Time) (again bool) {
	b := d.Backend
	if b == nil || l == 0 {
		return false
	}
	work, yield := p.n.arrivals.unseenAhead(b.ID, classOf(d), int64(l), decided.UnixNano())
	if yield || contended(work, d.PrefillWork) {
		p.n.m.resettles.Inc()
		p.Prefix.Unlearn(k, b, l)
		return true
	}
	// Work 0: the peers counted the decision when Hold sent it.
	p.queueLearned(k, b, d.MatchedChunks, l, 0)
	return false
}

// Abandon is router.Settler's: it withdraws the hold l of k's request on b, whose client left
// during the hold, from this replica's index. Its chunks never went to the peers (Release
// sends them), so nothing is sent: an Unlearn would send a forget of the whole prompt, which
// the peers hold none of. The decision stays counted, as a decision made again does (Release).
func (p *Policy) Abandon(k *key.Key, b *backend.Backend, l router.Learned) {
	if k == nil || b == nil || l == 0 {
		return
	}
	p.Prefix.Unlearn(k, b, l)
}

// contended reports whether unseen work ahead makes a request of work decide again.
func contended(unseen, work int64) bool {
	return unseen > 0 && unseen*contendedShare >= max(work, 1)
}

var _ router.Settler = (*Policy)(nil)
