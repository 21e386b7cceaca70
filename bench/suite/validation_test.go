package suite

import (
	"context"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/sim"
)

// TestParsePolicyRouterCountOverflow: prefix×N is accepted for 1..MaxRouters and refused
// beyond, overflow included (with strconv.Atoi's overflow error dropped, n = MaxInt64 would
// pass and the suite would try to start that many in-process replicas per arm).
func TestParsePolicyRouterCountOverflow(t *testing.T) {
	for _, tc := range []struct {
		p    string
		n    int
		fail bool
	}{
		{"prefix×1", 1, false}, {"prefix-x16", MaxRouters, false},
		{"prefix×17", 0, true}, {"prefix×0", 0, true}, {"prefix×99999999999999999999", 0, true}, {"prefix-x100000", 0, true},
	} {
		_, n, canon, err := ParsePolicy(tc.p)
		if tc.fail {
			if err == nil || !strings.Contains(err.Error(), "1..16") {
				t.Errorf("ParsePolicy(%q) = %d routers (%s), %v; want an error giving 1..16", tc.p, n, canon, err)
			}
		} else if err != nil || n != tc.n {
			t.Errorf("ParsePolicy(%q) = %d, %v; want %d", tc.p, n, err, tc.n)
		}
	}
}

// TestRunRejectsDuplicatePolicies: "prefix" and "prefix×1" (or "prefix" twice) canonicalise to
// the same arm name; the cell then has two "prefix" rows, the ratio matrix and the plot show
// only the last one and "where prefix loses" judges only the last valid one.
func TestRunRejectsDuplicatePolicies(t *testing.T) {
	cells, _, err := Plan(true, []string{"multi-turn"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // run no arm
	var out strings.Builder
	_, err = Run(ctx, Options{Policies: []string{"prefix", "prefix×1", "oracle"}, Quiet: true, Stdout: &out, Stderr: &out}, cells, nil)
	if err == nil || !strings.Contains(err.Error(), "same arm") {
		t.Fatalf("Run with policies prefix and prefix×1: err %v, want a duplicate-policy error", err)
	}
}

// TestExplicitWorkloadWithoutDataSaysWhy: `bench suite --workloads mooncake` without the
// shared data fails with "suite: no cells to run" and never says that mooncake was skipped
// because its trace is not at PATH (the skip reason is only printed when some cell runs).
func TestExplicitWorkloadWithoutDataSaysWhy(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PREFIXLB_SHARED", dir)
	c := Command()
	c.SetArgs([]string{"--quick", "--workloads", "mooncake", "--out", ""})
	var out strings.Builder
	c.SetOut(&out)
	c.SetErr(&out)
	err := c.Execute()
	if err == nil {
		t.Fatal("no error")
	}
	if msg := err.Error(); !strings.Contains(msg, "mooncake skipped: not found at "+dir) {
		t.Errorf("error %q (output %q) does not say the mooncake trace was not found", err, out.String())
	}
}

// TestLossesSayWhenOracleFlagged: a cell whose oracle arm is flagged but whose peers are valid
// is judged against the peers only; the "where prefix loses" block neither lists it as not
// judged nor says the oracle comparison was skipped, so a reader takes "nowhere" to include
// the oracle.
func TestLossesSayWhenOracleFlagged(t *testing.T) {
	mode := func(name string, p95 float64, errs int) *report.Mode {
		m := &report.Mode{Mode: name, Requests: 10, Errors: errs, PromptTokens: 100, CachedTokens: 50, RequestsDigest: "d"}
		m.TTFT.P95 = p95
		return m
	}
	r := &Result{Policies: []string{"prefix", "sglang", "oracle"}, Cells: []CellResult{{
		Cell: Cell{Workload: "w", Level: "l"}, Requests: 10,
		Arms: []Arm{{Policy: "prefix", Mode: mode("prefix", 300, 0)}, {Policy: "sglang", Mode: mode("sglang", 300, 0)},
			{Policy: "oracle", Mode: mode("oracle", 100, 1)}}}}}
	out := Render(Analyze(r))
	block := out[strings.Index(out, "## Where prefix loses"):]
	block = block[strings.Index(block, "\n"):] // past the heading, which names the oracle
	t.Log(block)
	if !strings.Contains(block, "peers only (the oracle arm is flagged") || !strings.Contains(block, "w l") {
		t.Errorf("prefix at 3× the (flagged) oracle reads as losing nowhere, with no word on the oracle:\n%s", block)
	}
}

// TestQuickAgenticHasASubAgent: the --quick agentic cell forks at least one sub-agent (at 3
// sessions of 5 requests it had none and every policy's p95 was the cold prefill).
func TestQuickAgenticHasASubAgent(t *testing.T) {
	cells, _, err := Plan(true, []string{"agentic"})
	if err != nil || len(cells) != 1 {
		t.Fatalf("Plan: %v, %d cells", err, len(cells))
	}
	cfg := sim.DefaultConfig()
	w, err := bench.BuildWorkload("agentic", cells[0].Options.Flags, cells[0].Options.Replicas, int64(cfg.KVCacheTokens()), cfg.MaxModelLen)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := w.Params["sub_agents"].(int); n < 1 {
		t.Errorf("quick agentic cell: %v sub-agents, want >= 1", w.Params["sub_agents"])
	}
}
