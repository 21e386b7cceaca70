package app

import (
	"context"
	"fmt"
	"net"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/proxy"
)

// Start applies cfg's defaults, validates it and serves its proxy in this process on
// cfg.Listen ("127.0.0.1:0": an ephemeral port) through proxy.Server.Start, as Run does,
// without the admin listener, reloads or discovery: the bench and the tests start an
// in-process prefixlb this way. Stop the returned Serving when done.
func Start(ctx context.Context, cfg *configs.Config, log *zap.Logger) (*proxy.Serving, error) {
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s, err := newServer(cfg, log)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	return s.Start(ctx, ln), nil
}
