package proxy

import (
	"github.com/prefixlb/prefixlb/backend"
)

// UpdateBackends reconciles the running backends with bs (config reload, discovery), which
// the caller builds afresh. A backend whose name (URL) matches a running one is replaced by
// the running one, which takes bs's settings (KV capacity, weight, configured models) in
// place and keeps its state: in-flight count, health and ejection, index entries, learned
// prefill rates. Only a new URL is a new backend. Removed backends stop taking new
// requests, finish what they have in flight, and lose their index entries. bs is
// deduplicated by name (first wins).
func (s *Server) UpdateBackends(bs []*backend.Backend) {
	cur := map[string]*backend.Backend{}
	for _, b := range s.pool.Snapshot() {
		cur[b.Name] = b
	}
	seen := map[string]bool{}
	out := make([]*backend.Backend, 0, len(bs))
	for _, nb := range bs {
		if seen[nb.Name] {
			continue
		}
		seen[nb.Name] = true
		if old, ok := cur[nb.Name]; ok {
			old.SetKVCacheTokens(nb.KVCacheTokens())
			old.SetWeight(nb.Weight())
			old.SetMaxConcurrency(nb.MaxConcurrency())
			adoptModels(old, nb)
			nb = old
		}
		out = append(out, nb)
	}
	s.SetBackends(out)
}

// refreshPolicy hands the current backends to the policy again (capacities changed).
func (s *Server) refreshPolicy() {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	s.decider.SetBackends(s.pool.Snapshot())
}

// SetBackends replaces the backend list. Connections to removed backends are closed once idle;
// in-flight requests to them finish.
func (s *Server) SetBackends(bs []*backend.Backend) {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	old := s.ups.Load()
	ups := make(map[*backend.Backend]*upstream, len(bs))
	for _, b := range bs {
		if old != nil {
			if up, ok := (*old)[b]; ok {
				ups[b] = up
				continue
			}
		}
		ups[b] = newUpstream(b, s.connTimeout, s.m.forBackend(b.Name))
		ups[b].fds = s.fds
	}
	s.ups.Store(&ups)
	s.hc.SetBackends(bs)
	s.pool.Set(bs)
	s.decider.SetBackends(bs)
	s.rebuildPoolsLocked()
	s.notifyRoomLocked(bs)
	s.fc.wake() // a new or changed backend may have room for queued requests
	if old != nil {
		for b, up := range *old {
			if _, ok := ups[b]; !ok {
				b.NotifyRoom(nil)
				up.retire()
				s.m.releaseBackend(up.m)
				b.ResetCache()
			}
		}
	}
}

// adoptModels gives the running backend old the models its replacement nb is configured with
// (backends[].models changed on a reload); when nb has none configured, a configured set of
// old is dropped so that discovery fills it again.
func adoptModels(old, nb *backend.Backend) {
	switch ns := nb.Models(); {
	case ns != nil && ns.Configured:
		if !ns.Equal(old.Models()) {
			ids := make([]string, len(ns.Models()))
			for i, m := range ns.Models() {
				ids[i] = m.ID
			}
			old.SetConfiguredModels(ids)
		}
	case old.ModelsConfigured():
		old.SetConfiguredModels(nil)
	}
}
