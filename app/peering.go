package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/discovery"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
)

// newPeering builds the peering node of cfg.Peering around o's prefix policy and routes o
// with the node's policy in its place; nil without a peering section. It binds the peer port
// but joins nobody until Start. tune (if not nil) edits the node's options before it is built.
func newPeering(cfg *configs.Config, o *proxy.Options, log *zap.Logger, r discovery.Resolver, tune func(*peering.Options)) (*peering.Node, error) {
	p := cfg.Peering
	if p == nil {
		return nil, nil
	}
	pre, ok := o.Policy.(*router.Prefix)
	if !ok {
		return nil, errors.New("peering: needs mode prefix")
	}
	secret, err := peeringSecret(p)
	if err != nil {
		return nil, err
	}
	po := peering.Options{Listen: p.Listen, Advertise: p.Advertise, Join: p.Join, DNS: p.DNS,
		Secret: secret, SettleWait: p.SettleWaitOption(), Resolver: r, Log: log.Named("peering")}
	if tune != nil {
		tune(&po)
	}
	n, err := peering.New(po, pre)
	if err != nil {
		return nil, err
	}
	o.Policy = n.Policy()
	return n, nil
}

// peeringSecret reads the shared secret from peering.secret_file or peering.secret_env.
func peeringSecret(p *configs.Peering) ([]byte, error) {
	var data []byte
	if p.SecretFile != "" {
		b, err := os.ReadFile(p.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("peering.secret_file: %w", err)
		}
		data = b
	} else {
		v, ok := os.LookupEnv(p.SecretEnv)
		if !ok {
			return nil, fmt.Errorf("peering.secret_env: %s is not set", p.SecretEnv)
		}
		data = []byte(v)
	}
	k, err := peering.ParseSecret(data)
	if err != nil {
		field := "peering.secret_file"
		if p.SecretFile == "" {
			field = "peering.secret_env"
		}
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return k, nil
}

// newPeeredServer is newServer with cfg's peering (if any): the node routes the proxy's
// prefix policy, holds /readyz back until its starting snapshot, and adds its metrics. t
// edits the proxy's options, then the node's (Tuning; the zero value changes nothing).
func newPeeredServer(cfg *configs.Config, log *zap.Logger, r discovery.Resolver, t Tuning) (*proxy.Server, *peering.Node, error) {
	o, err := ProxyOptions(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	if t.Proxy != nil {
		t.Proxy(&o)
	}
	node, err := newPeering(cfg, &o, log, r, t.Peering)
	if err != nil {
		return nil, nil, err
	}
	s, err := proxy.New(o)
	if err != nil {
		if node != nil {
			_ = node.Close()
		}
		return nil, nil, err
	}
	if node != nil {
		s.SetReadyGate(node.Ready)
		s.AddMetrics(node.WriteMetrics)
	}
	return s, node, nil
}

// StartPeered is Start for a config with a peering section: the in-process proxy routes as
// one with its peers. The node is started (joining cfg.Peering's peers); stop the Serving,
// then Close the node. Without a peering section it is an error.
func StartPeered(ctx context.Context, cfg *configs.Config, log *zap.Logger) (*proxy.Serving, *peering.Node, error) {
	return StartPeeredTuned(ctx, cfg, log, Tuning{})
}

// StartPeeredTuned is StartPeered with t applied to the proxy's options, then the node's.
func StartPeeredTuned(ctx context.Context, cfg *configs.Config, log *zap.Logger, t Tuning) (*proxy.Serving, *peering.Node, error) {
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if cfg.Peering == nil {
		return nil, nil, errors.New("StartPeered: the config has no peering section")
	}
	s, node, err := newPeeredServer(cfg, log, nil, t)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = node.Close()
		return nil, nil, fmt.Errorf("listen: %w", err)
	}
	node.Start(ctx)
	return s.Start(ctx, ln), node, nil
}

// peeringChanged reports whether a reload changes the peering section (turned on or off, or
// any field, fields added later included): the node binds its port and joins at start, so
// such a change needs a restart.
func peeringChanged(old, nc *configs.Peering) bool {
	return !reflect.DeepEqual(old, nc)
}
