package suite

import (
	"math"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench/report"
)

// tenantRound is one round's row of a multi-tenant arm: overall TTFT p95 p95, output tok/s
// tps, and its tenants (each with Requests set; Completed, TTFT and shares as given).
func tenantRound(p95, tps float64, tenants ...report.Tenant) *report.Mode {
	m := mode(p95)
	m.OutputTPS = tps
	m.Tenants = tenants
	m.Requests = 0
	for _, t := range tenants {
		m.Requests += t.Requests
		m.Refused += t.Refused
		m.Expired += t.Expired
		m.Errors += t.Refused + t.Expired + t.Failed
	}
	return m
}

// ten is a tenant row: 100 sent, done of them completed with TTFT p95 p95 (p50 half, p99
// double), in-SLO share share.
func ten(name string, prio int, p95 float64, share float64) report.Tenant {
	return report.Tenant{Name: name, Priority: prio, Requests: 100, Completed: 100, TTFT: report.Latency{P50: p95 / 2, P95: p95, P99: p95 * 2},
		GoodputShare: share, GPUWorkShare: 0.5}
}

// armOf combines per-round rows into a policy's arm, as the suite does.
func armOf(policy string, ms ...*report.Mode) Arm {
	rs := make([]Arm, len(ms))
	for i, m := range ms {
		rs[i] = Arm{Policy: policy, Mode: m}
	}
	return Combine(policy, rs)
}

// overloadResult is the overload workload's cells from level → arms (3 rounds each).
func overloadResult(cells map[string][]Arm) *Result {
	r := &Result{Policies: []string{PrefixPolicy, FlowPolicy, OraclePolicy}}
	for _, l := range []string{OverloadLevel, "light", FairAloneLevel, FairLevel, FairSharesLevel} {
		arms, ok := cells[l]
		if !ok {
			continue
		}
		r.Cells = append(r.Cells, CellResult{Cell: Cell{Workload: OverloadWorkload, Level: l, Rounds: 3}, Requests: arms[0].Mode.Requests, Arms: arms})
	}
	return r
}

func flowOf(t *testing.T, r *Result, level string) *FlowCheck {
	t.Helper()
	for _, c := range r.Cells {
		if c.Level == level {
			if c.FlowControl == nil {
				t.Fatalf("%s: no flow-control check", level)
			}
			return c.FlowControl
		}
	}
	t.Fatalf("no cell %s", level)
	return nil
}

// TestFlowTargetsLight: prefix+fc ÷ prefix at light load, overall and per tenant, met only when
// the interval holds 1 and ends by 1.03; not met when it lies on one side of 1; - without prefix.
func TestFlowTargetsLight(t *testing.T) {
	light := func(policy string, p95s [3]float64, chat [3]float64) Arm {
		ms := make([]*report.Mode, 3)
		for i := range ms {
			ms[i] = tenantRound(p95s[i], 1000, ten("chat", 1, chat[i], 1), ten("noisy", 1, 50, 1), ten("batch", 0, 200, 1))
		}
		return armOf(policy, ms...)
	}
	base := [3]float64{100, 120, 110}
	cases := []struct {
		name     string
		fc       [3]float64
		fcChat   [3]float64
		noPrefix bool
		overall  Verdict
		chat     Verdict
		rendered string
	}{
		{"indistinguishable", [3]float64{100, 121, 109}, [3]float64{40.4, 39.6, 40}, false, Met, Met, "all tenants | 1.00 [0.98–1.02] | met |"},
		{"slower in every round", [3]float64{110, 132, 121}, [3]float64{44, 44, 44}, false, NotMet, NotMet, "all tenants | 1.10 [1.10–1.10] | not met |"},
		{"holds 1, too wide", [3]float64{90, 132, 110}, [3]float64{36, 44, 40}, false, NotShown, NotShown, "| not shown |"},
		{"faster in every round (not indistinguishable)", [3]float64{90, 108, 99}, [3]float64{36, 36, 36}, false, NotMet, NotMet, "all tenants | 0.90 [0.90–0.90] | not met |"},
		{"no prefix arm", [3]float64{100, 120, 110}, [3]float64{40, 40, 40}, true, Unjudged, Unjudged, "all tenants | - | not judged |"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			arms := []Arm{light(FlowPolicy, tc.fc, tc.fcChat)}
			if !tc.noPrefix {
				arms = append([]Arm{light(PrefixPolicy, base, [3]float64{40, 40, 40})}, arms...)
			}
			r := overloadResult(map[string][]Arm{"light": arms})
			b := Analyze(r)
			f := flowOf(t, r, "light")
			if got := Indistinguishable(f.LightP95, TargetLightP95); got != tc.overall {
				t.Errorf("overall %s (%s), want %s", got, intervalText(f.LightP95), tc.overall)
			}
			var chat *RatioInterval
			for _, x := range f.LightTenantP95 {
				if x.Tenant == "chat" {
					chat = x.Ratio
				}
			}
			if got := Indistinguishable(chat, TargetLightP95); got != tc.chat {
				t.Errorf("chat %s (%s), want %s", got, intervalText(chat), tc.chat)
			}
			if !tc.noPrefix && len(f.LightTenantP95) != 3 {
				t.Errorf("%d tenant ratios, want 3", len(f.LightTenantP95))
			}
			out := Render(b)
			if !strings.Contains(out, "## Flow control against issue 56's targets") || !strings.Contains(out, tc.rendered) {
				t.Errorf("scoreboard lacks %q:\n%s", tc.rendered, flowTargetsBlock(b))
			}
		})
	}
}

// TestFlowTargetsOverload: the overload cell's chat p95 is paired with the light cell's round
// by round; a refused or expired request is no failure (the arm stays valid), a failed one is.
func TestFlowTargetsOverload(t *testing.T) {
	round := func(p95, tps, chatP95, chatShare float64, refused, failed int) *report.Mode {
		chat := ten("chat", 1, chatP95, chatShare)
		batch := ten("batch", 0, 900, 0.5)
		batch.Refused, batch.Failed, batch.Completed = refused, failed, 100-refused-failed
		m := tenantRound(p95, tps, chat, ten("noisy", 1, 80, 0.9), batch)
		if failed > 0 {
			m.Flags = append(m.Flags, "errors: some failed") // bench's validity check
		}
		return m
	}
	lightArms := []Arm{
		armOf(PrefixPolicy, round(100, 1000, 40, 1, 0, 0), round(100, 1000, 50, 1, 0, 0), round(100, 1000, 60, 1, 0, 0)),
		armOf(FlowPolicy, round(100, 1000, 40, 1, 0, 0), round(100, 1000, 50, 1, 0, 0), round(100, 1000, 60, 1, 0, 0)),
	}
	cases := []struct {
		name                       string
		fc                         Arm
		multiple, slo, tps, failed Verdict
		rounds                     []float64 // the chat multiple's rounds
	}{
		{"every target met", armOf(FlowPolicy, round(900, 970, 60, 0.98, 20, 0), round(900, 980, 75, 0.99, 20, 0), round(900, 990, 90, 0.985, 20, 0)),
			Met, Met, Met, Met, []float64{1.5, 1.5, 1.5}},
		{"chat over 2×, shares below, output lost", armOf(FlowPolicy, round(900, 500, 120, 0.5, 20, 0), round(900, 510, 160, 0.6, 20, 0), round(900, 490, 190, 0.55, 20, 0)),
			NotMet, NotMet, NotMet, Met, []float64{3, 3.2, 19.0 / 6}},
		{"a failed request: flagged, the rest not judged", armOf(FlowPolicy, round(900, 970, 60, 0.98, 20, 0), round(900, 980, 75, 0.99, 20, 2), round(900, 990, 90, 0.985, 20, 0)),
			Unjudged, Unjudged, Unjudged, NotMet, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pre := armOf(PrefixPolicy, round(900, 1000, 400, 0.5, 0, 0), round(900, 1000, 500, 0.5, 0, 0), round(900, 1000, 600, 0.5, 0, 0))
			r := overloadResult(map[string][]Arm{OverloadLevel: {pre, tc.fc}, "light": lightArms})
			b := Analyze(r)
			if len(b.Targets) != 0 || len(b.PrefixFlagged) != 0 {
				t.Errorf("overload cells in issue 15's table: %d targets, flagged %v", len(b.Targets), b.PrefixFlagged)
			}
			if row := b.Rows[0][1]; (tc.failed == Met) != row.Valid() {
				t.Errorf("prefix+fc valid %v (flags %v), want %v: refused requests are not failures", row.Valid(), row.Flags, tc.failed == Met)
			}
			f := flowOf(t, r, OverloadLevel)
			v := f.Verdicts()
			want := []Verdict{tc.multiple, tc.slo, tc.tps, tc.failed}
			for i := range want {
				if v[i] != want[i] {
					t.Errorf("verdict %d: %s, want %s (multiple %s, SLO %s, tok/s %s)", i, v[i], want[i], intervalText(f.ChatMultiple), intervalText(f.ChatInSLO), intervalText(f.OutputTPS))
				}
			}
			if tc.rounds != nil {
				if f.ChatMultiple == nil || len(f.ChatMultiple.Rounds) != 3 {
					t.Fatalf("chat multiple %+v", f.ChatMultiple)
				}
				for i, w := range tc.rounds {
					if math.Abs(f.ChatMultiple.Rounds[i]-w) > 1e-9 {
						t.Errorf("chat multiple rounds %v, want %v (round i against the light cell's round i)", f.ChatMultiple.Rounds, tc.rounds)
					}
				}
				if p := f.ChatMultiplePrefix; p == nil || math.Abs(p.Ratio-10) > 1e-9 {
					t.Errorf("prefix's multiple %s, want 10", intervalText(p))
				}
			}
			c := r.Cells[0]
			if len(c.Tenants) != 6 || c.Tenants[0].Policy != PrefixPolicy || c.Tenants[0].Tenant != "chat" || c.Tenants[0].TTFT == nil || c.Tenants[0].TTFT.P95 != 500 {
				t.Errorf("tenant medians %+v", c.Tenants)
			}
			if batch := c.Tenants[5]; batch.Refused != 20 || batch.Sent != 100 {
				t.Errorf("prefix+fc batch: %+v, want 20 refused of 100", batch)
			}
			out := Render(b)
			for _, s := range []string{"| prefix+fc | batch | 0 | 100 | ", "output 1000 tok/s over all tenants", "(no flow control, stated) | 10.00 [10.00–10.00] | - |"} {
				if !strings.Contains(out, s) {
					t.Errorf("scoreboard lacks %q", s)
				}
			}
		})
	}
}

// TestFlowTargetsFair: light's p95 in the fair cell ÷ its p95 alone pairs round i with the
// fair-alone cell's round i (not the medians), per arm; Jain in the fair-shares cell is the
// interval of its per-round values; an arm without its fair-alone twin gives "-".
func TestFlowTargetsFair(t *testing.T) {
	fairRound := func(lightP95 float64, jain float64) *report.Mode {
		m := tenantRound(lightP95, 1000, ten("light", 1, lightP95, 1), ten("heavy", 1, 900, 0.1))
		m.Fairness = []report.Fairness{{Priority: 1, Tenants: []string{"light", "heavy"}, Jain: &jain}}
		return m
	}
	alone := func(p95 ...float64) []*report.Mode {
		ms := make([]*report.Mode, len(p95))
		for i, p := range p95 {
			ms[i] = tenantRound(p, 100, ten("light", 1, p, 1))
		}
		return ms
	}
	r := overloadResult(map[string][]Arm{
		FairAloneLevel: {armOf(FlowPolicy, alone(50, 25, 37.5)...), armOf(PrefixPolicy, alone(20, 20, 20)...)},
		FairLevel: {armOf(FlowPolicy, fairRound(60, 0.9), fairRound(30, 0.9), fairRound(45, 0.9)),
			armOf(PrefixPolicy, fairRound(400, 0.6), fairRound(500, 0.6), fairRound(450, 0.6)),
			armOf(OraclePolicy, fairRound(100, 0.6), fairRound(100, 0.6), fairRound(100, 0.6))},
		FairSharesLevel: {armOf(FlowPolicy, fairRound(60, 0.97), fairRound(60, 0.98), fairRound(60, 0.99)),
			armOf(PrefixPolicy, fairRound(400, 0.6), fairRound(400, 0.62), fairRound(400, 0.61))},
	})
	b := Analyze(r)
	fair := flowOf(t, r, FairLevel)
	want := map[string]struct {
		rounds []float64
		v      Verdict
	}{FlowPolicy: {[]float64{1.2, 1.2, 1.2}, Met}, PrefixPolicy: {[]float64{20, 25, 22.5}, NotMet}, OraclePolicy: {nil, Unjudged}}
	if len(fair.FairP95) != 3 {
		t.Fatalf("fair: %d arms, want 3", len(fair.FairP95))
	}
	for _, p := range fair.FairP95 {
		w := want[p.Policy]
		if got := AtMost(p.Ratio, TargetFairP95); got != w.v {
			t.Errorf("%s: %s (%s), want %s", p.Policy, got, intervalText(p.Ratio), w.v)
		}
		if w.rounds == nil {
			continue
		}
		for i := range w.rounds {
			if p.Ratio == nil || math.Abs(p.Ratio.Rounds[i]-w.rounds[i]) > 1e-9 {
				t.Fatalf("%s: rounds %+v, want %v (round i against fair-alone's round i)", p.Policy, p.Ratio, w.rounds)
			}
		}
	}
	shares := flowOf(t, r, FairSharesLevel)
	jv := map[string]Verdict{}
	for _, p := range shares.Jain {
		jv[p.Policy] = AtLeast(p.Ratio, TargetJain)
		if p.Policy == FlowPolicy && (math.Abs(p.Ratio.Ratio-0.98) > 1e-9 || !p.Ratio.HasInterval()) {
			t.Errorf("prefix+fc Jain %+v, want the mean 0.98 with an interval", p.Ratio)
		}
	}
	if jv[FlowPolicy] != Met || jv[PrefixPolicy] != NotMet {
		t.Errorf("Jain verdicts %v, want prefix+fc met, prefix not met", jv)
	}
	out := flowTargetsBlock(b)
	for _, s := range []string{"| overload fair | oracle light p95 ÷ its p95 alone ≤ 1.5 | - | not judged |", "| overload fair-shares | prefix+fc Jain ≥ 0.95 | 0.98 [", "prefix+fc on these targets together: met"} {
		if !strings.Contains(out, s) {
			t.Errorf("block lacks %q:\n%s", s, out)
		}
	}
}

// TestMoonshot: on a cell of another workload, prefix+fc's p95 ÷ the oracle's and p99 ÷ prefix's,
// and nothing shed; a refusal fails the arm's validity (no tenants) and the target.
func TestMoonshot(t *testing.T) {
	shed := func(i int, m *report.Mode) {
		if i == 1 {
			m.Errors, m.Refused = 4, 4
		}
	}
	cases := []struct {
		name string
		fc   Arm
		want [3]Verdict
	}{
		{"met", rounds(FlowPolicy, []float64{9, 9.5, 9.2}, nil), [3]Verdict{Met, Met, Met}},
		{"slower than the oracle", rounds(FlowPolicy, []float64{12, 12.5, 12.2}, nil), [3]Verdict{NotMet, NotMet, Met}},
		{"shed", rounds(FlowPolicy, []float64{9, 9.5, 9.2}, shed), [3]Verdict{Unjudged, Unjudged, NotMet}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := cell("agentic", rounds(PrefixPolicy, []float64{11, 11, 11}, nil), tc.fc, rounds(OraclePolicy, []float64{10, 10, 10}, nil))
			res.Cells[0].Level, res.Cells[0].Rounds = "near-saturation", 3
			b := Analyze(res)
			m := res.Cells[0].Moonshot
			if m == nil {
				t.Fatal("no moonshot check")
			}
			if got := m.Verdicts(); got != tc.want {
				t.Errorf("verdicts %v, want %v (p95 ÷ oracle %s, p99 ÷ prefix %s, shed %d)", got, tc.want, intervalText(m.P95Oracle), intervalText(m.P99Prefix), m.Shed)
			}
			if out := moonshotBlock(b); !strings.Contains(out, "| agentic near-saturation | ") {
				t.Errorf("moonshot block:\n%s", out)
			}
		})
	}
	res := cell("agentic", rounds(PrefixPolicy, []float64{11, 11, 11}, nil), rounds(OraclePolicy, []float64{10, 10, 10}, nil))
	if b := Analyze(res); res.Cells[0].Moonshot != nil || moonshotBlock(b) != "" || flowTargetsBlock(b) != "" {
		t.Error("a cell without prefix+fc has a moonshot row, or a suite without overload cells a flow-control block")
	}
}
