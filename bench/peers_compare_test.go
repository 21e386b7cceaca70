package bench

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/peers"
	"github.com/prefixlb/prefixlb/configs"
)

// TestComparePeers runs a tiny multi-turn workload through fresh sims and an in-process
// prefixlb under each bench-only peer policy. It checks counts and labels only, never timings.
func TestComparePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and proxies")
	}
	var stdout, stderr bytes.Buffer
	o := DefaultOptions()
	o.Out, o.Speedup, o.Quiet = "", 50, true
	o.AllowBursts = true // 50×: counts, not latencies
	o.Modes = peers.Names()
	o.Stdout, o.Stderr = &stdout, &stderr
	o.Flags = WorkloadFlags{Conversations: 4, Turns: 3, DocTokens: 300, OutputTokens: 8, Users: 2,
		ThinkMin: time.Millisecond, ThinkMax: 5 * time.Millisecond, thinkSet: true}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Compare(ctx, o)
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, stderr.String())
	}
	if len(rep.Modes) != len(o.Modes) {
		t.Fatalf("%d modes, want %d", len(rep.Modes), len(o.Modes))
	}
	for i, want := range o.Modes {
		m := rep.Modes[i]
		if m.Mode != want || m.Requests != 12 || m.Errors != 0 || m.TTFT.Count != 12 {
			t.Fatalf("mode %d: %q, %d requests, %d errors %v, %d TTFTs; want %q, 12, 0, 12", i, m.Mode, m.Requests, m.Errors,
				m.ErrorReasons, m.TTFT.Count, want)
		}
		if !strings.Contains(stdout.String(), "| "+want+" |") {
			t.Fatalf("table lacks %s:\n%s", want, stdout.String())
		}
	}
	// A peer's own goroutines (llm-d-default's metrics scrapes) end with its arm.
	buf := make([]byte, 1<<22)
	if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "bench/peers.(*scraper).run") {
		t.Fatalf("a peer's scraper still runs after the compare:\n%s", st)
	}
}

// TestPeersAreBenchOnly: --modes names the peers when it refuses a mode, and a config for
// `prefixlb serve` cannot select one.
func TestPeersAreBenchOnly(t *testing.T) {
	o := DefaultOptions()
	o.Modes, o.Quiet, o.Out = []string{"nope"}, true, ""
	var sink bytes.Buffer
	o.Stdout, o.Stderr = &sink, &sink
	o.Flags = WorkloadFlags{Conversations: 1, Turns: 1, Users: 1}
	_, err := Compare(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "sglang") {
		t.Fatalf("unknown mode: %v, want an error naming the peers", err)
	}
	for _, name := range peers.Names() {
		_, err := configs.Parse([]byte("mode: " + name + "\nbackends:\n  - url: http://127.0.0.1:1\n"))
		if err == nil || !strings.Contains(err.Error(), "mode") {
			t.Errorf("a serve config with mode %s: %v, want refused", name, err)
		}
	}
}
