package suite

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/workload"
)

func TestCombine(t *testing.T) {
	round := func(p95, cached, share float64, f func(*report.Mode)) Arm {
		m := mode(p95)
		m.CachedTokenRatio, m.MaxShareOverMean, m.RequestsDigest = cached, share, "d1"
		m.BackendShare = map[string]float64{"r": p95} // marks which round is the representative
		m.TTFT.Count = int64(p95)
		if f != nil {
			f(m)
		}
		return Arm{Policy: "prefix", Mode: m, WallS: 2}
	}
	cases := []struct {
		name   string
		rounds []Arm
		// want: the median figures, the representative round's p95 (BackendShare), flags
		// and error.
		p95, p99, cached, share, repr float64
		errors                        int
		flags                         []string
		err                           string
	}{
		{name: "one round as it is", rounds: []Arm{round(10, 0.5, 1.2, nil)},
			p95: 10, p99: 20, cached: 0.5, share: 1.2, repr: 10},
		{name: "odd: each figure its own median", rounds: []Arm{round(30, 0.9, 1.1, nil), round(10, 0.7, 1.5, nil), round(20, 0.8, 1.3, nil)},
			p95: 20, p99: 40, cached: 0.8, share: 1.3, repr: 20},
		{name: "figures from different rounds", rounds: []Arm{round(10, 0.9, 1.5, nil), round(20, 0.8, 1.1, nil), round(30, 0.7, 1.3, nil)},
			p95: 20, p99: 40, cached: 0.8, share: 1.3, repr: 20},
		{name: "even: mean of the middle two, lower middle represents", rounds: []Arm{round(10, 0.5, 1, nil), round(40, 0.5, 1, nil), round(20, 0.5, 1, nil), round(30, 0.5, 1, nil)},
			p95: 25, p99: 50, cached: 0.5, share: 1, repr: 20},
		{name: "a round with errors flags the arm", rounds: []Arm{round(10, 0.5, 1, nil), round(20, 0.5, 1, func(m *report.Mode) { m.Errors, m.Flags = 3, []string{"3 errors"} }), round(30, 0.5, 1, nil)},
			p95: 20, p99: 40, cached: 0.5, share: 1, repr: 20, errors: 3, flags: []string{"round 2: 3 errors"}},
		{name: "a round where every request failed is out of the medians", rounds: []Arm{round(10, 0.5, 1, nil), round(0, 0, 0, func(m *report.Mode) { m.Errors = m.Requests }), round(30, 0.7, 1.2, nil)},
			p95: 20, p99: 40, cached: 0.6, share: 1.1, repr: 10, errors: 100},
		{name: "a round that sent fewer requests", rounds: []Arm{round(10, 0.5, 1, nil), round(20, 0.5, 1, func(m *report.Mode) { m.Requests = 99 }), round(30, 0.5, 1, nil)},
			p95: 20, p99: 40, cached: 0.5, share: 1, repr: 20, flags: []string{"rounds sent different requests"}},
		{name: "a round without a report", rounds: []Arm{round(10, 0.5, 1, nil), {Policy: "prefix"}, round(30, 0.5, 1, nil)},
			p95: 20, p99: 40, cached: 0.5, share: 1, repr: 10, err: "round 2: no report"},
		{name: "other requests in a round", rounds: []Arm{round(10, 0.5, 1, nil), round(20, 0.5, 1, func(m *report.Mode) { m.RequestsDigest = "d2" }), round(30, 0.5, 1, nil)},
			p95: 20, p99: 40, cached: 0.5, share: 1, repr: 20, flags: []string{"rounds sent different requests"}},
		{name: "a failed round is named", rounds: []Arm{round(10, 0.5, 1, nil), {Policy: "prefix", Error: "sims did not start"}, round(30, 0.5, 1, nil)},
			p95: 20, p99: 40, cached: 0.5, share: 1, repr: 10, err: "round 2: sims did not start"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := Combine("prefix", tc.rounds)
			if a.Mode == nil {
				t.Fatalf("no mode: %+v", a)
			}
			m := a.Mode
			if m.TTFT.P95 != tc.p95 || m.TTFT.P99 != tc.p99 || m.CachedTokenRatio != tc.cached || m.MaxShareOverMean != tc.share {
				t.Errorf("p95 %g p99 %g cached %g share %g, want %g %g %g %g", m.TTFT.P95, m.TTFT.P99, m.CachedTokenRatio, m.MaxShareOverMean,
					tc.p95, tc.p99, tc.cached, tc.share)
			}
			if m.BackendShare["r"] != tc.repr {
				t.Errorf("representative round p95 %g, want %g", m.BackendShare["r"], tc.repr)
			}
			if m.Errors != tc.errors || !slices.Equal(m.Flags, tc.flags) || a.Error != tc.err {
				t.Errorf("errors %d flags %v error %q, want %d %v %q", m.Errors, m.Flags, a.Error, tc.errors, tc.flags, tc.err)
			}
			if n := len(tc.rounds); n > 1 && (len(a.Rounds) != n || a.WallS != 2*float64(len(a.Rounds)-strings.Count(tc.err, "round "))) {
				t.Errorf("rounds %d wall %g", len(a.Rounds), a.WallS)
			}
			if a.Mode.TTFT.Count != int64(tc.repr) {
				t.Errorf("TTFT count %d, want the representative round's %g", a.Mode.TTFT.Count, tc.repr)
			}
		})
	}
	if a := Combine("prefix", []Arm{{Policy: "prefix", Error: "x"}, {Policy: "prefix", Error: "y"}}); a.Mode != nil || a.Error != "round 1: x; round 2: y" {
		t.Errorf("no round ran: %+v", a)
	}
}

// TestPlanRounds: the full suite slows the cells that measured the bench machine and repeats
// the shortest; --quick runs one round everywhere.
func TestPlanRounds(t *testing.T) {
	dir := t.TempDir()
	for _, rel := range []string{workload.MooncakeTrace, workload.OASSTThreads} { // Plan only checks they exist
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PREFIXLB_SHARED", dir)
	cells, _, err := Plan(false, nil)
	if err != nil {
		t.Fatal(err)
	}
	type rs struct {
		rounds  int
		speedup float64
	}
	d, a := float64(bench.DefaultSpeedup), float64(AgenticSpeedup)
	want := map[string]rs{"multi-turn closed": {ShortArmRounds, d},
		"shared-prefix light": {ShortArmRounds, d}, "shared-prefix medium": {ShortArmRounds, SlowSpeedup}, "shared-prefix near-saturation": {ShortArmRounds, SlowSpeedup},
		"agentic light": {ShortArmRounds, a}, "agentic medium": {ShortArmRounds, a}, "agentic near-saturation": {ShortArmRounds, a}, "agentic cache-pressure": {ShortArmRounds, a},
		"mooncake light": {ShortArmRounds, d}, "mooncake medium": {ShortArmRounds, d}, "mooncake near-saturation": {ShortArmRounds, d},
		"mooncake cache-pressure": {ShortArmRounds, d},
		"oasst light":             {ShortArmRounds, d}, "oasst medium": {ShortArmRounds, SlowSpeedup}, "oasst near-saturation": {ShortArmRounds, SlowSpeedup}}
	if len(cells) != len(want) {
		t.Errorf("%d cells, want %d", len(cells), len(want))
	}
	for _, c := range cells {
		if got := (rs{c.Rounds, c.Options.Speedup}); got != want[c.Name()] {
			t.Errorf("%s: %+v, want %+v", c.Name(), got, want[c.Name()])
		}
		// The cache-pressure cells: a third of the KV cache.
		kv, count := int64(0), 0
		switch c.Name() {
		case "agentic cache-pressure":
			kv = AgenticPressureKVTokens
		case "mooncake cache-pressure":
			kv, count = MooncakePressureKVTokens, MooncakePressureCount
		case "mooncake light", "mooncake medium", "mooncake near-saturation":
			count = MooncakeCount
		}
		if c.Options.KVTokens != kv || c.Options.Flags.Count != count {
			t.Errorf("%s: KV %d tokens, %d requests; want %d, %d", c.Name(), c.Options.KVTokens, c.Options.Flags.Count, kv, count)
		}
		if c.Level == CachePressure && (!strings.Contains(c.Load, "k tokens per replica") ||
			c.Options.Flags.Rate != map[string]float64{"agentic": AgenticMedium, "mooncake": 0}[c.Workload] ||
			c.Workload == "mooncake" && c.Options.Flags.TimeScale != MooncakeLight) {
			t.Errorf("%s: load %q, flags %+v", c.Name(), c.Load, c.Options.Flags)
		}
	}
	quick, _, _ := Plan(true, nil)
	wantQuick := map[string]float64{"multi-turn": d, "shared-prefix": d, "agentic": a, "mooncake": d, "oasst": SlowSpeedup}
	for _, c := range quick {
		if c.Rounds != 1 || c.Options.Speedup != wantQuick[c.Workload] {
			t.Errorf("--quick %s: %d rounds at %g×, want 1 at %g×", c.Name(), c.Rounds, c.Options.Speedup, wantQuick[c.Workload])
		}
	}
}

// TestSuiteRounds runs a tiny real cell in 3 rounds: every policy runs once per round, in
// turn, each arm keeps its rounds, and the scoreboard shows the medians with their spread.
func TestSuiteRounds(t *testing.T) {
	o := bench.DefaultOptions()
	o.Workload, o.Replicas, o.Speedup = "shared-prefix", smokeReplicas, smokeSpeedup
	o.AllowBursts = true
	// 1 request/s (50 ms of wall time at 20×), so that each group's earlier prompt has
	// finished its prefill when the next comes, whatever the machine: a busy machine that
	// bunches faster sends can leave a round-robin round without a cache hit, which flags
	// the arm.
	o.Flags = bench.WorkloadFlags{Groups: 2, PromptsPerGroup: 3, SystemTokens: 256, QuestionTokens: 16, OutputTokens: 8, Rate: 1}
	cells := []Cell{{Workload: "shared-prefix", Level: "medium", Load: "1 req/s", Rate: 1, Options: o}}
	ctx, cancel := context.WithTimeout(context.Background(), smokeTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	res, err := Run(ctx, Options{Policies: []string{"round-robin", "prefix"}, Repeat: 3, Stdout: &stdout, Stderr: &stderr}, cells, nil)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	var order []string
	for _, l := range lines {
		if strings.HasPrefix(l, "[") {
			order = append(order, strings.Fields(l)[3]+" "+strings.Fields(l)[5])
		}
	}
	wantOrder := []string{"round-robin 1:", "prefix 1:", "round-robin 2:", "prefix 2:", "round-robin 3:", "prefix 3:"}
	if !slices.Equal(order, wantOrder) {
		t.Errorf("arm runs %v, want %v:\n%s", order, wantOrder, stderr.String())
	}
	c := res.Cells[0]
	if c.Rounds != 3 || len(c.Arms) != 2 {
		t.Fatalf("rounds %d, arms %d", c.Rounds, len(c.Arms))
	}
	for _, a := range c.Arms {
		var p95s []float64
		for _, r := range a.Rounds {
			if r.Mode == nil || r.Mode.Requests != 6 || r.Mode.Errors != 0 {
				t.Fatalf("%s round: %+v", a.Policy, r)
			}
			p95s = append(p95s, r.Mode.TTFT.P95)
		}
		if len(a.Rounds) != 3 || a.Mode == nil || a.Mode.TTFT.P95 != report.Median(p95s) || len(a.Flags) > 0 {
			t.Errorf("%s: %d rounds, p95 %v of %v, flags %v", a.Policy, len(a.Rounds), a.Mode, p95s, a.Flags)
		}
	}
	out := stdout.String()
	spreadRow := regexp.MustCompile(`(?m)^\| prefix \| [0-9.]+ \| [0-9.]+ \([0-9.]+–[0-9.]+\) \| [0-9.]+ \([0-9.]+–[0-9.]+\) \|`)
	if !strings.Contains(out, "3 interleaved rounds per arm") || !spreadRow.MatchString(out) {
		t.Errorf("scoreboard does not show the rounds' medians and spread:\n%s", out)
	}
}

// cancelAfter cancels a context at its n-th write (the n-th arm's progress line).
type cancelAfter struct {
	n      int
	cancel context.CancelFunc
	buf    bytes.Buffer
}

func (w *cancelAfter) Write(p []byte) (int, error) {
	if w.n--; w.n == 0 {
		w.cancel()
	}
	return w.buf.Write(p)
}

// TestSuiteInterruptedMidRound: a run cut short in round 2 (after round-robin's second run,
// before prefix's) keeps one complete round of each arm, so both medians are over the same
// rounds, and says the cell had 1 round.
func TestSuiteInterruptedMidRound(t *testing.T) {
	o := bench.DefaultOptions()
	o.Workload, o.Replicas, o.Speedup = "shared-prefix", smokeReplicas, smokeSpeedup
	o.AllowBursts = true
	o.Flags = bench.WorkloadFlags{Groups: 1, PromptsPerGroup: 2, SystemTokens: 64, QuestionTokens: 8, OutputTokens: 4, Rate: 40}
	cells := []Cell{{Workload: "shared-prefix", Level: "medium", Options: o}}
	ctx, cancel := context.WithTimeout(context.Background(), smokeTimeout)
	defer cancel()
	stderr := &cancelAfter{n: 3, cancel: cancel}
	var stdout bytes.Buffer
	res, err := Run(ctx, Options{Policies: []string{"round-robin", "prefix"}, Repeat: 2, Stdout: &stdout, Stderr: stderr}, cells, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if len(res.Cells) != 1 || res.Cells[0].Rounds != 1 || len(res.Cells[0].Arms) != 2 {
		t.Fatalf("cells %+v, want one cell of 1 round, 2 arms", res.Cells)
	}
	for _, a := range res.Cells[0].Arms {
		if a.Mode == nil || len(a.Rounds) != 0 {
			t.Errorf("%s: mode %v, %d rounds kept, want one round's row", a.Policy, a.Mode, len(a.Rounds))
		}
	}
	if cells[0].Rounds != 0 {
		t.Errorf("Run changed the caller's cells: rounds %d", cells[0].Rounds)
	}
}
