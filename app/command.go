package app

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/router"
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
					data, err := readConfigFile(file)
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
	fl.StringVar(&mode, "mode", configs.DefaultMode, "routing mode: "+strings.Join(router.ModeNames(), " | "))
	fl.StringVar(&listen, "listen", configs.DefaultListen, "data listener host:port")
	fl.StringVar(&adminListen, "admin-listen", configs.DefaultAdminListen, "admin listener host:port (metrics, health, debug)")
	fl.StringVar(&logLevel, "log-level", "info", "debug | info | warn | error")
	fl.StringVar(&logFormat, "log-format", "json", "json | console")
	fl.StringArrayVar(&backends, "backend", nil, "backend URL (repeatable; appended to the config's backends)")
	return c
}
