// Package oracle is the bench's routing yardstick: a bench-only policy that reads each
// simulated replica's true state in-process and sends every request where the simulator's own
// step-cost model predicts the least time to first token. It is the greedy limit — the least
// predicted TTFT for each request, one request at a time, with perfect knowledge of the
// replicas now — against which `prefixlb bench suite` measures the real policies (the p95 ÷
// oracle column). It is not a lower bound: greedy placement gives up affinity (it sends a
// session's next turn wherever is quickest now, not where its context will keep growing), and
// on growing agent sessions prefix routing can beat it. It is not a mode of `prefixlb serve`:
// no proxy can see a replica's KV cache and scheduler this way.
package oracle

import (
	"bytes"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// Name is the oracle's name in `bench compare --modes`.
const Name = "oracle"

// pendingTTL bounds how long a routed request counts as on its way to its replica: on
// 127.0.0.1 a request reaches the engine within milliseconds, so an entry this old was
// refused (or its client left) and never will.
const pendingTTL = time.Second

// Oracle picks, per request, the simulated replica of least predicted TTFT.
//
// For each candidate it asks the replica (sim.Replica.Predict) to walk its scheduler forward
// from its current state — the longest prefix its KV cache holds for this prompt in the sim's
// own blocks, its running prefills and decodes, its waiting queue, the step in flight — with
// the requests this oracle routed there that have not arrived yet queued ahead, and returns
// the model time until this request's first token. The prompt is read as the replica reads it
// (sim.Replica.ParsePrompt: the sim's chat template and tokenizer on the request body).
//
// What it does not model: requests that arrive after this one. It is greedy — it cannot hold
// a replica's cache for a conversation's next turn, nor see that the arrival behind it would
// have fitted better — so a policy that keeps affinity can beat it, on growing sessions by
// a wide margin; and it does not model evictions during the walk (see sim.Engine.Predict).
// One Oracle may serve several routers at once (bench compare shares one among an arm's
// --router-replicas): Pick is safe for concurrent use and each routed request stays pending
// until an arrival with its fingerprint (sim.Fingerprint) reaches its replica. Ties (equal
// predicted TTFT) go to the candidate with the most cached tokens, then by a rotating start.
//
// A request whose body the sim cannot read (or a backend that is not one of the cluster's
// replicas) is routed least-loaded, as the replica will refuse it anyway.
type Oracle struct {
	byName map[string]*target
	rot    atomic.Uint64
	ll     router.LeastLoad
	clock  func() time.Time
}

// target is the oracle's view of one replica: the replica and the requests routed to it that
// have not reached its engine yet.
type target struct {
	rep *sim.Replica
	bs  int

	mu      sync.Mutex
	pending []pendingReq
	seen    uint64 // the replica's arrivals up to this Seq have been matched
	scratch []sim.Arrival
}

// pendingReq is a routed request: its description, the replica's ArrivalSeq when it was
// routed (it arrives with a larger Seq) and when.
type pendingReq struct {
	p     sim.Pending
	after uint64
	at    time.Time
}

// New returns an oracle over the cluster's replicas; backends are matched to replicas by URL
// (a backend's Name is its URL).
func New(c *sim.Cluster) *Oracle {
	o := &Oracle{byName: map[string]*target{}, clock: time.Now}
	urls, reps := c.URLs(), c.Replicas()
	for i, r := range reps {
		o.byName[urls[i]] = &target{rep: r, bs: r.Config().BlockSize, seen: r.ArrivalSeq()}
	}
	return o
}

// Pick returns the candidate of least predicted TTFT, and counts the request pending there.
func (o *Oracle) Pick(k *key.Key, cs []*backend.Backend) router.Decision { return o.pick(k, cs, true) }

// Preview is Pick without counting the request pending or turning the rotation.
func (o *Oracle) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return o.pick(k, cs, false)
}

func (o *Oracle) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	fallback := o.ll.Pick
	if !commit {
		fallback = o.ll.Preview
	}
	if len(cs) == 0 {
		return router.Decision{}
	}
	tgt := o.byName[cs[0].Name]
	if k == nil || len(k.Body) == 0 || tgt == nil {
		return fallback(k, cs)
	}
	var tokens []uint32
	var seed uint64
	var maxTokens int
	var err error
	if k.API == key.APIMessages {
		tokens, seed, maxTokens, err = tgt.rep.ParseMessagesPrompt(k.Body)
	} else {
		tokens, seed, maxTokens, err = tgt.rep.ParsePrompt(k.Body, bytes.Contains(k.Body, []byte(`"messages"`)))
	}
	if err != nil {
		return fallback(k, cs)
	}
	// Hashed once, outside every lock: each replica's locked work is only the walk.
	q := sim.NewPending(tokens, seed, maxTokens, tgt.bs)
	now := o.clock()
	n := len(cs)
	start := int((o.rot.Load() + 1) % uint64(n)) // the turn Pick would take
	if commit {
		start = int(o.rot.Add(1) % uint64(n))
	}
	best, bestTTFT, bestCached := -1, time.Duration(math.MaxInt64), -1
	for i := range n {
		j := (start + i) % n
		t := o.byName[cs[j].Name]
		if t == nil {
			continue
		}
		p := t.predict(q, now)
		ttft := time.Duration(math.MaxInt64)
		if p.OK {
			ttft = p.TTFT
		}
		if best < 0 || ttft < bestTTFT || ttft == bestTTFT && p.CachedTokens > bestCached {
			best, bestTTFT, bestCached = j, ttft, p.CachedTokens
		}
	}
	if best < 0 {
		return fallback(k, cs)
	}
	if commit {
		o.byName[cs[best].Name].sentTo(q, now)
	}
	reason := router.ReasonLeastLoad
	if bestCached > 0 {
		reason = router.ReasonMatch
	}
	return router.Decision{Backend: cs[best], Reason: reason}
}

// predict asks the replica, with the requests still on their way to it queued first.
func (t *target) predict(q sim.Pending, now time.Time) sim.Prediction {
	t.mu.Lock()
	t.trim(now)
	pend := make([]sim.Pending, len(t.pending))
	for i, r := range t.pending {
		pend[i] = r.p
	}
	t.mu.Unlock()
	return t.rep.PredictPending(q, pend)
}

// sentTo records a request routed to this replica.
func (t *target) sentTo(p sim.Pending, now time.Time) {
	after := t.rep.ArrivalSeq()
	t.mu.Lock()
	t.pending = append(t.pending, pendingReq{p: p, after: after, at: now})
	t.mu.Unlock()
}

// trim drops the pending requests that have arrived and those older than pendingTTL (refused
// or abandoned). A request has arrived when the replica logged an arrival with its
// Fingerprint after it was routed (sim.Replica.ArrivalsSince): requests routed there by
// other routers, or sent to it directly, match none of this oracle's and are not counted
// against them. Two pending requests with the same fingerprint (the same body) are matched
// oldest first. The caller holds t.mu.
func (t *target) trim(now time.Time) {
	if len(t.pending) == 0 {
		t.seen = t.rep.ArrivalSeq()
		return
	}
	t.scratch, _ = t.rep.ArrivalsSince(t.seen, t.scratch[:0])
	for _, a := range t.scratch {
		t.seen = a.Seq
		for i, r := range t.pending {
			if r.after < a.Seq && r.p.Fingerprint() == a.Fingerprint {
				t.pending = append(t.pending[:i], t.pending[i+1:]...)
				break
			}
		}
	}
	n := 0
	for _, r := range t.pending {
		if now.Sub(r.at) <= pendingTTL {
			t.pending[n] = r
			n++
		}
	}
	t.pending = t.pending[:n]
}
