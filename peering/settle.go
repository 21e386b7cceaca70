// Settling: peered replicas that decide at the same instant cannot see each other's
// decisions, which reach them a flush later. A burst of long cold prompts spread over three
// replicas (per-request spreading behind a Service) is placed by each on the backend that
// looks lightest to all of them, where one replica alone would have spread it: on the
// Mooncake trace, whose arrivals come in bursts of up to 16 at one instant, the work on the
// most loaded backend of each burst was 1.23× one replica's, and the mean TTFT 1.1–1.3×
// (three runs of `bench compare --workload mooncake --count 200 --time-scale 3
// --router-replicas 3 --peering`, against one replica). A request long enough for it to pay
// is therefore held (Hold: its decision, without its chunks, goes out to the peers) for
// SettleWait, and decided again (Release) when a peer's decision on the same backend arrived
// meanwhile that was made before it: the earlier decision keeps the backend and the later
// sees it, in every replica alike, since the stamps say which came first. Settled, the same
// runs read a mean TTFT 0.95–0.98× one replica's.
//
// Which decision yields is not by stamp alone: a held decision placed by load (flexible: its
// reason is not a match, so it holds no more of its prompt there than anywhere) yields to a
// peer's match whatever their stamps, and a match never yields to a flexible one. A stamp
// order alone moved long matches off their cache: on the Mooncake trace a held request
// matching 9k–14k tokens found a peer's cold long prompt stamped a moment earlier on its
// backend, was decided again and fell back to an uncached one (`x-prefixlb-route`
// overload-fallback, settled=2), where the cold prompt could have gone anywhere. The order
// (match before flexible, then stamp) is the same in every replica, so that of two contending
// decisions exactly one moves.

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
	// at the same instant to go out at its next flush (≤ 1 ms), cross the network and be
	// applied here, with a margin for a busy sender.
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

// arrival is one peer decision as this replica received it.
type arrival struct {
	id       uint64 // backend
	stamp    int64  // the peer's Learn stamp (unix ns, its clock)
	work     int64  // its prefill work (router.Prefix.RoutedWork)
	flexible bool   // held and placed by load: it yields to a match (see the file comment)
	arrived  int64  // when it was applied here (unix ns, this replica's clock)
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

// unseenAhead sums the work of the decisions on backend id that rank ahead of one stamped
// stamp (flexible or not, see ahead) and arrived after decided (unix ns): not seen by a
// decision made at decided.
func (a *arrivals) unseenAhead(id uint64, stamp int64, flexible bool, decided int64) int64 {
	var sum int64
	a.mu.Lock()
	for i := range a.ring {
		if x := &a.ring[i]; x.id == id && x.stamp != 0 && x.arrived > decided && ahead(x.flexible, x.stamp, flexible, stamp) {
			sum += x.work
		}
	}
	a.mu.Unlock()
	return sum
}

// SettleWait is router.Settler's: how long a request decided d waits, learned, before it is
// sent. 0 (sent at once) while no peer is alive, with settling off (Options.SettleWait < 0),
// or when the request's own prefill on d.Backend is predicted under settleShare × the wait
// (d.PrefillWork at the backend's learned prefill rate).
func (p *Policy) SettleWait(_ *key.Key, d router.Decision) time.Duration {
	w := p.n.o.SettleWait
	if w <= 0 || d.Backend == nil || d.PrefillWork <= 0 || p.n.live.Load() == 0 {
		return 0
	}
	rate := d.Backend.PrefillRate()
	if !(rate > 0) || time.Duration(float64(d.PrefillWork)/rate*float64(time.Second)) < settleShare*w {
		return 0
	}
	return w
}

// Hold is router.Settler's: Learn for a request held by SettleWait, whose decision goes to
// the peers at once, stamped l, with its prefill work and whether it is flexible, and its
// chunks only once Release keeps it: a decision made again sends no chunks to withdraw.
//
// When nothing was learned (0: a backend the index does not list) nothing is sent: the
// request is then sent at once, and its Learn sends the decision.
func (p *Policy) Hold(k *key.Key, d router.Decision) router.Learned {
	b := d.Backend
	if b == nil {
		return 0
	}
	l := p.Prefix.Learn(k, b, d.MatchedChunks)
	if l != 0 {
		work := p.Prefix.RoutedWork(k, d.MatchedChunks)
		p.n.q.add(queued{id: b.ID, stamp: int64(l), work: work, flexible: flexible(d)}, nil, &p.n.m)
		p.n.m.settles.Inc()
	}
	return l
}

// flexible reports whether a held decision may move at no cache cost: its backend was not
// chosen for a match (router.ReasonMatch), so it holds no more of the prompt than the others.
func flexible(d router.Decision) bool {
	return d.Reason != router.ReasonMatch
}

// Release is router.Settler's: it ends the hold of d's request, which Hold learned as l at
// decided. When peers' decisions on d.Backend that rank ahead of it (ahead: a match before a
// flexible one, then the earlier stamp) arrived since decided, with prefill work at least
// 1/contendedShare of d.PrefillWork, what Hold learned is withdrawn here and Release reports
// true: the request is decided again with them in view, and the peers' later decisions on
// that backend see it. The withdrawn decision still counts where it
// was counted: in this replica's recent share (Pick noted it) and the peers' (they hold no
// chunk of it), decaying as any decision (router.RecentHalfLife), and in the peers' arrivals
// for a few seconds; a withdrawal on the wire would cost more than the share it corrects.
// Otherwise the decision stands and its chunks go to the peers as Learn's would, with work 0
// (counted once, at Hold); Unlearn withdraws it as a Learn.
func (p *Policy) Release(k *key.Key, d router.Decision, l router.Learned, decided time.Time) (again bool) {
	b := d.Backend
	if b == nil || l == 0 {
		return false
	}
	if contended(p.n.arrivals.unseenAhead(b.ID, int64(l), flexible(d), decided.UnixNano()), d.PrefillWork) {
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

// ahead reports whether a decision (flexible xf, stamped xs) keeps its backend against one
// (flexible f, stamped s) it contends with: a decision that is not flexible ranks ahead of a
// flexible one, and of two alike the earlier stamp. Any two distinct decisions are ordered,
// the same way in every replica (the stamps are distinct per sender; of two alike with equal
// stamps from two senders neither yields).
func ahead(xf bool, xs int64, f bool, s int64) bool {
	if xf != f {
		return f
	}
	return xs < s
}

// contended reports whether unseen work ahead makes a request of work decide again.
func contended(unseen, work int64) bool {
	return unseen > 0 && unseen*contendedShare >= max(work, 1)
}

var _ router.Settler = (*Policy)(nil)
