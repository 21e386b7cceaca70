package suite

import (
	"math"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench/report"
)

// TestExactCache: dynamo-kv against the best approximate arm (the lowest median p95 among the
// valid arms but the oracle and dynamo-kv) and against dynamo, paired by round; an arm missing
// or flagged gives "-", and a cell without dynamo-kv has no row.
func TestExactCache(t *testing.T) {
	flag := func(_ int, m *report.Mode) { m.Errors = 3 }
	cases := []struct {
		name       string
		arms       []Arm
		best       string
		overBest   []float64 // the rounds' ratios (nil: no ratio)
		overApprox []float64
		readings   string // the two readings in the rendered row, "reading | reading"
		noRow      bool
	}{
		{name: "prefix is the best approximate arm; exact faster than both",
			arms: []Arm{rounds("round-robin", []float64{40, 40, 40}, nil), rounds("prefix", []float64{10, 20, 10}, nil),
				rounds("dynamo", []float64{20, 40, 20}, nil), rounds("dynamo-kv", []float64{9, 18, 9.2}, nil), rounds("oracle", []float64{5, 5, 5}, nil)},
			best: "prefix", overBest: []float64{0.9, 0.9, 0.92}, overApprox: []float64{0.45, 0.45, 0.46}, readings: "exact faster | 0.45 [0.44–0.47] | exact faster"},
		{name: "the oracle is never the yardstick; a flagged prefix neither: dynamo is the best",
			arms: []Arm{rounds("prefix", []float64{10, 10, 10}, flag), rounds("dynamo", []float64{20, 20, 20}, nil),
				rounds("dynamo-kv", []float64{30, 10, 22}, nil), rounds("oracle", []float64{5, 5, 5}, nil)},
			best: "dynamo", overBest: []float64{1.5, 0.5, 1.1}, overApprox: []float64{1.5, 0.5, 1.1}, readings: "not shown"},
		{name: "exact slower, no dynamo arm: -",
			arms: []Arm{rounds("prefix", []float64{10, 10, 10}, nil), rounds("dynamo-kv", []float64{12, 12.1, 12.2}, nil)},
			best: "prefix", overBest: []float64{1.2, 1.21, 1.22}, readings: "exact slower | - | -"},
		{name: "dynamo-kv flagged: the best is named, both ratios -",
			arms: []Arm{rounds("prefix", []float64{10, 10, 10}, nil), rounds("dynamo", []float64{20, 20, 20}, nil), rounds("dynamo-kv", []float64{9, 9, 9}, flag)},
			best: "prefix", readings: "| prefix | - | - | - | - |"},
		{name: "no dynamo-kv arm: no row",
			arms:  []Arm{rounds("prefix", []float64{10, 10, 10}, nil), rounds("dynamo", []float64{20, 20, 20}, nil)},
			noRow: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := cell("agentic", tc.arms...)
			res.Cells[0].Rounds = 3
			b := Analyze(res)
			e := res.Cells[0].ExactCache
			out := exactCacheBlock(b)
			if tc.noRow {
				if e != nil || out != "" {
					t.Fatalf("exact cache %+v, block %q; want none", e, out)
				}
				return
			}
			if e == nil {
				t.Fatal("no exact-cache figure")
			}
			if e.Best != tc.best {
				t.Errorf("best approximate %q, want %q", e.Best, tc.best)
			}
			checkRounds := func(what string, ri *RatioInterval, want []float64) {
				if want == nil {
					if ri != nil {
						t.Errorf("%s: %+v, want none", what, ri)
					}
					return
				}
				if ri == nil || len(ri.Rounds) != len(want) {
					t.Fatalf("%s: %+v, want rounds %v", what, ri, want)
				}
				for i := range want {
					if math.Abs(ri.Rounds[i]-want[i]) > 1e-9 {
						t.Errorf("%s: rounds %v, want %v (paired by round)", what, ri.Rounds, want)
					}
				}
				if !ri.HasInterval() || !(ri.Lo <= ri.Ratio && ri.Ratio <= ri.Hi) {
					t.Errorf("%s: no interval around the ratio: %+v", what, ri)
				}
			}
			checkRounds("÷ best", e.OverBest, tc.overBest)
			checkRounds("÷ dynamo", e.OverApprox, tc.overApprox)
			if !strings.Contains(out, "| agentic medium | 3 | "+tc.best) || !strings.Contains(out, tc.readings) || !strings.Contains(out, "Below 1: the exact index") {
				t.Errorf("block lacks the row or %q:\n%s", tc.readings, out)
			}
			if !strings.Contains(Render(b), "## Exact cache index (issue 55)") {
				t.Error("the scoreboard has no exact-cache table")
			}
		})
	}
}
