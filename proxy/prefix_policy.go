package proxy

import (
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/router"
)

// newPrefixPolicy is a placeholder until router.NewPrefix lands: least-load.
func newPrefixPolicy(cfg *configs.Config) router.Policy { return &router.LeastLoad{} }
