package proxy

import (
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/router"
)

// prefixOptions maps the config's prefix section onto the prefix policy's options.
func prefixOptions(cfg *configs.Config) router.PrefixOptions {
	return router.PrefixOptions{
		ChunkTokens:          cfg.Prefix.ChunkTokens,
		LoadFactor:           cfg.Prefix.LoadFactor,
		LoadMargin:           cfg.Prefix.LoadMargin,
		MaxIndexEntries:      cfg.Prefix.MaxIndexEntries,
		DefaultKVCacheTokens: cfg.Prefix.DefaultKVCacheTokens,
	}
}
