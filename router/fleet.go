// The pooled prefill models: one per model pool, learned from every observation of the
// pool's replicas, standing in for a replica's own until it has learned.

package router

import (
	"strings"

	"github.com/prefixlb/prefixlb/backend"
)

// poolKey names the model pool whose replicas share a pooled prefill model: the base models
// b serves (its adapters run at their base model's speed), in ID order; all of its models when
// it lists only adapters; "" while its models are unknown (a replica that serves any model).
// Replicas of one key serve the same weights, so one speed stands in for all of them; an 8B
// pool and a 70B pool behind one prefixlb each learn their own.
func poolKey(b *backend.Backend) string {
	s := b.Models()
	if s == nil {
		return ""
	}
	if k := joinIDs(s.Models(), true); k != "" {
		return k
	}
	return joinIDs(s.Models(), false)
}

// joinIDs is the ids of ms (only the base models' when basesOnly), joined by newlines.
func joinIDs(ms []backend.Model, basesOnly bool) string {
	var sb strings.Builder
	for _, m := range ms {
		if basesOnly && m.Parent != "" {
			continue
		}
		if sb.Len() > 0 {
			sb.WriteByte('\n')
		}
		sb.WriteString(m.ID)
	}
	return sb.String()
}

// bindFleets records all as the policy's backends and gives each the pooled model of its pool
// (backend.SetFleetPrefill), keeping what a pool already learned, and forgets the pools none
// of all is in (SetBackends).
func (p *Prefix) bindFleets(all []*backend.Backend) {
	p.fleetMu.Lock()
	defer p.fleetMu.Unlock()
	p.all = all
	p.bindFleetsLocked()
}

// bindFleetsLocked binds p.all as bindFleets does; p.fleetMu is held. A replica that moves
// to a pool nobody served starts it afresh: its models are read at start, before its first
// answers, so what the pool of unknown models learned is little, and of unlike replicas.
func (p *Prefix) bindFleetsLocked() {
	fleets := make(map[string]*backend.PrefillModel, len(p.fleets))
	for _, b := range p.all {
		k := poolKey(b)
		m := fleets[k]
		if m == nil {
			if m = p.fleets[k]; m == nil {
				m = new(backend.PrefillModel)
			}
			fleets[k] = m
		}
		b.SetFleetPrefill(m)
	}
	p.fleets = fleets
}

// ModelsChanged moves b to the pooled prefill model of the pool it serves now (its models
// were discovered, or changed). The proxy calls it from the health checker's models hook.
func (p *Prefix) ModelsChanged(*backend.Backend) {
	p.fleetMu.Lock()
	defer p.fleetMu.Unlock()
	p.bindFleetsLocked()
}
