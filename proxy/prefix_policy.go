package proxy

import (
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/router"
)

// newPrefixPolicy builds the prefix policy from the config's prefix section.
func newPrefixPolicy(cfg *configs.Config) router.Policy {
	return router.NewPrefix(cfg.Prefix.RouterOptions(), nil)
}
