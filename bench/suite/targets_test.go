package suite

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench/report"
)

// TestVerdictBoundaries: a target is met only when the whole interval is within the bound
// (the upper end equal to the bound is met), not met only when the whole interval is beyond
// it, and not shown when the interval holds the bound or there is no interval.
func TestVerdictBoundaries(t *testing.T) {
	iv := func(lo, ratio, hi float64) *RatioInterval {
		return &RatioInterval{Rounds: []float64{lo, hi}, Ratio: ratio, Lo: lo, Hi: hi, Level: IntervalLevel}
	}
	oneRound := &RatioInterval{Rounds: []float64{0.5}, Ratio: 0.5}
	cases := []struct {
		name            string
		ri              *RatioInterval
		atMost, atLeast Verdict // against the bound 1.10 (at most) and 0.90 (at least)
	}{
		{"upper end at the bound", iv(0.95, 1.02, 1.10), Met, Met},
		{"upper end just above", iv(0.95, 1.02, 1.1000001), NotShown, Met},
		{"central estimate in, interval straddles", iv(0.80, 1.00, 1.30), NotShown, NotShown},
		{"lower end at the bound", iv(1.10, 1.20, 1.30), NotShown, Met},
		{"lower end just above", iv(1.1000001, 1.20, 1.30), NotMet, Met},
		{"lower end at the at-least bound", iv(0.90, 0.95, 1.00), Met, Met},
		{"upper end just below the at-least bound", iv(0.70, 0.80, 0.8999999), Met, NotMet},
		{"upper end at the at-least bound", iv(0.70, 0.80, 0.90), Met, NotShown},
		{"one round, far within: still not shown", oneRound, NotShown, NotShown},
		{"no yardstick", nil, Unjudged, Unjudged},
	}
	for _, tc := range cases {
		if got := AtMost(tc.ri, TargetP95Oracle); got != tc.atMost {
			t.Errorf("%s: AtMost %s, want %s", tc.name, got, tc.atMost)
		}
		if got := AtLeast(tc.ri, TargetCachedOracle); got != tc.atLeast {
			t.Errorf("%s: AtLeast %s, want %s", tc.name, got, tc.atLeast)
		}
	}
	for _, tc := range []struct {
		vs       []Verdict
		all, any Verdict
	}{
		{[]Verdict{Met, Met}, Met, Met},
		{[]Verdict{Met, NotShown}, NotShown, Met},
		{[]Verdict{NotShown, NotMet}, NotMet, NotShown},
		{[]Verdict{Met, Unjudged}, Unjudged, Met},
		{[]Verdict{NotMet, Unjudged}, NotMet, Unjudged},
		{[]Verdict{NotMet, NotMet}, NotMet, NotMet},
		{nil, Unjudged, Unjudged},
	} {
		if got := All(tc.vs...); got != tc.all {
			t.Errorf("All%v = %s, want %s", tc.vs, got, tc.all)
		}
		if got := Any(tc.vs...); got != tc.any {
			t.Errorf("Any%v = %s, want %s", tc.vs, got, tc.any)
		}
	}
}

// rounds is a policy's rounds, each row made by mode(p95) and then set, combined as the suite
// does.
func rounds(policy string, p95s []float64, set func(i int, m *report.Mode)) Arm {
	rs := make([]Arm, len(p95s))
	for i, p := range p95s {
		m := mode(p)
		if set != nil {
			set(i, m)
		}
		rs[i] = Arm{Policy: policy, Mode: m}
	}
	return Combine(policy, rs)
}

// TestPrefixOverPeerInterval: prefix's p95 ÷ each other arm's is paired by round, pooled as
// the geometric mean with its t-interval, carried in the row, in suite.json and in both tables.
func TestPrefixOverPeerInterval(t *testing.T) {
	// prefix 10, 30, 20 against sglang's 20, 20, 20: ratios 0.5, 1.5, 1; the ratio of the
	// medians (20 ÷ 20) would be 1, the geometric mean is ∛0.75.
	res := cell("agentic", rounds("prefix", []float64{10, 30, 20}, nil), rounds("sglang", []float64{20, 20, 20}, nil),
		rounds(OraclePolicy, []float64{10, 10, 10}, nil))
	res.Cells[0].Rounds = 3
	b := Analyze(res)
	pre, sgl, orc := b.Rows[0][0], b.Rows[0][1], b.Rows[0][2]
	gm := math.Cbrt(0.75)
	half := 4.302653 * logSD(0.5, 1.5, 1) / math.Sqrt(3)
	got := sgl.PrefixOver
	if got == nil || math.Abs(got.Ratio-gm) > 1e-9 || math.Abs(got.Lo-gm*math.Exp(-half)) > 1e-5 ||
		math.Abs(got.Hi-gm*math.Exp(half)) > 1e-5 || got.Level != IntervalLevel || len(got.Rounds) != 3 {
		t.Fatalf("prefix ÷ sglang %+v, want %g [%g, %g]", got, gm, gm*math.Exp(-half), gm*math.Exp(half))
	}
	if pre.PrefixOver != nil {
		t.Errorf("prefix ÷ itself: %+v, want none", pre.PrefixOver)
	}
	// prefix ÷ oracle is the oracle row's, the inverse pairing of the oracle matrix.
	if orc.PrefixOver == nil || math.Abs(orc.PrefixOver.Ratio-pre.Ratio) > 1e-9 {
		t.Errorf("prefix ÷ oracle %+v, want %g", orc.PrefixOver, pre.Ratio)
	}
	if res.Cells[0].Arms[1].PrefixOver != got {
		t.Error("the arm in suite.json does not carry the row's prefix ratio")
	}
	out := Render(b)
	ci := intervalCI(got)
	for _, w := range []string{
		"| 0.500 | 1.20 | " + ratioCI(sgl) + " | " + ci + " | ok |", // the cell table
		"| agentic medium | 3 | " + ci + " |",                       // prefix's matrix
		"prefix ÷ this is prefix's p95 ÷ this arm's",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("scoreboard lacks %q:\n%s", w, out)
		}
	}
	p := filepath.Join(t.TempDir(), "suite.json")
	if err := WriteJSON(p, res); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	var back Result
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if g := back.Cells[0].Arms[1].PrefixOver; g == nil || math.Abs(g.Hi-got.Hi) > 1e-12 || !strings.Contains(string(raw), `"prefix_p95_over"`) {
		t.Errorf("suite.json prefix_p95_over %+v", g)
	}
	// A flagged peer has no ratio; neither has any arm when prefix is flagged.
	bad := cell("agentic", rounds("prefix", []float64{10, 10}, nil), rounds("sglang", []float64{10, 10}, func(_ int, m *report.Mode) { m.Errors = 1 }))
	if r := Analyze(bad).Rows[0][1]; r.PrefixOver != nil {
		t.Errorf("flagged peer: %+v", r.PrefixOver)
	}
	bad = cell("agentic", rounds("prefix", []float64{10, 10}, func(_ int, m *report.Mode) { m.Errors = 1 }), rounds("sglang", []float64{10, 10}, nil))
	if r := Analyze(bad).Rows[0][1]; r.PrefixOver != nil {
		t.Errorf("flagged prefix: %+v", r.PrefixOver)
	}
}

// TestTargets: each target judged on its interval over 3 rounds. The prefix rows: p95 10, p99
// 20, cached 0.5, share 1.2 in every round unless a case's rounds say otherwise.
func TestTargets(t *testing.T) {
	three := func(v float64) []float64 { return []float64{v, v, v} }
	pre := func(p95s []float64, set func(int, *report.Mode)) Arm { return rounds("prefix", p95s, set) }
	rr := func(p99s ...float64) Arm {
		return rounds("round-robin", three(50), func(i int, m *report.Mode) { m.TTFT.P99 = p99s[i] })
	}
	oracle := func(p95s []float64, cached, share float64) Arm {
		return rounds(OraclePolicy, p95s, func(_ int, m *report.Mode) { m.CachedTokenRatio, m.MaxShareOverMean = cached, share })
	}
	peer := func(name string, p95s ...float64) Arm { return rounds(name, p95s, nil) }
	all := [5]Verdict{Met, Met, Met, Met, Met}
	but := func(i int, v Verdict) [5]Verdict { a := all; a[i] = v; return a }
	cases := []struct {
		name string
		arms []Arm
		want [5]Verdict
		row  string // a substring of the cell's row
	}{
		{"all met", []Arm{pre(three(10), nil), rr(40, 40, 40), oracle(three(10), 0.5, 1), peer("sglang", 10, 10, 10)}, all,
			"| w medium | met: 1.00 [1.00–1.00] | met (highest: sglang 1.00 [1.00–1.00]) | met: 0.50 [0.50–0.50] |"},
		// Round ratios 1.0, 1.1, 1.2 to the oracle: the central estimate 1.10 is within the
		// bound, the interval is not: not shown, never met.
		{"p95 ÷ oracle central in, interval straddles", []Arm{pre([]float64{10, 11, 12}, nil), rr(40, 40, 40), oracle(three(10), 0.5, 1), peer("sglang", 20, 20, 20)},
			but(0, NotShown), "not shown: 1.10 ["},
		{"p95 ÷ oracle wholly above", []Arm{pre(three(12), nil), rr(40, 40, 40), oracle([]float64{10, 10.1, 9.9}, 0.5, 1), peer("sglang", 12, 12, 12)},
			but(0, NotMet), "not met: 1.20 ["},
		// sglang 9.9 every round: prefix ÷ sglang 1.01 with no spread, wholly above 1.
		{"a peer faster in every round", []Arm{pre(three(10), nil), rr(40, 40, 40), oracle(three(10), 0.5, 1), peer("sglang", 12, 12, 12), peer("llm-d", 9.9, 9.9, 9.9)},
			but(1, NotMet), "not met llm-d 1.01 [1.01–1.01]"},
		// llm-d 9, 11, 10: prefix ÷ llm-d straddles 1.
		{"a peer faster in one round", []Arm{pre(three(10), nil), rr(40, 40, 40), oracle(three(10), 0.5, 1), peer("sglang", 12, 12, 12), peer("llm-d", 9, 11, 10)},
			but(1, NotShown), "not shown llm-d 1.00 ["},
		{"p99 above round-robin's", []Arm{pre(three(10), nil), rr(19, 19, 19), oracle(three(10), 0.5, 1), peer("sglang", 10, 10, 10)}, but(2, NotMet), "not met: 1.05"},
		{"cached below 90% of the oracle's", []Arm{pre(three(10), nil), rr(40, 40, 40), oracle(three(10), 0.56, 1), peer("sglang", 10, 10, 10)}, but(3, NotMet), "not met: 0.89"},
		{"concentrated, the oracle less", []Arm{pre(three(10), func(_ int, m *report.Mode) { m.MaxShareOverMean = 1.5 }), rr(40, 40, 40), oracle(three(10), 0.5, 1.4), peer("sglang", 10, 10, 10)},
			but(4, NotMet), "not met: 1.50 [1.50–1.50] (1.07 [1.07–1.07])"},
		{"concentrated like the oracle", []Arm{pre(three(10), func(_ int, m *report.Mode) { m.MaxShareOverMean = 1.5 }), rr(40, 40, 40), oracle(three(10), 0.5, 1.5), peer("sglang", 10, 10, 10)}, all, "| met |"},
		{"no yardsticks: not judged", []Arm{pre(three(10), nil)}, [5]Verdict{Unjudged, Unjudged, Unjudged, Unjudged, Met}, "| - | - | - | - |"},
		{"a flagged peer is not a yardstick", []Arm{pre(three(10), nil), rr(40, 40, 40), oracle(three(10), 0.5, 1),
			rounds("sglang", three(1), func(_ int, m *report.Mode) { m.Errors = 1 })}, but(1, Unjudged), "| not judged |"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := cell("w", tc.arms...)
			res.Cells[0].Rounds = 3
			b := Analyze(res)
			if len(b.Targets) != 1 {
				t.Fatalf("%d target rows", len(b.Targets))
			}
			tg := b.Targets[0]
			if got := tg.Verdicts(); got != tc.want {
				t.Errorf("verdicts %v, want %v (%+v)", got, tc.want, tg)
			}
			all := All(tc.want[:]...)
			out := Render(b)
			want := map[Verdict]string{Met: "1 of 1 judged cells meet every target (0 not met, 0 not shown)",
				NotMet:   "0 of 1 judged cells meet every target (1 not met, 0 not shown)",
				NotShown: "0 of 1 judged cells meet every target (0 not met, 1 not shown)",
				Unjudged: "0 of 0 judged cells meet every target (0 not met, 0 not shown); not judged (a yardstick arm missing or flagged): w medium"}[all]
			if !strings.Contains(out, want) || !strings.Contains(out, tc.row) || !strings.Contains(out, "| "+all.String()+" |") {
				t.Errorf("scoreboard lacks %q, %q or the verdict %q:\n%s", want, tc.row, all, out)
			}
		})
	}
	// One round: every figure within its bound, and still not shown.
	one := Analyze(cell("w", Arm{Policy: "prefix", Mode: mode(10)}, Arm{Policy: "round-robin", Mode: mode(40)},
		Arm{Policy: OraclePolicy, Mode: mode(10)}, Arm{Policy: "sglang", Mode: mode(20)}))
	if v := one.Targets[0].Verdict(); v != NotShown || !strings.Contains(Render(one), "met: 0.50 (one round)") && !strings.Contains(Render(one), "not shown: 1.00 (one round)") {
		t.Errorf("one round: %s\n%s", v, Render(one))
	}
	if !strings.Contains(Render(one), "a central estimate alone never decides") {
		t.Error("the targets' caption does not state the rule")
	}
	if b := Analyze(cell("w", Arm{Policy: "round-robin", Mode: mode(10)})); len(b.Targets) != 0 || strings.Contains(Render(b), "issue 15") {
		t.Error("a suite without a prefix arm shows issue 15's table")
	}
	flagged := Analyze(cell("w", Arm{Policy: "prefix", Mode: with(mode(10), func(m *report.Mode) { m.Errors = 2 })}, Arm{Policy: "oracle", Mode: mode(10)}))
	if out := Render(flagged); len(flagged.Targets) != 0 || !strings.Contains(out, "prefix flagged (see Validity): w medium") {
		t.Errorf("a flagged prefix arm is not named under issue 15's table:\n%s", out)
	}
}
