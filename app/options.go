package app

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/tracing"
)

// ProxyOptions maps a validated config onto the proxy's options: the policy of cfg.Mode with
// the prefix section, the static backends, the health section, timeouts, limits and
// response headers. Listeners, logging, shutdown grace and discovery are Run's.
func ProxyOptions(cfg *configs.Config, log *zap.Logger) (proxy.Options, error) {
	pol, err := newPolicy(cfg)
	if err != nil {
		return proxy.Options{}, err
	}
	bs, err := newBackends(cfg.Backends)
	if err != nil {
		return proxy.Options{}, err
	}
	fc, err := flowControlOptions(&cfg.FlowControl)
	if err != nil {
		return proxy.Options{}, err
	}
	t := cfg.Timeouts
	return proxy.Options{
		FlowControl:          fc,
		Mode:                 cfg.Mode,
		Policy:               pol,
		Backends:             bs,
		ChunkTokens:          cfg.Prefix.ChunkTokens,
		DefaultKVCacheTokens: cfg.Prefix.DefaultKVCacheTokens,
		Health:               healthOptions(cfg.Health),
		Timeouts: proxy.Timeouts{Connect: t.Connect.D(), ResponseHeader: t.ResponseHeader.D(), Idle: t.Idle.D(),
			ClientRead: t.ClientRead.D(), ClientWrite: t.ClientWrite.D(), ClientBodyIdle: t.ClientBodyIdle.D()},
		MaxRequestBodyBytes:  cfg.MaxRequestBodyBytes,
		MaxBufferedBodyBytes: cfg.Limits.MaxBufferedBodyBytes,
		OmitBackendHeader:    !cfg.ResponseHeaders.BackendOn(),
		Log:                  log,
		Tracing:              tracingOptions(cfg.Tracing),
	}, nil
}

// flowControlOptions are the proxy's flow-control options of a validated flow_control
// section, its rules compiled into the classifier.
func flowControlOptions(f *configs.FlowControl) (proxy.FlowControl, error) {
	cl, err := flowcontrol.NewClassifier(f.ClassifierConfig())
	if err != nil {
		return proxy.FlowControl{}, fmt.Errorf("flow_control.%w", err)
	}
	return proxy.FlowControl{Enabled: f.Enabled, MaxQueueWait: f.MaxQueueWait.D(), Queue: f.QueueConfig(),
		PrefillSaturation: f.PrefillSaturationOption(), ReservePrefill: f.ReservePrefillOption(), Classifier: classifier{cl}}, nil
}

// classifier is a flowcontrol.Classifier as the proxy asks it (proxy.Classifier): for a
// request it queues, or charges after it went straight through.
type classifier struct{ c *flowcontrol.Classifier }

func (c classifier) Classify(path string, model []byte, h proxy.RequestHeaders) (priority int, flow string, ignored flowcontrol.Ignored) {
	cl := c.c.Classify(flowcontrol.Request{Path: path, Model: string(model), Headers: h})
	return cl.Priority, cl.Flow, cl.Ignored
}

// tracingOptions are the proxy's tracing options of the tracing section: nil when it is off.
func tracingOptions(t configs.Tracing) *tracing.Options {
	if !t.Enabled {
		return nil
	}
	o := t.Options()
	return &o
}

// newServer builds the proxy of a validated config.
func newServer(cfg *configs.Config, log *zap.Logger) (*proxy.Server, error) {
	o, err := ProxyOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	return proxy.New(o)
}

// newPolicy returns the policy of cfg.Mode from router's table of modes, wrapped in the
// shadow of cfg.Shadow when set.
func newPolicy(cfg *configs.Config) (router.Policy, error) {
	o := router.PolicyOptions{Prefix: cfg.PrefixOptions()}
	pol, err := router.NewPolicy(cfg.Mode, o)
	if err != nil {
		return nil, fmt.Errorf("mode: %w", err)
	}
	if cfg.Shadow != "" {
		if pol, err = router.NewShadow(cfg.Shadow, cfg.Mode, pol, o); err != nil {
			return nil, fmt.Errorf("shadow: %w", err)
		}
	}
	return pol, nil
}

// healthOptions maps the health section of the config onto the health package's options.
func healthOptions(h configs.Health) health.Options {
	o := health.Options{
		Path: h.Path, Interval: h.Interval.D(), Timeout: h.Timeout.D(), Rise: h.HealthyThreshold,
		Fall: h.UnhealthyThreshold, Disabled: h.Disabled, ConsecutiveFailures: h.ConsecutiveFailures,
		BaseEjection: h.BaseEjection.D(), MaxEjection: h.MaxEjection.D(), MaxEjectedPercent: h.MaxEjectedPercent,
		ScrapeInterval: h.ScrapeInterval.D(), MetricsPath: h.MetricsPath, ScrapeStaleAfter: h.ScrapeStaleAfter.D(),
		ModelsInterval: h.ModelsInterval.D(), ModelsPath: h.ModelsPath,
	}
	if h.ScrapeDisabled {
		o.ScrapeInterval = 0
	}
	if h.ModelsDisabled {
		o.ModelsInterval = -1
	}
	return o
}

// newBackends builds the runtime backends of specs; an error names the spec by its index, as
// backends[i] of the config.
func newBackends(specs []configs.Backend) ([]*backend.Backend, error) {
	out := make([]*backend.Backend, 0, len(specs))
	for i, sp := range specs {
		b, err := backend.New(sp.URL, sp.KVCacheTokens, sp.Weight)
		if err != nil {
			return nil, fmt.Errorf("backends[%d].url: %w", i, err)
		}
		b.SetConfiguredModels(sp.Models)
		b.SetMaxConcurrency(sp.MaxConcurrency)
		out = append(out, b)
	}
	return out, nil
}
