package discovery

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

const (
	msgFailed    = "discovery: resolution failed; keeping the previous backends"
	msgStill     = "discovery: resolution still failing"
	msgRecovered = "discovery: resolution recovered"
)

// stateWait bounds each wait for Run (resolving every 2 ms) to reach a state.
const stateWait = 10 * time.Second

// waitFor polls cond every millisecond and fails the test with what if it does not hold
// within stateWait.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, stateWait, what, cond)
}

// A name that keeps failing logs one warning, not one per interval; the first success after
// failures logs one info line; a new failure after that warns again.
func TestRunLogsChangesOfState(t *testing.T) {
	log, logs := testutil.RecordingLogger()
	r := &fakeResolver{hosts: []string{"10.0.0.1"}}
	d := DNS{Name: "vllm", Port: 8000, Interval: 2 * time.Millisecond, Resolver: r, Log: log}
	calls := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.calls
	}
	count := func(msg string, lvl zapcore.Level) int {
		n := 0
		for _, e := range logs.WithMessage(msg) {
			if e.Level == lvl {
				n++
			}
		}
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx, func([]string) {}, nil)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(stateWait):
			t.Error("Run did not stop")
		}
	}()

	waitFor(t, "the first resolution", func() bool { return calls() >= 1 })
	r.set(nil, errors.New("SERVFAIL"))
	from := calls()
	waitFor(t, "20 failed resolutions", func() bool { return calls() >= from+20 })
	if n := count(msgFailed, zapcore.WarnLevel); n != 1 {
		t.Fatalf("20 failures in a row: %d warnings, want 1", n)
	}
	if n := count(msgStill, zapcore.DebugLevel); n < 10 {
		t.Errorf("repeated failures: %d debug lines, want one per failure after the first", n)
	}

	r.set([]string{"10.0.0.1"}, nil)
	waitFor(t, "the recovery is logged", func() bool { return count(msgRecovered, zapcore.InfoLevel) >= 1 })
	from = calls()
	waitFor(t, "10 good resolutions", func() bool { return calls() >= from+10 })
	if n := count(msgRecovered, zapcore.InfoLevel); n != 1 {
		t.Fatalf("after recovery: %d recovery lines, want 1", n)
	}
	e := logs.WithMessage(msgRecovered)[0]
	if f, ok := e.Fields["failures"].(int64); !ok || f < 20 {
		t.Errorf("recovery line: failures = %v, want the ≥ 20 failures it ends", e.Fields["failures"])
	}

	r.set(nil, errors.New("SERVFAIL"))
	waitFor(t, "a new failure warns again", func() bool { return count(msgFailed, zapcore.WarnLevel) == 2 })
}
