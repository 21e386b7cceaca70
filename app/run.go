package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/discovery"
)

// ServeCommand is `prefixlb serve`: load the config, apply flag overrides, serve until
// SIGTERM/SIGINT, then drain in-flight streams for timeouts.shutdown_grace. The config file
// is re-read on SIGHUP and when it changes; a bad file is rejected and the old one keeps serving.
func ServeCommand() *cobra.Command {
	var (
		file, mode, listen, adminListen, logLevel, logFormat string
		backends                                             []string
	)
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the load balancer in front of OpenAI-compatible backends",
		Long: `Run the load balancer. Backends come from --config (YAML, see configs/prefixlb.yaml)
and/or --backend flags; flags override the file.`,
		Example: `  prefixlb serve --config configs/prefixlb.yaml
  prefixlb serve --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 --mode prefix`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			load := func() (*configs.Config, error) {
				cfg := &configs.Config{}
				if file != "" {
					data, err := os.ReadFile(file)
					if err != nil {
						return nil, err
					}
					if cfg, err = configs.ParseRaw(data); err != nil {
						return nil, fmt.Errorf("%s: %w", file, err)
					}
				}
				if f.Changed("mode") {
					cfg.Mode = mode
				}
				if f.Changed("listen") {
					cfg.Listen = listen
				}
				if f.Changed("admin-listen") {
					cfg.AdminListen = adminListen
				}
				if f.Changed("log-level") {
					cfg.Log.Level = logLevel
				}
				if f.Changed("log-format") {
					cfg.Log.Format = logFormat
				}
				for i, u := range backends {
					// Named as given on the command line: backends[N] would point into a file
					// that does not have it.
					if _, err := backend.New(u, 0, 1); err != nil {
						return nil, fmt.Errorf("--backend (#%d): %w", i+1, err)
					}
					cfg.Backends = append(cfg.Backends, configs.Backend{URL: u})
				}
				cfg.ApplyDefaults()
				if err := cfg.Validate(); err != nil {
					if file != "" {
						return nil, fmt.Errorf("%s: %w", file, err)
					}
					return nil, err
				}
				return cfg, nil
			}
			cfg, err := load()
			if err != nil {
				return err
			}
			log, err := NewLogger(cfg.Log.Level, cfg.Log.Format)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			var reload func() (*configs.Config, error)
			if file != "" {
				reload = load
			}
			return Run(cmd.Context(), cfg, log, RunOptions{Load: reload, Path: file})
		},
	}
	fl := c.Flags()
	fl.StringVarP(&file, "config", "c", "", "YAML config file")
	fl.StringVar(&mode, "mode", configs.DefaultMode, "routing mode: prefix | round-robin | least-load")
	fl.StringVar(&listen, "listen", configs.DefaultListen, "data listener host:port")
	fl.StringVar(&adminListen, "admin-listen", configs.DefaultAdminListen, "admin listener host:port (metrics, health, debug)")
	fl.StringVar(&logLevel, "log-level", "info", "debug | info | warn | error")
	fl.StringVar(&logFormat, "log-format", "json", "json | console")
	fl.StringArrayVar(&backends, "backend", nil, "backend URL (repeatable; appended to the config's backends)")
	return c
}

// RunOptions are Run's runtime hooks: config reloading, and a callback once listening.
type RunOptions struct {
	// Load returns the new validated config (nil: no reloading).
	Load func() (*configs.Config, error)
	// Path is the file watched for changes (empty: SIGHUP only).
	Path string
	// PollInterval is how often Path's modification time is checked (default 2s).
	PollInterval time.Duration
	// Resolver answers DNS discovery lookups (nil: the system resolver).
	Resolver discovery.Resolver
	// OnReady, if set, is called once both listeners accept.
	OnReady func(s *Server, data, admin net.Addr)
}

// Run serves cfg until ctx is done or SIGTERM/SIGINT arrives, then shuts down gracefully.
// Backends follow config reloads (SIGHUP, file change) and DNS discovery.
func Run(ctx context.Context, cfg *configs.Config, log *zap.Logger, rl RunOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	stamp := fileStamp(rl.Path) // before serving: a change from here on is a reload
	// Signals are taken over before the listeners open: a SIGHUP sent as soon as the port
	// answers (a config tool reacting to readiness) must reload, not kill the process.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sig)
	s, err := New(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	aln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("admin_listen: %w", err)
	}
	defer aln.Close()
	log.Info("prefixlb serving", zap.String("listen", ln.Addr().String()), zap.String("admin_listen", aln.Addr().String()),
		zap.String("mode", cfg.Mode), zap.Int("backends", len(cfg.Backends)))
	if !cfg.Health.Disabled {
		// A backend that never passed a check takes no traffic: check every backend once
		// before serving (bounded by one check's timeout), so that requests arriving right
		// after a start are not refused while the first checks are on their way. Requests
		// that arrive meanwhile wait in the listen backlog.
		wctx, cancel := context.WithTimeout(ctx, cfg.Health.Timeout.D())
		s.Health().CheckOnce(wctx)
		cancel()
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	go func() { _ = s.ServeAdmin(aln) }()
	if rl.OnReady != nil {
		rl.OnReady(s, ln.Addr(), aln.Addr())
	}

	bg, stopBG := context.WithCancel(ctx)
	defer stopBG()
	ctl := &controller{s: s, log: log, cfg: cfg}
	if d := cfg.Discovery.DNS; d != nil {
		go ctl.discover(bg, d, rl.Resolver)
	}

	poll := rl.PollInterval
	if poll <= 0 {
		poll = 2 * time.Second
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctl.shutdown()
		case <-tick.C:
			if rl.Load == nil || rl.Path == "" {
				continue
			}
			if st := fileStamp(rl.Path); st != stamp && st != 0 {
				stamp = st
				ctl.reload(rl.Load, "file changed")
			}
		case got := <-sig:
			if got == syscall.SIGHUP {
				if rl.Load != nil {
					stamp = fileStamp(rl.Path) // the poll must not reload the same content again
					ctl.reload(rl.Load, "SIGHUP")
				}
				continue
			}
			log.Info("shutting down", zap.String("signal", got.String()), zap.Duration("grace", cfg.Timeouts.ShutdownGrace.D()))
			return ctl.shutdown()
		}
	}
}

// controller applies runtime changes (reloads, discovery) to a running Server.
type controller struct {
	s   *Server
	log *zap.Logger

	mu         sync.Mutex
	cfg        *configs.Config   // the config in force
	discovered []configs.Backend // from DNS
}

func (c *controller) reload(load func() (*configs.Config, error), why string) {
	nc, err := load()
	if err != nil {
		c.log.Error("config reload rejected; the previous config keeps serving", zap.String("trigger", why), zap.Error(err))
		return
	}
	c.mu.Lock()
	old := c.cfg
	if nc.Mode != old.Mode || nc.Listen != old.Listen || nc.AdminListen != old.AdminListen || nc.Prefix != old.Prefix ||
		nc.Timeouts != old.Timeouts || nc.MaxRequestBodyBytes != old.MaxRequestBodyBytes ||
		nc.ResponseHeaders.BackendOn() != old.ResponseHeaders.BackendOn() {
		c.log.Warn("config reload: only backends change at runtime; restart to apply listeners, mode, timeouts, prefix, limits and response headers")
	}
	nc.Mode, nc.Listen, nc.AdminListen, nc.Prefix, nc.Timeouts, nc.MaxRequestBodyBytes, nc.ResponseHeaders =
		old.Mode, old.Listen, old.AdminListen, old.Prefix, old.Timeouts, old.MaxRequestBodyBytes, old.ResponseHeaders
	c.cfg = nc
	err = c.applyLocked()
	c.mu.Unlock()
	if err != nil {
		c.log.Error("config reload rejected", zap.Error(err))
		return
	}
	c.log.Info("config reloaded", zap.String("trigger", why), zap.Int("backends", len(c.s.Backends())))
}

func (c *controller) discover(ctx context.Context, d *configs.DNSDiscovery, r discovery.Resolver) {
	dns := &discovery.DNS{Name: d.Name, Port: d.Port, SRV: d.SRV, Scheme: d.Scheme, Interval: d.Interval.D(),
		Timeout: 5 * time.Second, Resolver: r, Log: c.log}
	dns.Run(ctx, func(urls []string) {
		c.mu.Lock()
		c.discovered = c.discovered[:0]
		for _, u := range urls {
			c.discovered = append(c.discovered, configs.Backend{URL: u, KVCacheTokens: d.KVCacheTokens, Weight: 1})
		}
		err := c.applyLocked()
		c.mu.Unlock()
		if err != nil {
			c.log.Error("discovery: backends rejected", zap.Error(err))
			return
		}
		c.log.Info("discovery: backends changed", zap.String("name", d.Name), zap.Strings("urls", urls))
	}, nil) // failures are logged by dns.Run, once per change of state
}

// applyLocked sets the backends to the config's static list plus the discovered ones.
func (c *controller) applyLocked() error {
	specs := append(append([]configs.Backend(nil), c.cfg.Backends...), c.discovered...)
	return c.s.UpdateBackends(specs)
}

func (c *controller) shutdown() error {
	c.mu.Lock()
	grace := c.cfg.Timeouts.ShutdownGrace.D()
	c.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := c.s.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	c.log.Info("stopped")
	return nil
}

// fileStamp identifies a config file's content: a hash of its bytes. (Modification times are
// too coarse: two writes within one kernel tick keep the same mtime.) 0 when unreadable.
func fileStamp(path string) uint64 {
	if path == "" {
		return 0
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return xxhash.Sum64(data)
}

// NewLogger builds the zap logger: level debug|info|warn|error, format json|console.
func NewLogger(level, format string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	zc := zap.NewProductionConfig()
	if format == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true
	} else if format != "json" {
		return nil, fmt.Errorf("log.format: %q is not one of json, console", format)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.DisableStacktrace = true // one line per event; stack traces only for panics
	zc.Sampling = nil
	zc.EncoderConfig.TimeKey = "ts"
	zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return zc.Build()
}
