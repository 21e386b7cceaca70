package proxy

import (
	"github.com/prefixlb/prefixlb/backend"
)

// UpdateBackends reconciles the running backends with bs (config reload, discovery), which
// the caller builds afresh. A backend whose name (URL), KV capacity and weight match a
// running one is replaced by the running one, which keeps its state: in-flight count,
// health, index entries. Removed backends stop taking new requests, finish what they have
// in flight, and lose their index entries. bs is deduplicated by name (first wins).
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
		if old, ok := cur[nb.Name]; ok && old.KVCacheTokens == nb.KVCacheTokens && old.Weight == nb.Weight {
			nb = old
		}
		out = append(out, nb)
	}
	s.SetBackends(out)
}
