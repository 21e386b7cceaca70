package router

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// Decider is a mode's Policy with the rules every mode shares, decided here and nowhere else:
//
//   - a request that is not prefix-routed (Key.Routed false: /v1/models, /v1/rerank, …)
//     goes round-robin whatever the mode, on a counter of its own (ReasonPassthrough);
//   - a prefix-routed request whose body did not parse (Key.OK false, so no chunks) is
//     placed by the policy like any key without chunks and labelled ReasonParseFallback;
//     it is not learned;
//   - a retry asks the policy's Repick when it is a Repicker and the key parsed, else picks
//     again (passthrough retries take the next candidate in turn, see RoundRobin.Repick).
//
// It finds the policy's optional abilities once. It is safe for concurrent use.
type Decider struct {
	policy    Policy
	pass      RoundRobin    // passthrough requests
	setter    BackendSetter // nil when the policy has none of it
	learner   Learner
	tracker   Tracker
	indexed   IndexHolder
	explainer Explainer
	repicker  Repicker
	corrector Corrector
	watcher   ModelsWatcher
	settler   Settler
	shadow    ShadowReporter
}

// NewDecider wraps p.
func NewDecider(p Policy) *Decider {
	d := &Decider{policy: p}
	d.setter, _ = p.(BackendSetter)
	d.learner, _ = p.(Learner)
	d.tracker, _ = p.(Tracker)
	d.indexed, _ = p.(IndexHolder)
	d.repicker, _ = p.(Repicker)
	d.explainer, _ = p.(Explainer)
	d.corrector, _ = p.(Corrector)
	d.watcher, _ = p.(ModelsWatcher)
	d.settler, _ = p.(Settler)
	d.shadow, _ = p.(ShadowReporter)
	return d
}

// Policy returns the wrapped policy.
func (d *Decider) Policy() Policy { return d.policy }

// Pick decides the first attempt of a request among candidates (healthy); an empty list
// gives a Decision without a Backend.
func (d *Decider) Pick(k *key.Key, candidates []*backend.Backend) Decision {
	if !k.Routed {
		dec := d.pass.Pick(k, candidates)
		dec.Reason = ReasonPassthrough
		return dec
	}
	dec := d.policy.Pick(k, candidates)
	if !k.OK {
		dec.Reason = ReasonParseFallback
	}
	return dec
}

// Preview is Pick for /debug/route: the decision that Pick would make now, recorded nowhere
// (Policy.Preview; a passthrough request does not take its turn either).
func (d *Decider) Preview(k *key.Key, candidates []*backend.Backend) Decision {
	if !k.Routed {
		dec := d.pass.Preview(k, candidates)
		dec.Reason = ReasonPassthrough
		return dec
	}
	dec := d.policy.Preview(k, candidates)
	if !k.OK {
		dec.Reason = ReasonParseFallback
	}
	return dec
}

// Repick decides a retry after the attempt on failed.Backend failed before any byte reached
// the client; candidates are those left (healthy, not yet tried) and seq is the request's
// sequence number.
func (d *Decider) Repick(k *key.Key, failed Decision, candidates []*backend.Backend, seq uint64) Decision {
	switch {
	case !k.Routed:
		return d.pass.Repick(k, failed, candidates, seq)
	case k.OK && d.repicker != nil:
		return d.repicker.Repick(k, failed, candidates, seq)
	}
	return d.Pick(k, candidates)
}

// SetBackends hands every configured backend to the policy, if it keeps state per backend.
func (d *Decider) SetBackends(all []*backend.Backend) {
	if d.setter != nil {
		d.setter.SetBackends(all)
	}
}

// ModelsChanged tells the policy that b's models changed, if it keeps state per model pool.
func (d *Decider) ModelsChanged(b *backend.Backend) {
	if d.watcher != nil {
		d.watcher.ModelsChanged(b)
	}
}

// Learns reports whether a request with key k is learned once sent: the policy is a Learner
// and k parsed.
func (d *Decider) Learns(k *key.Key) bool { return d.learner != nil && k.Routed && k.OK }

// Learn records that b took k's request (see Learner); call it only when Learns(k).
func (d *Decider) Learn(k *key.Key, b *backend.Backend, held int) Learned {
	return d.learner.Learn(k, b, held)
}

// Unlearn withdraws what Learn returned l for (see Learner); l == 0 does nothing.
func (d *Decider) Unlearn(k *key.Key, b *backend.Backend, l Learned) {
	if l != 0 {
		d.learner.Unlearn(k, b, l)
	}
}

// Prefilled tells a Tracker that the first token of the request learned as l arrived from b
// (l == 0, or a policy that does not track: nothing).
func (d *Decider) Prefilled(k *key.Key, b *backend.Backend, l Learned) {
	if l != 0 && d.tracker != nil {
		d.tracker.Prefilled(k, b, l)
	}
}

// Finished tells a Tracker that the request learned as l ended on b (see Prefilled).
func (d *Decider) Finished(k *key.Key, b *backend.Backend, l Learned) {
	if l != 0 && d.tracker != nil {
		d.tracker.Finished(k, b, l)
	}
}

// SettleWait is how long the proxy holds a request decided dec, learned by Hold, before
// sending it (Settler; 0: at once, always for a policy that does not settle or a key not
// learned).
func (d *Decider) SettleWait(k *key.Key, dec Decision) time.Duration {
	if d.settler == nil || !d.Learns(k) {
		return 0
	}
	return d.settler.SettleWait(k, dec)
}

// Hold learns k's request, decided dec, for a hold of SettleWait (Settler; call it only when
// SettleWait asked to wait).
func (d *Decider) Hold(k *key.Key, dec Decision) Learned {
	return d.settler.Hold(k, dec)
}

// Release ends the hold of the request decided dec and held as l at decided (Settler): again
// means that what Hold learned is withdrawn and the request is to be decided again.
func (d *Decider) Release(k *key.Key, dec Decision, l Learned, decided time.Time) (again bool) {
	return d.settler.Release(k, dec, l, decided)
}

// Abandon withdraws the hold l of k's request on b, which will not be sent (Settler): its
// client left during the hold.
func (d *Decider) Abandon(k *key.Key, b *backend.Backend, l Learned) {
	d.settler.Abandon(k, b, l)
}

// Index returns the policy's prefix index, nil when it has none.
func (d *Decider) Index() *index.Index {
	if d.indexed == nil {
		return nil
	}
	return d.indexed.Index()
}

// ShadowStats returns the shadow's totals (ShadowReporter); ok is false when the policy runs
// no shadow.
func (d *Decider) ShadowStats() (st ShadowStats, ok bool) {
	if d.shadow == nil {
		return ShadowStats{}, false
	}
	return d.shadow.ShadowStats(), true
}

// Explain returns what the policy weighs per candidate for k (nil when the policy does not
// explain itself, or for a request it does not route by prefix).
func (d *Decider) Explain(k *key.Key, candidates []*backend.Backend) []CandidateEstimate {
	if d.explainer == nil || !k.Routed || !k.OK {
		return nil
	}
	return d.explainer.Explain(k, candidates)
}
