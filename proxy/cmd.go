package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/prefixlb/prefixlb/configs"
)

// ServeCommand is `prefixlb serve`: load the config, apply flag overrides, serve until
// SIGTERM/SIGINT, then drain in-flight streams for timeouts.shutdown_grace.
func ServeCommand() *cobra.Command {
	var (
		file, mode, listen, logLevel, logFormat string
		backends                                []string
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
			cfg := &configs.Config{}
			if file != "" {
				data, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				cfg, err = configs.ParseRaw(data)
				if err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
			}
			f := cmd.Flags()
			if f.Changed("mode") {
				cfg.Mode = mode
			}
			if f.Changed("listen") {
				cfg.Listen = listen
			}
			if f.Changed("log-level") {
				cfg.Log.Level = logLevel
			}
			if f.Changed("log-format") {
				cfg.Log.Format = logFormat
			}
			for _, u := range backends {
				cfg.Backends = append(cfg.Backends, configs.Backend{URL: u})
			}
			cfg.ApplyDefaults()
			if err := cfg.Validate(); err != nil {
				return err
			}
			log, err := NewLogger(cfg.Log.Level, cfg.Log.Format)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			return Run(cmd.Context(), cfg, log)
		},
	}
	fl := c.Flags()
	fl.StringVarP(&file, "config", "c", "", "YAML config file")
	fl.StringVar(&mode, "mode", configs.DefaultMode, "routing mode: prefix | round-robin | least-load")
	fl.StringVar(&listen, "listen", configs.DefaultListen, "data listener host:port")
	fl.StringVar(&logLevel, "log-level", "info", "debug | info | warn | error")
	fl.StringVar(&logFormat, "log-format", "json", "json | console")
	fl.StringArrayVar(&backends, "backend", nil, "backend URL (repeatable; appended to the config's backends)")
	return c
}

// Run serves cfg until ctx is done or SIGTERM/SIGINT arrives, then shuts down gracefully.
func Run(ctx context.Context, cfg *configs.Config, log *zap.Logger) error {
	s, err := New(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("prefixlb serving", zap.String("listen", ln.Addr().String()), zap.String("mode", cfg.Mode),
		zap.Int("backends", len(cfg.Backends)))
	aln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("admin_listen: %w", err)
	}
	defer aln.Close()
	log.Info("admin listening", zap.String("admin_listen", aln.Addr().String()))
	errc := make(chan error, 2)
	go func() { errc <- s.Serve(ln) }()
	go func() { _ = s.ServeAdmin(aln) }()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	if ctx == nil {
		ctx = context.Background()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	case got := <-sig:
		log.Info("shutting down", zap.String("signal", got.String()), zap.Duration("grace", cfg.Timeouts.ShutdownGrace.D()))
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Timeouts.ShutdownGrace.D())
	defer cancel()
	if err := s.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	log.Info("stopped")
	return nil
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
	zc.Sampling = nil
	zc.EncoderConfig.TimeKey = "ts"
	zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return zc.Build()
}
