package app

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/proxy"
)

// aliasBomb is an alias-bomb config: 9 list entries each merging 10 aliases of the one before
// (<<: [*l0, *l0, …]), 10^9 backends' worth in a few hundred bytes, the first with a weight
// that is no number.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nbackends:\n  - &l0 {url: http://127.0.0.1:1, weight: x}\n")
	for i := 1; i <= 9; i++ {
		refs := strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 10), ", ")
		fmt.Fprintf(&b, "  - &l%d {<<: [%s]}\n", i, refs)
	}
	return b.String()
}

// bombLimit bounds the wait for the alias bomb's refusal: a guard against the hang it used
// to cause (the error walker expanded every alias), not a timing.
const bombLimit = 10 * time.Second

// `prefixlb serve` refuses the alias bomb at start with an error naming the field.
func TestServeRefusesAliasBomb(t *testing.T) {
	f := newReloadFile(t)
	f.write(aliasBomb())
	err := serveErr(t, bombLimit, "--config", f.path)
	if err == nil || !strings.Contains(err.Error(), "backends[0].weight") || len(err.Error()) > 400 {
		t.Errorf("serve: %v; want a bounded error naming backends[0].weight", err)
	}
}

// A reload of the alias bomb is rejected with a clear error while the previous config keeps
// serving, and the process still shuts down.
func TestReloadRefusesAliasBomb(t *testing.T) {
	be, _ := testutil.StatusBackend(t, 200, "ok")
	f := newReloadFile(t)
	f.write(reloadConf(be.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 20 * time.Millisecond})
	kept := h.s.Backends()[0]
	f.write(aliasBomb())
	testutil.Eventually(t, bombLimit, "the alias bomb's rejection, naming backends[0].weight", func() bool {
		return reloadRejected(logs, "file changed", "backends[0].weight") > 0
	})
	if got := h.s.Backends(); len(got) != 1 || got[0] != kept {
		t.Errorf("a rejected file changed the backends: %v", got)
	}
	if status := testutil.PostJSON(t, h.base+"/v1/completions", `{"model":"m","prompt":"x"}`); status != 200 {
		t.Errorf("after the rejected reload: status %d", status)
	}
}

// SIGTERM while a reload is still being read and parsed (here a Load that does not return
// until the test ends) shuts the process down: the reload runs off the loop that takes the
// signals, and is dropped.
func TestShutdownDuringSlowReload(t *testing.T) {
	// While a channel is registered for SIGTERM the signal does not terminate the process:
	// registering one here first makes signalling this test binary safe whatever Run does.
	own := make(chan os.Signal, 1)
	signal.Notify(own, syscall.SIGTERM)
	t.Cleanup(func() { signal.Stop(own) })

	be, _ := testutil.StatusBackend(t, 200, "ok")
	f := newReloadFile(t)
	f.write(reloadConf(be.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(func() { close(release) })
	slow := func() (*configs.Config, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		select { // a parse that takes as long as the test
		case <-release:
		case <-time.After(2 * testutil.Timeout):
		}
		return f.load()
	}
	log, logs := testutil.RecordingLogger()
	ready := make(chan *proxy.Server, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), cfg, log, RunOptions{Load: slow, Path: f.path, PollInterval: 20 * time.Millisecond,
			OnReady: func(s *proxy.Server, _, _ net.Addr) { ready <- s }})
	}()
	testutil.RecvWithin(t, ready, testutil.Timeout, "Run listens")
	f.write(reloadConf(be.URL, "http://127.0.0.1:2"))
	testutil.RecvWithin(t, entered, testutil.Timeout, "the file change starts a reload")

	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := testutil.RecvWithin(t, done, testutil.Timeout, "Run returns on SIGTERM during a reload"); err != nil {
		t.Errorf("Run: %v", err)
	}
	if len(logs.WithMessage("shutting down")) != 1 {
		t.Error(`no "shutting down" line for the SIGTERM`)
	}
}
