package suite

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench/report"
)

// mode is a hand-made valid report row: requests requests, TTFT p95 p95 ms, some cache hits.
func mode(p95 float64) *report.Mode {
	return &report.Mode{Requests: 100, TTFT: report.Latency{P50: p95 / 2, P95: p95, P99: p95 * 2},
		E2E: report.Latency{P95: p95 * 10}, PromptTokens: 1000, CachedTokens: 500, CachedTokenRatio: 0.5,
		MaxShareOverMean: 1.2}
}

func with(m *report.Mode, f func(*report.Mode)) *report.Mode { f(m); return m }

// cell makes a one-cell result from policy → row (nil row: not run).
func cell(name string, arms ...Arm) *Result {
	pol := make([]string, len(arms))
	for i, a := range arms {
		pol[i] = a.Policy
	}
	return &Result{Policies: pol, Cells: []CellResult{{Cell: Cell{Workload: name, Level: "medium", Load: "25 req/s"}, Requests: 100, Arms: arms}}}
}

func TestAnalyze(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		name   string
		res    *Result
		ratios map[string]float64 // policy → p95 ÷ oracle (NaN: none)
		flag   map[string]string  // policy → a substring of its flags ("" : valid)
		losses []string           // "against" of every loss, in order
		unjudg bool
	}{
		{
			name: "all valid, prefix within 10% of oracle and peers",
			res: cell("w", Arm{Policy: "round-robin", Mode: mode(30)}, Arm{Policy: "prefix", Mode: mode(10.9)},
				Arm{Policy: "sglang", Mode: mode(10)}, Arm{Policy: "oracle", Mode: mode(10)}),
			ratios: map[string]float64{"round-robin": 3, "prefix": 1.09, "sglang": 1, "oracle": 1},
			flag:   map[string]string{"round-robin": "", "prefix": "", "sglang": "", "oracle": ""},
		},
		{
			name: "prefix more than 10% above oracle and one peer; a faster baseline is no loss",
			res: cell("w", Arm{Policy: "round-robin", Mode: mode(5)}, Arm{Policy: "prefix", Mode: mode(12)},
				Arm{Policy: "dynamo", Mode: mode(10)}, Arm{Policy: "llm-d", Mode: mode(11)}, Arm{Policy: "oracle", Mode: mode(10)}),
			ratios: map[string]float64{"prefix": 1.2, "dynamo": 1, "llm-d": 1.1},
			losses: []string{"dynamo", "oracle"},
		},
		{
			name: "an arm with errors is flagged, has no ratio and is not a loss",
			res: cell("w", Arm{Policy: "prefix", Mode: mode(12)},
				Arm{Policy: "chwbl", Mode: with(mode(5), func(m *report.Mode) { m.Errors = 3 })}, Arm{Policy: "oracle", Mode: mode(12)}),
			ratios: map[string]float64{"prefix": 1, "chwbl": nan},
			flag:   map[string]string{"chwbl": "3 errors", "prefix": ""},
		},
		{
			name: "a flagged oracle (no cache hits) gives no ratios; peers still judge prefix",
			res: cell("w", Arm{Policy: "prefix", Mode: mode(12)}, Arm{Policy: "sglang", Mode: mode(10)},
				Arm{Policy: "oracle", Mode: with(mode(5), func(m *report.Mode) { m.CachedTokens = 0 })}),
			ratios: map[string]float64{"prefix": nan, "sglang": nan, "oracle": nan},
			flag:   map[string]string{"oracle": "no cache hits"},
			losses: []string{"sglang"},
		},
		{
			name: "an arm that did not run is flagged with why; prefix without comparators is unjudged",
			res: cell("w", Arm{Policy: "prefix", Mode: mode(12)},
				Arm{Policy: "oracle", Error: `--modes: "oracle" is not one of`}),
			ratios: map[string]float64{"prefix": nan},
			flag:   map[string]string{"oracle": "not run: --modes"},
			unjudg: true,
		},
		{
			name: "a flagged prefix arm is not judged",
			res: cell("w", Arm{Policy: "prefix", Mode: mode(50), Error: "every request failed"},
				Arm{Policy: "oracle", Mode: mode(10)}),
			ratios: map[string]float64{"prefix": nan, "oracle": 1},
			flag:   map[string]string{"prefix": "failed: every request failed"},
			unjudg: true,
		},
		{
			name: "an arm that sent a different number of requests is flagged",
			res: cell("w", Arm{Policy: "prefix", Mode: mode(10)},
				Arm{Policy: "oracle", Mode: with(mode(10), func(m *report.Mode) { m.Requests = 99 })}),
			ratios: map[string]float64{"prefix": nan},
			flag:   map[string]string{"oracle": "99 requests"},
			unjudg: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := Analyze(tc.res)
			rows := map[string]Row{}
			for _, r := range b.Rows[0] {
				rows[r.Policy] = r
			}
			for p, want := range tc.ratios {
				got := rows[p].Ratio
				if math.IsNaN(want) != math.IsNaN(got) || (!math.IsNaN(want) && math.Abs(got-want) > 1e-9) {
					t.Errorf("%s: ratio %v, want %v", p, got, want)
				}
			}
			for p, want := range tc.flag {
				got := strings.Join(rows[p].Flags, "; ")
				if (want == "") != rows[p].Valid() || !strings.Contains(got, want) {
					t.Errorf("%s: flags %q valid %v, want %q", p, got, rows[p].Valid(), want)
				}
				if want != "" && !slices.Equal(tc.res.Cells[0].Arms[indexOf(tc.res, p)].Flags, rows[p].Flags) {
					t.Errorf("%s: Arm.Flags not set from the analysis", p)
				}
			}
			var against []string
			for _, l := range b.Losses {
				against = append(against, l.Against)
			}
			slices.Sort(against)
			if !slices.Equal(against, tc.losses) {
				t.Errorf("losses against %v, want %v", against, tc.losses)
			}
			if got := len(b.Unjudged) > 0; got != tc.unjudg {
				t.Errorf("unjudged %v, want %v", b.Unjudged, tc.unjudg)
			}
		})
	}
}

func indexOf(r *Result, policy string) int {
	for i, a := range r.Cells[0].Arms {
		if a.Policy == policy {
			return i
		}
	}
	return -1
}

func TestDigestFlags(t *testing.T) {
	cases := []struct {
		name    string
		digests map[string]string // policy → digest
		flagged []string
		note    string
	}{
		{"all equal", map[string]string{"a": "d1", "b": "d1", "c": "d1"}, nil, ""},
		{"one differs from the majority", map[string]string{"a": "d1", "b": "d2", "c": "d1"}, []string{"b"}, "2 digests"},
		{"one missing among reported", map[string]string{"a": "d1", "b": "", "c": "d1"}, []string{"b"}, ""},
		{"none reported", map[string]string{"a": "", "b": "", "c": ""}, nil, "not reported"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &CellResult{}
			for _, p := range []string{"a", "b", "c"} {
				c.Arms = append(c.Arms, Arm{Policy: p, Mode: &report.Mode{Mode: p}})
			}
			flags := make([][]string, len(c.Arms))
			digestFlags(c, flags, func(m report.Mode) string { return tc.digests[m.Mode] })
			var got []string
			for i, f := range flags {
				if len(f) > 0 {
					got = append(got, c.Arms[i].Policy)
				}
			}
			if !slices.Equal(got, tc.flagged) {
				t.Errorf("flagged %v, want %v", got, tc.flagged)
			}
			if notes := strings.Join(c.Notes, "; "); (tc.note == "") != (notes == "") || !strings.Contains(notes, tc.note) {
				t.Errorf("notes %q, want %q", notes, tc.note)
			}
		})
	}
}

func TestRender(t *testing.T) {
	res := cell("shared-prefix", Arm{Policy: "round-robin", Mode: mode(30)}, Arm{Policy: "prefix", Mode: mode(12)},
		Arm{Policy: "sglang", Mode: with(mode(5), func(m *report.Mode) { m.Errors = 2 })}, Arm{Policy: "oracle", Mode: mode(10)})
	res.Skipped = []Skip{{"mooncake", "not found at /nowhere/traces/conversation_trace.jsonl"}}
	out := Render(Analyze(res))
	for _, want := range []string{
		"skipped: mooncake (not found at /nowhere/traces/conversation_trace.jsonl)",
		"## shared-prefix medium (25 req/s), 100 requests per arm",
		"| prefix | 6.0 | 12.0 | 24.0 | 120 | 0.500 | 1.20 | 1.20 | - | ok |",
		"| sglang | 2.5 | 5.0 | 10.0 | 50.0 | 0.500 | 1.20 | - | - | FLAGGED: 2 errors |",
		"| shared-prefix medium | 1 | 3.00 | 1.20 | - | 1.00 |",
		"4 arms: 3 valid, 1 flagged",
		"shared-prefix medium · sglang: 2 errors",
		"requests digest not reported",
		"- shared-prefix medium: prefix 12.0 ms vs oracle 10.0 ms (1.20×)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scoreboard lacks %q:\n%s", want, out)
		}
	}
	// The errored peer is faster than prefix but must not be named a loss.
	if strings.Contains(out, "sglang 5.0 ms") {
		t.Errorf("a flagged arm was used as a comparator:\n%s", out)
	}
}

func TestParsePolicy(t *testing.T) {
	cases := []struct {
		in, mode, canon string
		routers         int
		err             bool
	}{
		{"prefix", "prefix", "prefix", 1, false},
		{"prefix×3", "prefix", "prefix×3", 3, false},
		{"prefix-x3", "prefix", "prefix×3", 3, false},
		{"prefix*2", "prefix", "prefix×2", 2, false},
		{"prefix-x1", "prefix", "prefix", 1, false},
		{"prefix×3+peer", "prefix", "prefix×3+peer", 3, false},
		{"prefix-x2+peer", "prefix", "prefix×2+peer", 2, false},
		{"prefix×1+peer", "", "", 0, true},
		{"prefix+peer", "", "", 0, true},
		{"prefix-x0", "", "", 0, true},
		{"oracle", "oracle", "oracle", 1, false},
		{"llm-d", "llm-d", "llm-d", 1, false},
		{"random", "", "", 0, true},
	}
	for _, tc := range cases {
		m, n, c, err := ParsePolicy(tc.in)
		if (err != nil) != tc.err || m != tc.mode || n != tc.routers || c != tc.canon {
			t.Errorf("ParsePolicy(%q) = %q %d %q %v, want %q %d %q err %v", tc.in, m, n, c, err, tc.mode, tc.routers, tc.canon, tc.err)
		}
	}
}

// TestRoutersBlock: each multi-router arm is compared with the cell's prefix arm on the
// several-replicas target (cached-token ratio ≥ 99%, TTFT p95 ≤ 1.15×); flagged arms are
// not judged; the tally
// counts the cells each arm meets it in.
func TestRoutersBlock(t *testing.T) {
	cached := func(m *report.Mode, r float64) *report.Mode { m.CachedTokenRatio = r; return m }
	res := cell("multi-turn", Arm{Policy: "prefix", Mode: mode(10)},
		Arm{Policy: "prefix×3", Mode: cached(mode(39), 0.49)},
		Arm{Policy: "prefix×3+peer", Mode: cached(mode(11), 0.4975)}, Arm{Policy: "oracle", Mode: mode(10)})
	second := cell("agentic", Arm{Policy: "prefix", Mode: mode(10)},
		Arm{Policy: "prefix×3", Mode: with(mode(10), func(m *report.Mode) { m.Errors = 1 })},
		Arm{Policy: "prefix×3+peer", Mode: mode(11.6)}, Arm{Policy: "oracle", Mode: mode(10)})
	res.Cells = append(res.Cells, second.Cells...)
	b := Analyze(res)
	want := []RouterCheck{{"multi-turn medium", "prefix×3", 0.98, 3.9, nil}, {"multi-turn medium", "prefix×3+peer", 0.995, 1.1, nil},
		{"agentic medium", "prefix×3+peer", 1, 1.16, nil}}
	if len(b.Routers) != len(want) {
		t.Fatalf("checks %+v, want %+v", b.Routers, want)
	}
	for i, w := range want {
		g := b.Routers[i]
		if g.Cell != w.Cell || g.Policy != w.Policy || math.Abs(g.Cached-w.Cached) > 1e-9 || math.Abs(g.P95-w.P95) > 1e-9 {
			t.Errorf("check %d: %+v, want %+v", i, g, w)
		}
	}
	if b.Routers[0].Meets() || !b.Routers[1].Meets() || b.Routers[2].Meets() {
		t.Errorf("verdicts: %v %v %v, want misses, meets, misses (p95 1.16× > 1.15×)", b.Routers[0].Meets(), b.Routers[1].Meets(), b.Routers[2].Meets())
	}
	out := Render(b)
	for _, w := range []string{
		"several prefixlb replicas against one (issue 16's target: cached-token ratio ≥ 99% of prefix's, TTFT p95 ≤ 1.15× prefix's)",
		"  - multi-turn medium: prefix×3 cached 0.980×, p95 3.90× (misses); prefix×3+peer cached 0.995×, p95 1.10× (meets)",
		"  - agentic medium: prefix×3+peer cached 1.000×, p95 1.16× (misses)",
		"prefix×3 meets it in 0 of 1 judged cells; prefix×3+peer meets it in 1 of 2 judged cells",
		"| cell | rounds | prefix | prefix×3 | prefix×3+peer | oracle |",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("scoreboard lacks %q:\n%s", w, out)
		}
	}
}

// TestPairedRounds: with several rounds, a multi-router arm's p95 is compared with the prefix
// arm's round by round (the median of the per-round ratios, not the ratio of the medians: a
// slow round slows both arms of it), cached tokens pooled over the rounds; one round or
// unequal rounds fall back to the combined rows.
func TestPairedRounds(t *testing.T) {
	rounds := func(policy string, p95s []float64, cached []int64) []Arm {
		out := make([]Arm, len(p95s))
		for i, p := range p95s {
			m := mode(p)
			m.CachedTokens = cached[i]
			m.CachedTokenRatio = float64(cached[i]) / float64(m.PromptTokens)
			out[i] = Arm{Policy: policy, Mode: m}
		}
		return out
	}
	cases := []struct {
		name       string
		one, x     []Arm
		cached     float64
		p95        float64
		byRound    []float64
		paired     bool
		renderLine string
	}{
		{name: "drift: paired median, not the ratio of medians",
			one: rounds("prefix", []float64{10, 20, 10}, []int64{500, 500, 500}), x: rounds("prefix×3+peer", []float64{11, 22, 30}, []int64{500, 400, 600}),
			cached: 1, p95: 1.1, byRound: []float64{1.1, 1.1, 3}, paired: true,
			renderLine: "prefix×3+peer cached 1.000×, p95 1.10× (meets), per-round p95 ratios 1.10 / 1.10 / 3.00"},
		{name: "cached pooled over the rounds, not their median",
			one: rounds("prefix", []float64{10, 10, 10}, []int64{500, 500, 500}), x: rounds("prefix×3+peer", []float64{10, 10, 10}, []int64{500, 500, 350}),
			cached: 0.9, p95: 1, byRound: []float64{1, 1, 1}, paired: true,
			renderLine: "prefix×3+peer cached 0.900×, p95 1.00× (misses), per-round p95 ratios 1.00 / 1.00 / 1.00"},
		{name: "one round: the rows", one: rounds("prefix", []float64{10}, []int64{500}), x: rounds("prefix×3+peer", []float64{12}, []int64{500}), cached: 1, p95: 1.2,
			renderLine: "prefix×3+peer cached 1.000×, p95 1.20× (misses)\n"},
		{name: "unequal rounds: the rows", one: rounds("prefix", []float64{10, 20}, []int64{500, 500}), x: rounds("prefix×3+peer", []float64{11, 22, 30}, []int64{500, 500, 500}),
			cached: 1, p95: 22.0 / 15},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := cell("oasst", Combine("prefix", tc.one), Combine("prefix×3+peer", tc.x))
			b := Analyze(res)
			if len(b.Routers) != 1 {
				t.Fatalf("checks %+v, want one", b.Routers)
			}
			g := b.Routers[0]
			if math.Abs(g.Cached-tc.cached) > 1e-9 || math.Abs(g.P95-tc.p95) > 1e-9 || !slices.Equal(g.Rounds, tc.byRound) {
				t.Errorf("check %+v, want cached %g p95 %g by round %v", g, tc.cached, tc.p95, tc.byRound)
			}
			out := Render(b)
			if tc.renderLine != "" && !strings.Contains(out, tc.renderLine) {
				t.Errorf("scoreboard lacks %q:\n%s", tc.renderLine, out)
			}
			if says := strings.Contains(out, "the median of the per-round ratios"); says != tc.paired {
				t.Errorf("the block says it compares round by round: %v, want %v:\n%s", says, tc.paired, out)
			}
		})
	}
}
