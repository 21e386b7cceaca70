package proxy

import (
	"fmt"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
)

// UpdateBackends reconciles the running backends with specs (config reload, discovery).
// A spec without kv_cache_tokens takes the capacity the replica reports, else the default.
// A backend whose URL, KV capacity and weight are unchanged keeps its state: in-flight
// count, health, index entries. Removed backends stop taking new requests, finish what they
// have in flight, and lose their index entries. Specs are deduplicated by URL (first wins).
func (s *Server) UpdateBackends(specs []configs.Backend) error {
	cur := map[string]*backend.Backend{}
	for _, b := range s.pool.Snapshot() {
		cur[b.Name] = b
	}
	seen := map[string]bool{}
	out := make([]*backend.Backend, 0, len(specs))
	for i, sp := range specs {
		nb, err := backend.New(sp.URL, sp.KVCacheTokens, sp.Weight)
		if err != nil {
			return fmt.Errorf("backends[%d].url: %w", i, err)
		}
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
	return nil
}
