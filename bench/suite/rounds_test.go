package suite

import (
	"bytes"
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/report"
)

func TestCombine(t *testing.T) {
	round := func(p95, cached, share float64, f func(*report.Mode)) Arm {
		m := mode(p95)
		m.CachedTokenRatio, m.MaxShareOverMean, m.RequestsDigest = cached, share, "d1"
		m.BackendShare = map[string]float64{"r": p95} // marks which round is the representative
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
			p95: 20, p99: 40, cached: 0.5, share: 1, repr: 20, errors: 3, flags: []string{"3 errors"}},
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
		})
	}
	if a := Combine("prefix", []Arm{{Policy: "prefix", Error: "x"}, {Policy: "prefix", Error: "y"}}); a.Mode != nil || a.Error != "round 1: x; round 2: y" {
		t.Errorf("no round ran: %+v", a)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := slices.Clone(tc.xs)
		if got := Median(in); got != tc.want || !slices.Equal(in, tc.xs) {
			t.Errorf("Median(%v) = %g (input now %v), want %g", tc.xs, got, in, tc.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) is not NaN")
	}
}

// TestPlanRounds: the full suite slows the cells that measured the bench machine and repeats
// the shortest; --quick runs one round everywhere.
func TestPlanRounds(t *testing.T) {
	t.Setenv("PREFIXLB_SHARED", t.TempDir())
	cells, _, err := Plan(false, []string{"multi-turn", "shared-prefix"})
	if err != nil {
		t.Fatal(err)
	}
	type rs struct {
		rounds  int
		speedup float64
	}
	want := map[string]rs{"multi-turn closed": {1, bench.DefaultSpeedup}, "shared-prefix light": {1, bench.DefaultSpeedup},
		"shared-prefix medium": {ShortArmRounds, bench.DefaultSpeedup}, "shared-prefix near-saturation": {1, SlowSpeedup}}
	for _, c := range cells {
		if got := (rs{c.Rounds, c.Options.Speedup}); got != want[c.Name()] {
			t.Errorf("%s: %+v, want %+v", c.Name(), got, want[c.Name()])
		}
	}
	quick, _, _ := Plan(true, nil)
	for _, c := range quick {
		if c.Rounds != 1 || c.Options.Speedup < SlowSpeedup {
			t.Errorf("--quick %s: %d rounds at %g×", c.Name(), c.Rounds, c.Options.Speedup)
		}
	}
}

// TestSuiteRounds runs a tiny real cell in 3 rounds: every policy runs once per round, in
// turn, each arm keeps its rounds, and the scoreboard shows the medians with their spread.
func TestSuiteRounds(t *testing.T) {
	o := bench.DefaultOptions()
	o.Workload, o.Replicas, o.Speedup = "shared-prefix", smokeReplicas, smokeSpeedup
	o.AllowBursts = true
	o.Flags = bench.WorkloadFlags{Groups: 2, PromptsPerGroup: 3, SystemTokens: 256, QuestionTokens: 16, OutputTokens: 8, Rate: 10}
	cells := []Cell{{Workload: "shared-prefix", Level: "medium", Load: "10 req/s", Rate: 10, Options: o}}
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
		if len(a.Rounds) != 3 || a.Mode == nil || a.Mode.TTFT.P95 != Median(p95s) || len(a.Flags) > 0 {
			t.Errorf("%s: %d rounds, p95 %v of %v, flags %v", a.Policy, len(a.Rounds), a.Mode, p95s, a.Flags)
		}
	}
	if out := stdout.String(); !strings.Contains(out, "3 interleaved rounds per arm") || !strings.Contains(out, "–") {
		t.Errorf("scoreboard does not show the rounds:\n%s", out)
	}
}

func TestTargets(t *testing.T) {
	arms := func(prefix *report.Mode, rest ...Arm) *Result {
		return cell("w", append([]Arm{{Policy: "prefix", Mode: prefix}}, rest...)...)
	}
	rr := func(p99 float64) Arm {
		return Arm{Policy: "round-robin", Mode: with(mode(50), func(m *report.Mode) { m.TTFT.P99 = p99 })}
	}
	oracle := func(p95, cached, share float64) Arm {
		return Arm{Policy: "oracle", Mode: with(mode(p95), func(m *report.Mode) { m.CachedTokenRatio, m.MaxShareOverMean = cached, share })}
	}
	cases := []struct {
		name   string
		res    *Result
		checks [5]bool
	}{
		// prefix: p95 10, p99 20, cached 0.5, share 1.2.
		{"all met", arms(mode(10), rr(20), oracle(10, 0.5, 1), Arm{Policy: "sglang", Mode: mode(10)}), [5]bool{true, true, true, true, true}},
		{"p95 above the oracle's", arms(mode(10), rr(40), oracle(9, 0.5, 1), Arm{Policy: "sglang", Mode: mode(12)}), [5]bool{false, true, true, true, true}},
		{"a peer faster", arms(mode(10), rr(40), oracle(10, 0.5, 1), Arm{Policy: "sglang", Mode: mode(12)}, Arm{Policy: "llm-d", Mode: mode(9.9)}), [5]bool{true, false, true, true, true}},
		{"p99 above round-robin's", arms(mode(10), rr(19), oracle(10, 0.5, 1), Arm{Policy: "sglang", Mode: mode(10)}), [5]bool{true, true, false, true, true}},
		{"cached below 90% of the oracle's", arms(mode(10), rr(40), oracle(10, 0.56, 1), Arm{Policy: "sglang", Mode: mode(10)}), [5]bool{true, true, true, false, true}},
		{"concentrated, the oracle less", arms(with(mode(10), func(m *report.Mode) { m.MaxShareOverMean = 1.5 }), rr(40), oracle(10, 0.5, 1.4), Arm{Policy: "sglang", Mode: mode(10)}), [5]bool{true, true, true, true, false}},
		{"concentrated like the oracle", arms(with(mode(10), func(m *report.Mode) { m.MaxShareOverMean = 1.5 }), rr(40), oracle(10, 0.5, 1.5), Arm{Policy: "sglang", Mode: mode(10)}), [5]bool{true, true, true, true, true}},
		{"no yardsticks: nothing met", arms(mode(10)), [5]bool{false, false, false, false, true}},
		{"flagged peer not judged", arms(mode(10), rr(40), oracle(10, 0.5, 1), Arm{Policy: "sglang", Mode: with(mode(1), func(m *report.Mode) { m.Errors = 1 })}), [5]bool{true, false, true, true, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := Analyze(tc.res)
			if len(b.Targets) != 1 {
				t.Fatalf("%d target rows", len(b.Targets))
			}
			if got := b.Targets[0].Checks(); got != tc.checks {
				t.Errorf("checks %v, want %v (%+v)", got, tc.checks, b.Targets[0])
			}
			all := tc.checks == [5]bool{true, true, true, true, true}
			if want := map[bool]string{true: "1 of 1 cells meet", false: "0 of 1 cells meet"}[all]; !strings.Contains(Render(b), want) {
				t.Errorf("scoreboard lacks %q:\n%s", want, Render(b))
			}
		})
	}
	if b := Analyze(cell("w", Arm{Policy: "round-robin", Mode: mode(10)})); len(b.Targets) != 0 || strings.Contains(Render(b), "issue 15") {
		t.Error("a suite without a prefix arm shows issue 15's table")
	}
}
