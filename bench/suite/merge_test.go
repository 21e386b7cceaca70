package suite

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/report"
)

// part is a suite run of the given cells, each with arms prefix, sglang and oracle whose
// rounds have these TTFT p95s, analysed and written to and read back from suite.json as `bench
// suite` and `bench suite merge` do.
func part(t *testing.T, commit string, started time.Time, cells ...CellResult) (*Result, string) {
	t.Helper()
	r := &Result{Started: started, Seed: 1, Policies: []string{"prefix", "sglang", OraclePolicy}, WallS: 60,
		Commit: commit, Machine: "linux/amd64, 2 CPUs, host h", Cells: cells}
	Analyze(r)
	p := filepath.Join(t.TempDir(), "suite.json")
	if err := WriteJSON(p, r); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(p)
	if err != nil {
		t.Fatal(err)
	}
	return back, p
}

// cellOf is one cell whose arms ran len(prefix) rounds: prefix's, sglang's and the oracle's
// TTFT p95 per round.
func cellOf(workload, level string, prefix, sglang, oracle []float64) CellResult {
	arm := func(p string, p95s []float64) Arm {
		a := rounds(p, p95s, func(_ int, m *report.Mode) { m.RequestsDigest = "d" })
		a.Mode.Mode = p
		return a
	}
	return CellResult{Cell: Cell{Workload: workload, Level: level, Load: "0.1 sessions/s", Rate: 0.1, Rounds: len(prefix)},
		Requests: 100, Replicas: 4, Speedup: 16, Params: map[string]any{"sessions": 12, "kv_tokens": 144000},
		Arms: []Arm{arm("prefix", prefix), arm("sglang", sglang), arm(OraclePolicy, oracle)}}
}

// TestMergePoolsRounds: two parts that ran the same cell pool its rounds (round i still paired
// across arms), cells that one part ran pass through, the union is in plan order, and the
// merged result lists each part with its commit, machine and start.
func TestMergePoolsRounds(t *testing.T) {
	t0 := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	a, pa := part(t, "abc", t0.Add(time.Hour),
		cellOf("mooncake", "light", []float64{10, 11}, []float64{12, 12}, []float64{10, 10}),
		cellOf("agentic", "medium", []float64{10, 30}, []float64{20, 20}, []float64{10, 10}))
	b, pb := part(t, "abc", t0, cellOf("agentic", "medium", []float64{20}, []float64{20}, []float64{10}))
	m, err := Merge([]*Result{a, b}, []string{pa, pb})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Cells) != 2 || m.Cells[0].Name() != "agentic medium" || m.Cells[1].Name() != "mooncake light" {
		t.Fatalf("cells %v, want agentic medium then mooncake light", []string{m.Cells[0].Name(), m.Cells[1].Name()})
	}
	ag := m.Cells[0]
	if ag.Rounds != 3 || len(ag.Arms[0].Rounds) != 3 || ag.Arms[0].Mode.TTFT.P95 != 20 {
		t.Fatalf("pooled cell: %d rounds, prefix rounds %d, median p95 %g; want 3, 3, 20", ag.Rounds, len(ag.Arms[0].Rounds), ag.Arms[0].Mode.TTFT.P95)
	}
	bd := Analyze(m)
	// prefix ÷ sglang per round: 0.5, 1.5 (part a), 1 (part b): the same as one run of 3 rounds.
	want := pairedP95Ratio(&[]Arm{rounds("prefix", []float64{10, 30, 20}, nil)}[0], &[]Arm{rounds("sglang", []float64{20, 20, 20}, nil)}[0])
	got := bd.Rows[0][1].PrefixOver
	if got == nil || !got.HasInterval() || math.Abs(got.Hi-want.Hi) > 1e-12 || math.Abs(got.Ratio-want.Ratio) > 1e-12 {
		t.Errorf("pooled prefix ÷ sglang %+v, want %+v", got, want)
	}
	if len(bd.Targets) != 2 || bd.Targets[0].Peers[0].Ratio.Hi != got.Hi {
		t.Errorf("the targets do not judge the pooled interval: %+v", bd.Targets)
	}
	if len(m.Parts) != 2 || m.Parts[0].Source != pa || m.Parts[1].Commit != "abc" || !m.Started.Equal(t0) || m.WallS != 120 ||
		m.Commit != "abc" || m.Parts[0].Cells[1] != "agentic medium" {
		t.Errorf("parts %+v, started %v, wall %g, commit %q", m.Parts, m.Started, m.WallS, m.Commit)
	}
	out := Render(bd)
	for _, w := range []string{"Merged from 2 parts", pa + ": mooncake light, agentic medium · commit abc · linux/amd64, 2 CPUs, host h · started 2027-01-02T04:04:05Z, 1m0s"} {
		if !strings.Contains(out, w) {
			t.Errorf("scoreboard lacks %q:\n%s", w, out)
		}
	}

	// A merged result merges again: its parts are kept, its cells pooled further.
	c, pc := part(t, "abc", t0, cellOf("agentic", "medium", []float64{40}, []float64{20}, []float64{10}))
	var buf bytes.Buffer
	dir := t.TempDir()
	if err := Score(m, dir, &buf); err != nil {
		t.Fatal(err)
	}
	mm, err := ReadJSON(filepath.Join(dir, "suite.json"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Merge([]*Result{mm, c}, []string{"all/suite.json", pc})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Parts) != 3 || again.Cells[0].Rounds != 4 || len(again.Cells[0].Arms[2].Rounds) != 4 {
		t.Errorf("merging a merge: %d parts, %d rounds", len(again.Parts), again.Cells[0].Rounds)
	}
	if f := Analyze(again).Rows[0]; f[0].Flags != nil || f[1].Flags != nil {
		t.Errorf("pooled arms flagged: %v %v", f[0].Flags, f[1].Flags)
	}
}

// TestMergeRefusesMismatchedPools: rounds of one cell are pooled only when both parts ran it
// with the same settings, arms and commit; the error names the cell, both parts and what
// differs. Other cells may come from other commits.
func TestMergeRefusesMismatchedPools(t *testing.T) {
	base := func() CellResult {
		return cellOf("agentic", "medium", []float64{10, 11}, []float64{12, 12}, []float64{10, 10})
	}
	cases := []struct {
		name    string
		commit  string
		edit    func(*CellResult, *Result)
		wantErr string // "" : merges
	}{
		{"same", "abc", nil, ""},
		{"load", "abc", func(c *CellResult, _ *Result) { c.Load = "0.2 sessions/s" }, "load 0.1 sessions/s vs 0.2 sessions/s"},
		{"requests", "abc", func(c *CellResult, _ *Result) { c.Requests = 90 }, "requests 100 vs 90"},
		{"KV cache", "abc", func(c *CellResult, _ *Result) { c.Params["kv_tokens"] = 432000 }, "workload parameters"},
		{"speedup", "abc", func(c *CellResult, _ *Result) { c.Speedup = 8 }, "speedup 16 vs 8"},
		{"arms", "abc", func(c *CellResult, _ *Result) { c.Arms = c.Arms[:2] }, "arms [oracle, prefix, sglang] vs [prefix, sglang]"},
		{"commit", "def", nil, "commit abc vs def"},
		{"unknown commit is not compared", "", nil, ""},
		{"seed", "abc", func(_ *CellResult, r *Result) { r.Seed = 2 }, "--seed 2"},
		{"quick", "abc", func(_ *CellResult, r *Result) { r.Quick = true }, "--quick"},
		{"an arm short of the cell's rounds", "abc", func(c *CellResult, _ *Result) { c.Arms[1] = c.Arms[1].Rounds[0] }, "arm sglang has 1 rounds, the cell 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, pa := part(t, "abc", time.Now(), base())
			b, pb := part(t, tc.commit, time.Now(), base())
			if tc.edit != nil {
				tc.edit(&b.Cells[0], b)
			}
			_, err := Merge([]*Result{a, b}, []string{pa, pb})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
			}
			if (tc.name != "seed" && tc.name != "quick") && !strings.Contains(err.Error(), pb) {
				t.Errorf("error %v does not name the part", err)
			}
			if tc.name != "seed" && tc.name != "quick" && tc.name != "an arm short of the cell's rounds" &&
				!strings.Contains(err.Error(), "cell agentic medium: "+pa+" and "+pb+" cannot be pooled") {
				t.Errorf("error %v does not name the cell and both parts", err)
			}
		})
	}
	// Different cells from different commits merge, and the merged commit is none of them.
	a, pa := part(t, "abc", time.Now(), base())
	b, pb := part(t, "def", time.Now(), cellOf("oasst", "light", []float64{1, 1}, []float64{1, 1}, []float64{1, 1}))
	m, err := Merge([]*Result{a, b}, []string{pa, pb})
	if err != nil || m.Commit != "" || m.Parts[1].Commit != "def" {
		t.Errorf("cells of two commits: %v, commit %q", err, m.Commit)
	}
}

func TestKeepCells(t *testing.T) {
	var cells []Cell
	for _, w := range []string{"multi-turn", "agentic", "mooncake"} {
		for _, l := range []string{"light", CachePressure} {
			cells = append(cells, Cell{Workload: w, Level: l})
		}
	}
	names := func(cs []Cell) string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Name())
		}
		return strings.Join(n, ", ")
	}
	for _, tc := range []struct {
		patterns []string
		want     string
		err      string
	}{
		{nil, names(cells), ""},
		{[]string{"agentic/*", "mooncake/cache-pressure"}, "agentic light, agentic cache-pressure, mooncake cache-pressure", ""},
		{[]string{"*/cache-pressure"}, "multi-turn cache-pressure, agentic cache-pressure, mooncake cache-pressure", ""},
		{[]string{"mooncake"}, "mooncake light, mooncake cache-pressure", ""},
		{[]string{"agentc/*"}, "", `no workload matches "agentc"`},
		{[]string{"agentic/heavy"}, "", `no level matches "heavy"`},
		{[]string{"agentic/light/x"}, "", "is not WORKLOAD/LEVEL"},
		{[]string{"[/light"}, "", "is not WORKLOAD/LEVEL"},
	} {
		got, err := KeepCells(cells, tc.patterns)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.patterns, err, tc.err)
			}
			continue
		}
		if err != nil || names(got) != tc.want {
			t.Errorf("%v: %q (%v), want %q", tc.patterns, names(got), err, tc.want)
		}
	}
	if got := CellWorkloads([]string{"agentic/*", "moon*/light"}); strings.Join(got, ",") != "agentic,mooncake" {
		t.Errorf("CellWorkloads %v", got)
	}
}
