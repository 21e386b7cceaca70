package app

import (
	"context"
	"errors"
	"fmt"
	"net"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
)

// Start applies cfg's defaults, validates it and serves its proxy in this process on
// cfg.Listen ("127.0.0.1:0": an ephemeral port) through proxy.Server.Start, as Run does,
// without the admin listener, reloads or discovery: the bench and the tests start an
// in-process prefixlb this way. Stop the returned Serving when done.
func Start(ctx context.Context, cfg *configs.Config, log *zap.Logger) (*proxy.Serving, error) {
	return start(ctx, cfg, log, nil)
}

// StartPolicy is Start with pol routing in place of cfg.Mode's policy, and label naming it
// in the proxy's mode label (prefixlb_requests_total{mode}, /debug/backends). The bench
// starts its bench-only policies (bench/peers) this way; cfg.Mode must still name a mode,
// for validation, and its prefix section configures the rest as usual. Neither the config
// nor `prefixlb serve` can select pol. An empty label or a nil pol is an error.
func StartPolicy(ctx context.Context, cfg *configs.Config, log *zap.Logger, label string, pol router.Policy) (*proxy.Serving, error) {
	if label == "" || pol == nil {
		return nil, errors.New("StartPolicy: a label and a policy are required")
	}
	return start(ctx, cfg, log, func(o *proxy.Options) { o.Mode, o.Policy = label, pol })
}

// Tuning edits what a validated config maps to, before the proxy (and, for StartPeeredTuned,
// its peering node) is built: settings the config does not carry or bounds from below for a
// deployment, such as the bench's intervals scaled to model time (bench/modeltime.go) or a
// bench-only policy. A nil field changes nothing.
type Tuning struct {
	Proxy   func(*proxy.Options)
	Peering func(*peering.Options)
}

// StartTuned is Start with t applied to the proxy's options (t.Peering is StartPeeredTuned's).
func StartTuned(ctx context.Context, cfg *configs.Config, log *zap.Logger, t Tuning) (*proxy.Serving, error) {
	return start(ctx, cfg, log, t.Proxy)
}

// start is Start; override (if not nil) edits the proxy's options before the proxy is built.
func start(ctx context.Context, cfg *configs.Config, log *zap.Logger, override func(*proxy.Options)) (*proxy.Serving, error) {
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	o, err := ProxyOptions(cfg, log)
	if err == nil && override != nil {
		override(&o)
	}
	var s *proxy.Server
	if err == nil {
		s, err = proxy.New(o)
	}
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	return s.Start(ctx, ln), nil
}
