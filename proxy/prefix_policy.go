package proxy

import (
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/router"
)

// newPrefixPolicy builds the prefix policy from the config's prefix section.
func newPrefixPolicy(cfg *configs.Config) router.Policy {
	return router.NewPrefix(router.PrefixOptions{
		ChunkTokens:          cfg.Prefix.ChunkTokens,
		LoadFactor:           cfg.Prefix.LoadFactor,
		LoadMargin:           cfg.Prefix.LoadMargin,
		MaxIndexEntries:      cfg.Prefix.MaxIndexEntries,
		DefaultKVCacheTokens: cfg.Prefix.DefaultKVCacheTokens,
	}, nil)
}
