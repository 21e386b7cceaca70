package app

// Scaffolding of the wiring tests; the generic helpers are internal/testutil's.

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/proxy"
)

// runHandle is a Run started by startRun.
type runHandle struct {
	s     *proxy.Server
	base  string // data listener, http://host:port
	admin string // admin listener, http://host:port
}

// startRun runs Run(cfg, log, opts) until the test ends: it waits (bounded) until both
// listeners accept, and in t.Cleanup cancels Run's context and waits (bounded) for Run to
// return, failing the test if it returns an error. opts.OnReady, if set, is still called.
// Cleanups registered after startRun (load generators) run before Run is stopped.
func startRun(t *testing.T, cfg *configs.Config, log *zap.Logger, opts RunOptions) *runHandle {
	t.Helper()
	if log == nil {
		log = zap.NewNop()
	}
	type ready struct {
		s           *proxy.Server
		data, admin net.Addr
	}
	rc := make(chan ready, 1)
	user := opts.OnReady
	opts.OnReady = func(s *proxy.Server, data, admin net.Addr) {
		if user != nil {
			user(s, data, admin)
		}
		rc <- ready{s, data, admin}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, log, opts) }()
	var r ready
	select {
	case r = <-rc:
	case err := <-done:
		cancel()
		t.Fatalf("Run returned before listening: %v", err)
	case <-time.After(testutil.Timeout):
		cancel()
		t.Fatalf("Run not listening within %v", testutil.Timeout)
	}
	t.Cleanup(func() {
		cancel()
		if err := testutil.RecvWithin(t, done, testutil.Timeout, "Run returns once its context is cancelled"); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &runHandle{s: r.s, base: "http://" + r.data.String(), admin: "http://" + r.admin.String()}
}

// startConfig starts cfg's proxy with Start (defaults applied, validated) until the test
// ends.
func startConfig(t *testing.T, cfg *configs.Config) *proxy.Serving {
	t.Helper()
	sv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		defer cancel()
		if err := sv.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return sv
}

// serveErr runs `prefixlb serve` with args and returns its error; a serve still running after
// limit is stopped and fails the test, since the callers expect a refusal.
func serveErr(t *testing.T, limit time.Duration, args ...string) error {
	t.Helper()
	cmd := ServeCommand()
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		cancel()
		<-done
		t.Fatalf("serve %q still serving after %v; want it refused", args, limit)
		return nil
	}
}
