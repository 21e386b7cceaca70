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

// TestLogRatioInterval: hand-made ratios whose geometric mean and t-interval are known from
// Student's t table (t₀.₉₇₅ with 1, 2, 4 degrees of freedom: 12.7062, 4.30265, 2.77645).
func TestLogRatioInterval(t *testing.T) {
	e := math.E
	cases := []struct {
		name       string
		ratios     []float64
		gm, lo, hi float64
		ok         bool
	}{
		{"rounds agree: no width", []float64{2, 2, 2}, 2, 2, 2, true},
		{"one round: the ratio", []float64{1.5}, 1.5, 1.5, 1.5, true},
		// logs 0 and 2: mean 1, sd √2, n 2 → half-width 12.7062 · √2/√2.
		{"two rounds", []float64{1, e * e}, e, math.Exp(1 - 12.706205), math.Exp(1 + 12.706205), true},
		// logs −1, 0, 1: mean 0, sd 1, n 3 → half-width 4.302653/√3 = 2.484138.
		{"three rounds", []float64{1 / e, 1, e}, 1, math.Exp(-2.484138), math.Exp(2.484138), true},
		// logs of 0.9, 1.0, 1.1, 1.0, 1.0: mean m, sd s from the logs, n 5 → t 2.776445.
		{"five rounds", []float64{0.9, 1.0, 1.1, 1.0, 1.0}, math.Exp(logMean(0.9, 1, 1.1, 1, 1)),
			math.Exp(logMean(0.9, 1, 1.1, 1, 1) - 2.776445*logSD(0.9, 1, 1.1, 1, 1)/math.Sqrt(5)),
			math.Exp(logMean(0.9, 1, 1.1, 1, 1) + 2.776445*logSD(0.9, 1, 1.1, 1, 1)/math.Sqrt(5)), true},
		{"none", nil, 0, 0, 0, false},
		{"a zero ratio", []float64{1, 0}, 0, 0, 0, false},
		{"an infinite ratio", []float64{1, math.Inf(1)}, 0, 0, 0, false},
		{"NaN", []float64{math.NaN(), 1}, 0, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gm, lo, hi, ok := LogRatioInterval(tc.ratios, IntervalLevel)
			if ok != tc.ok {
				t.Fatalf("ok %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			for _, c := range []struct {
				what      string
				got, want float64
			}{{"geometric mean", gm, tc.gm}, {"lo", lo, tc.lo}, {"hi", hi, tc.hi}} {
				if math.Abs(c.got-c.want) > 1e-5*math.Max(1, math.Abs(c.want)) {
					t.Errorf("%s %.6g, want %.6g", c.what, c.got, c.want)
				}
			}
			if lo > gm || gm > hi {
				t.Errorf("interval [%g, %g] does not hold %g", lo, hi, gm)
			}
		})
	}
}

func logMean(xs ...float64) float64 {
	var s float64
	for _, x := range xs {
		s += math.Log(x)
	}
	return s / float64(len(xs))
}

func logSD(xs ...float64) float64 {
	m, s := logMean(xs...), 0.0
	for _, x := range xs {
		s += (math.Log(x) - m) * (math.Log(x) - m)
	}
	return math.Sqrt(s / float64(len(xs)-1))
}

// roundsOf is a policy's rounds with these TTFT p95s (ms), combined as the suite does.
func roundsOf(policy string, p95s ...float64) Arm {
	rs := make([]Arm, len(p95s))
	for i, p := range p95s {
		rs[i] = Arm{Policy: policy, Mode: mode(p)}
	}
	return Combine(policy, rs)
}

// TestP95OracleInterval: Analyze scores an arm's p95 ÷ the oracle's round by round (round i
// against the oracle's round i), reports the geometric mean with its interval in the row, in
// suite.json and in both tables, and gives one round its plain ratio without an interval.
func TestP95OracleInterval(t *testing.T) {
	// prefix 10, 30, 20 against the oracle's 10, 10, 10: round ratios 1, 3, 2; the ratio
	// of the medians would be 2, the geometric mean is ∛6.
	res := cell("agentic", roundsOf("prefix", 10, 30, 20), roundsOf("chwbl", 22, 44, 88), roundsOf(OraclePolicy, 10, 10, 10))
	res.Cells[0].Rounds = 3
	b := Analyze(res)
	rows := b.Rows[0]
	pre, chwbl, orc := rows[0], rows[1], rows[2]
	wantGM := math.Cbrt(6)
	half := 4.302653 * logSD(1, 3, 2) / math.Sqrt(3)
	if math.Abs(pre.Ratio-wantGM) > 1e-9 || !pre.Interval.HasInterval() ||
		math.Abs(pre.Interval.Lo-wantGM*math.Exp(-half)) > 1e-5 || math.Abs(pre.Interval.Hi-wantGM*math.Exp(half)) > 1e-5 {
		t.Errorf("prefix: ratio %g interval %+v, want %g [%g, %g]", pre.Ratio, pre.Interval, wantGM, wantGM*math.Exp(-half), wantGM*math.Exp(half))
	}
	// chwbl 2.2, 4.4, 8.8: logs evenly spaced by ln 2 around ln 4.4.
	if math.Abs(chwbl.Ratio-4.4) > 1e-9 || len(chwbl.Interval.Rounds) != 3 {
		t.Errorf("chwbl: ratio %g interval %+v, want 4.4 over 3 rounds", chwbl.Ratio, chwbl.Interval)
	}
	if orc.Ratio != 1 || orc.Interval.Lo != 1 || orc.Interval.Hi != 1 {
		t.Errorf("oracle against itself: %g %+v", orc.Ratio, orc.Interval)
	}
	if res.Cells[0].Arms[0].P95Oracle != pre.Interval {
		t.Error("the arm in suite.json does not carry the row's interval")
	}
	out := Render(b)
	for _, w := range []string{
		"| prefix | 10.0 | 20.0 (10.0–30.0) |", // the cell table: medians, spread
		"| 0.500 | 1.20 | " + ratioCI(pre) + " | - | ok |",
		"| agentic medium | 3 | " + ratioCI(pre) + " | ", // the matrix, with the rounds
		"geometric mean of the rounds' ratios",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("scoreboard lacks %q:\n%s", w, out)
		}
	}
	if !strings.HasPrefix(ratioCI(pre), "1.82 [") {
		t.Errorf("ratio column %q", ratioCI(pre))
	}

	p := filepath.Join(t.TempDir(), "suite.json")
	if err := WriteJSON(p, res); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	got := back.Cells[0].Arms[0].P95Oracle
	if got == nil || math.Abs(got.Ratio-wantGM) > 1e-9 || got.Level != IntervalLevel || len(got.Rounds) != 3 || got.Hi <= got.Lo {
		t.Errorf("suite.json p95_oracle %+v", got)
	}

	// One round: the plain ratio, no interval, none in the JSON.
	one := cell("agentic", Arm{Policy: "prefix", Mode: mode(12)}, Arm{Policy: OraclePolicy, Mode: mode(10)})
	b = Analyze(one)
	if r := b.Rows[0][0]; math.Abs(r.Ratio-1.2) > 1e-9 || r.Interval.HasInterval() || ratioCI(r) != "1.20" {
		t.Errorf("one round: %g %+v %q", r.Ratio, r.Interval, ratioCI(r))
	}

	// A flagged arm and a flagged oracle give no ratio and no interval.
	bad := cell("agentic", roundsOf("prefix", 10, 10), Arm{Policy: OraclePolicy, Mode: with(mode(10), func(m *report.Mode) { m.Errors = 3 })})
	b = Analyze(bad)
	if r := b.Rows[0][0]; !math.IsNaN(r.Ratio) || r.Interval != nil || bad.Cells[0].Arms[0].P95Oracle != nil {
		t.Errorf("flagged oracle: %g %+v", r.Ratio, r.Interval)
	}
}

// TestPairedP95RatioSkipsEmptyRounds: a round in which either arm answered nothing is left
// out of the pairs, not counted as a ratio of zero.
func TestPairedP95RatioSkipsEmptyRounds(t *testing.T) {
	arm := roundsOf("prefix", 20, 20, 40)
	orc := roundsOf(OraclePolicy, 10, 10, 10)
	orc.Rounds[1].Mode = with(mode(10), func(m *report.Mode) { m.Errors = m.Requests })
	ri := pairedP95Ratio(&arm, &orc)
	if ri == nil || len(ri.Rounds) != 2 || ri.Rounds[0] != 2 || ri.Rounds[1] != 4 {
		t.Fatalf("pairs %+v, want rounds 1 and 3: 2, 4", ri)
	}
	if math.Abs(ri.Ratio-math.Sqrt(8)) > 1e-9 {
		t.Errorf("ratio %g, want √8", ri.Ratio)
	}
}
