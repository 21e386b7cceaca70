package app

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// failingResolver fails every lookup while failing is set, and answers 127.0.0.1 otherwise.
type failingResolver struct {
	failing atomic.Bool
	calls   atomic.Int64
}

func (r *failingResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	r.calls.Add(1)
	if r.failing.Load() {
		return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
	}
	return []string{"127.0.0.1"}, nil
}

func (r *failingResolver) LookupSRV(ctx context.Context, _, _, name string) (string, []*net.SRV, error) {
	return "", nil, errors.New("no SRV")
}

// A headless Service name that fails to resolve is logged when it starts failing (warn) and
// when it recovers (info), not at every interval: an outage of the cluster DNS must not bury
// the log in one warning per 10 s per prefixlb replica.
func TestDiscoveryFailureLoggedOnce(t *testing.T) {
	const msgFailed = "discovery: resolution failed; keeping the previous backends"
	const msgRecovered = "discovery: resolution recovered"
	cfg, err := configs.Parse([]byte("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nhealth:\n  disabled: true\n  scrape_disabled: true\n" +
		"discovery:\n  dns:\n    name: vllm.test.svc\n    port: 8000\n    interval: 100ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	r := &failingResolver{}
	r.failing.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, log, RunOptions{Resolver: r}) }()
	t.Cleanup(func() {
		cancel()
		testutil.RecvWithin(t, done, testutil.Timeout, "Run returns after its context is cancelled")
	})
	testutil.Eventually(t, testutil.Timeout, "8 failed resolutions", func() bool { return r.calls.Load() >= 8 })
	if n := len(logs.WithMessage(msgFailed)); n != 1 {
		t.Fatalf("%d failed resolutions: %d warnings, want 1", r.calls.Load(), n)
	}
	r.failing.Store(false)
	testutil.Eventually(t, testutil.Timeout, "the recovery is logged", func() bool { return len(logs.WithMessage(msgRecovered)) == 1 })
	from := r.calls.Load()
	testutil.Eventually(t, testutil.Timeout, "3 more resolutions", func() bool { return r.calls.Load() >= from+3 })
	if n, m := len(logs.WithMessage(msgFailed)), len(logs.WithMessage(msgRecovered)); n != 1 || m != 1 {
		t.Errorf("after recovery: %d warnings, %d recovery lines; want 1, 1", n, m)
	}
}
