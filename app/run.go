// Package app is prefixlb's composition root: it turns the configuration into the options of
// the libraries below it (proxy, health, router, discovery), starts them, and applies what
// changes at runtime (config reloads, DNS discovery). main.go calls it; the bench starts an
// in-process proxy through Start.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"reflect"
	"sync"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/discovery"
	"github.com/prefixlb/prefixlb/internal/fdlimit"
	"github.com/prefixlb/prefixlb/proxy"
)

// RunOptions are Run's runtime hooks: config reloading, and a callback once listening.
type RunOptions struct {
	// Load returns the new validated config (nil: no reloading).
	Load func() (*configs.Config, error)
	// Path is the file watched for changes (empty: SIGHUP only).
	Path string
	// PollInterval is how often Path is read for a change of content (0: defaultPollInterval).
	PollInterval time.Duration
	// Resolver answers DNS discovery lookups (nil: the system resolver).
	Resolver discovery.Resolver
	// OnReady, if set, is called once both listeners accept.
	OnReady func(s *proxy.Server, data, admin net.Addr)
}

// defaultPollInterval is how often the config file is read for changes: a ConfigMap update
// lands within a couple of seconds of the kubelet writing it.
const defaultPollInterval = 2 * time.Second

// dnsTimeout bounds one DNS discovery lookup.
const dnsTimeout = 5 * time.Second

// Run serves cfg (validated) until ctx is done or SIGTERM/SIGINT arrives, then shuts down
// gracefully. Backends follow config reloads (SIGHUP, file change) and DNS discovery. A
// reload reads and parses the file off the loop that watches for signals, so that a slow
// one never delays a shutdown; a reload still running then is dropped.
func Run(ctx context.Context, cfg *configs.Config, log *zap.Logger, rl RunOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	stamp := fileStamp(rl.Path) // before serving: a change from here on is a reload
	raiseFDLimit(log)
	// Signals are taken over before the listeners open: a SIGHUP sent as soon as the port
	// answers (a config tool reacting to readiness) must reload, not kill the process.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sig)
	s, node, err := newPeeredServer(cfg, log, rl.Resolver, Tuning{})
	if err != nil {
		return err
	}
	if node != nil {
		defer node.Close() // after the drain: peers count this replica's last requests
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
	sv := s.Start(ctx, ln)
	go func() { _ = s.ServeAdmin(s.AdminListener(aln)) }()
	if rl.OnReady != nil {
		rl.OnReady(s, ln.Addr(), aln.Addr())
	}

	bg, stopBG := context.WithCancel(ctx)
	defer stopBG()
	if node != nil {
		node.Start(bg) // /readyz waits for its snapshot
	}
	ctl := &controller{sv: sv, log: log, cfg: cfg}
	if d := cfg.Discovery.DNS; d != nil {
		go ctl.discover(bg, d, rl.Resolver)
	}
	reloads := make(chan string, 1) // the trigger of the next reload; one waits at most
	if rl.Load != nil {
		go ctl.reloader(bg, rl.Load, reloads)
	}

	poll := rl.PollInterval
	if poll <= 0 {
		poll = defaultPollInterval
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		select {
		case <-sv.Done():
			return sv.Err()
		case <-ctx.Done():
			return ctl.shutdown()
		case <-tick.C:
			if rl.Load == nil || rl.Path == "" {
				continue
			}
			if st := fileStamp(rl.Path); st != stamp && st != 0 {
				stamp = st
				requestReload(reloads, "file changed")
			}
		case got := <-sig:
			if got == syscall.SIGHUP {
				if rl.Load != nil {
					stamp = fileStamp(rl.Path) // the poll must not reload the same content again
					requestReload(reloads, "SIGHUP")
				}
				continue
			}
			log.Info("shutting down", zap.String("signal", got.String()), zap.Duration("grace", cfg.Timeouts.ShutdownGrace.D()))
			return ctl.shutdown()
		}
	}
}

// requestReload asks the reloader for a reload triggered by why, unless one is already
// waiting: that one reads the file afresh too.
func requestReload(reloads chan<- string, why string) {
	select {
	case reloads <- why:
	default:
	}
}

// logFDLimit is the message of the line that states the open-file limit at start.
const logFDLimit = "file-descriptor limit"

// raiseFDLimit raises the soft open-file limit to the hard limit, as Envoy and HAProxy do at
// start, and logs the limit in force once: every stream holds two descriptors, and the data
// path keeps a reserve of them for the admin port, health checks and peering (proxy's
// descriptor budget, sized from this limit when the proxy is built).
func raiseFDLimit(log *zap.Logger) {
	before, after, err := fdlimit.Raise()
	switch {
	case after.Unknown:
		return
	case err != nil:
		log.Warn(logFDLimit+": could not raise the soft limit to the hard limit",
			zap.Uint64("soft", after.Soft), zap.Uint64("hard", after.Hard), zap.Error(err))
	default:
		data, clients, reserve := proxy.DescriptorBudget(after.Soft)
		log.Info(logFDLimit, zap.Uint64("soft", after.Soft), zap.Uint64("hard", after.Hard),
			zap.Uint64("soft_before", before.Soft), zap.Bool("raised", after.Soft > before.Soft),
			zap.Int64("data_path_max", data), zap.Int64("clients_max", clients), zap.Int64("reserve", reserve))
	}
}

// controller applies runtime changes (reloads, discovery) to a running Server.
type controller struct {
	sv  *proxy.Serving
	log *zap.Logger

	mu         sync.Mutex
	cfg        *configs.Config   // the config in force
	discovered []configs.Backend // from DNS
	stopped    bool              // shutdown began: nothing more is applied
}

// reloader runs the reloads asked for on reloads, one at a time, until ctx is done.
func (c *controller) reloader(ctx context.Context, load func() (*configs.Config, error), reloads <-chan string) {
	for {
		select {
		case <-ctx.Done():
			return
		case why := <-reloads:
			c.reload(load, why)
		}
	}
}

func (c *controller) reload(load func() (*configs.Config, error), why string) {
	nc, err := load()
	if err != nil {
		c.log.Error("config reload rejected; the previous config keeps serving", zap.String("trigger", why), zap.Error(err))
		return
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		c.log.Info("config reload dropped: shutting down", zap.String("trigger", why))
		return
	}
	old := c.cfg
	if nc.Mode != old.Mode || nc.Shadow != old.Shadow || nc.Listen != old.Listen || nc.AdminListen != old.AdminListen || nc.Prefix != old.Prefix ||
		nc.Timeouts != old.Timeouts || nc.MaxRequestBodyBytes != old.MaxRequestBodyBytes || nc.Limits != old.Limits || nc.Log != old.Log ||
		nc.ResponseHeaders.BackendOn() != old.ResponseHeaders.BackendOn() {
		c.log.Warn("config reload: only backends change at runtime; restart to apply listeners, mode, shadow, timeouts, prefix, limits, log and response headers")
	}
	if !reflect.DeepEqual(old.Tracing, nc.Tracing) {
		c.log.Warn("config reload: tracing changes need a restart; the running tracing settings stay", zap.String("field", "tracing"))
	}
	if peeringChanged(old.Peering, nc.Peering) {
		c.log.Warn("config reload: peering changes need a restart; the running peering settings stay", zap.String("field", "peering"))
	}
	if changed := healthChanged(old.Health, nc.Health); len(changed) > 0 {
		c.log.Warn("config reload: health changes need a restart; the running health settings stay", zap.Strings("fields", changed))
	}
	if changed := discoveryChanged(old.Discovery, nc.Discovery); len(changed) > 0 {
		c.log.Warn("config reload: discovery changes need a restart; the running discovery settings stay", zap.Strings("fields", changed))
	}
	nc.Shadow, nc.Health, nc.Discovery, nc.Limits, nc.Log, nc.Tracing = old.Shadow, old.Health, old.Discovery, old.Limits, old.Log, old.Tracing
	nc.Mode, nc.Listen, nc.AdminListen, nc.Prefix, nc.Timeouts, nc.MaxRequestBodyBytes, nc.ResponseHeaders, nc.Peering =
		old.Mode, old.Listen, old.AdminListen, old.Prefix, old.Timeouts, old.MaxRequestBodyBytes, old.ResponseHeaders, old.Peering
	c.cfg = nc
	err = c.applyLocked()
	if err == nil {
		var fc proxy.FlowControl
		if fc, err = flowControlOptions(&nc.FlowControl); err == nil {
			c.sv.SetFlowControl(fc) // the queues and what they hold stay; their bounds change
		}
	}
	c.mu.Unlock()
	if err != nil {
		c.log.Error("config reload rejected", zap.Error(err))
		return
	}
	c.log.Info("config reloaded", zap.String("trigger", why), zap.Int("backends", len(c.sv.Backends())))
}

func (c *controller) discover(ctx context.Context, d *configs.DNSDiscovery, r discovery.Resolver) {
	dns := &discovery.DNS{Name: d.Name, Port: d.Port, SRV: d.SRV, Scheme: d.Scheme, Interval: d.Interval.D(),
		Timeout: dnsTimeout, Resolver: r, Log: c.log}
	dns.Run(ctx, func(urls []string) {
		c.mu.Lock()
		if c.stopped {
			c.mu.Unlock()
			return
		}
		c.discovered = c.discovered[:0]
		for _, u := range urls {
			c.discovered = append(c.discovered, configs.Backend{URL: u, KVCacheTokens: d.KVCacheTokens, Weight: backend.DefaultWeight})
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
	bs, err := newBackends(append(append([]configs.Backend(nil), c.cfg.Backends...), c.discovered...))
	if err != nil {
		return err
	}
	c.sv.UpdateBackends(bs)
	return nil
}

// shutdown stops the server, letting in-flight streams finish within the grace. It does not
// wait for a reload being read (a reload that ends later applies nothing), only for one
// being applied, which takes milliseconds.
func (c *controller) shutdown() error {
	c.mu.Lock()
	c.stopped = true
	grace := c.cfg.Timeouts.ShutdownGrace.D() // a reload keeps the timeouts in force
	c.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := c.sv.Stop(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	c.log.Info("stopped")
	return nil
}

// maxConfigBytes bounds a config file, bytes: a real one is a few KiB; a larger file (a log
// or a device named by mistake) is refused rather than read whole, at start and on reload.
const maxConfigBytes = 16 << 20

// readConfigFile reads the config file at path, at most maxConfigBytes of it.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s: config file over %d MiB", path, maxConfigBytes>>20)
	}
	return data, nil
}

// fileStamp identifies a config file's content: a hash of its first maxConfigBytes bytes and
// its size. (Modification times are too coarse: two writes within one kernel tick keep the
// same mtime.) 0 when unreadable or not a regular file. It runs on the loop that takes the
// signals, so it never waits: a named pipe or a device at the path is opened without
// blocking and not read, and a huge file is not read whole.
func fileStamp(path string) uint64 {
	if path == "" {
		return 0
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return 0
	}
	h := xxhash.New()
	if _, err := io.Copy(h, io.LimitReader(f, maxConfigBytes)); err != nil {
		return 0
	}
	_, _ = fmt.Fprintf(h, "\x00%d", st.Size())
	return h.Sum64()
}
