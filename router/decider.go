package router

import (
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
//   - a request is learned only when the policy is a Learner and its key parsed: its
//     Ticket says so, and makes the policy's learning calls;
//   - a retry asks the policy's Repick when it is a Repicker and the key parsed, else picks
//     again (passthrough retries take the next candidate in turn, see RoundRobin.Repick).
//
// It finds the policy's ability groups (abilities.go) once and is the proxy's one way to
// them. It is safe for concurrent use.
type Decider struct {
	policy    Policy
	pass      RoundRobin // passthrough requests
	fleet     Fleet      // nil when the policy has none of it
	learner   Learner
	settler   Settler
	tracker   Tracker
	repicker  Repicker
	inspector Inspector
}

// NewDecider wraps p.
func NewDecider(p Policy) *Decider {
	d := &Decider{policy: p}
	d.fleet, _ = p.(Fleet)
	d.learner, _ = p.(Learner)
	d.settler, _ = p.(Settler)
	d.tracker, _ = p.(Tracker)
	d.repicker, _ = p.(Repicker)
	d.inspector, _ = p.(Inspector)
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

// SetBackends hands every configured backend to the policy, if it keeps state per backend
// (Fleet).
func (d *Decider) SetBackends(all []*backend.Backend) {
	if d.fleet != nil {
		d.fleet.SetBackends(all)
	}
}

// ModelsChanged tells the policy that b's models changed, if it keeps state per model pool
// (Fleet).
func (d *Decider) ModelsChanged(b *backend.Backend) {
	if d.fleet != nil {
		d.fleet.ModelsChanged(b)
	}
}

// Ticket issues the learning ticket of the request with key k (Ticket), open: it learns
// when the policy is a Learner and k parsed, holds to settle when the policy is a Settler
// besides, and tells a Tracker when the request's first token arrives and when it ends. k must outlive the ticket.
func (d *Decider) Ticket(k *key.Key) Ticket {
	t := Ticket{k: k}
	if d.learner != nil && k.Routed && k.OK {
		t.learner, t.settler, t.tracker = d.learner, d.settler, d.tracker
	}
	return t
}

// Index returns the policy's prefix index, nil when it has none (Inspector).
func (d *Decider) Index() *index.Index {
	if d.inspector == nil {
		return nil
	}
	return d.inspector.Index()
}

// ShadowStats returns the shadow's totals (Inspector); ok is false when the policy runs no
// shadow.
func (d *Decider) ShadowStats() (st ShadowStats, ok bool) {
	if d.inspector == nil {
		return ShadowStats{}, false
	}
	return d.inspector.ShadowStats()
}

// Explain returns what the policy weighs per candidate for k (nil when the policy does not
// explain itself, or for a request it does not route by prefix; Inspector).
func (d *Decider) Explain(k *key.Key, candidates []*backend.Backend) []CandidateEstimate {
	if d.inspector == nil || !k.Routed || !k.OK {
		return nil
	}
	return d.inspector.Explain(k, candidates)
}
