package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/overhead"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/suite"
)

// bench/RESULTS.md is exactly what the committed claim files render: a table edited by hand,
// or a claim file changed without regenerating, fails here.
func TestResultsMarkdownIsGenerated(t *testing.T) {
	if err := checkDir(".", filepath.Join("..", "RESULTS.md")); err != nil {
		t.Fatal(err)
	}
}

// Every committed claim loads (no unknown field, one kind, every heading filled) and says
// where its figures came from.
func TestCommittedClaimsAreComplete(t *testing.T) {
	claims, err := loadClaims(".")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, c := range claims {
		k, err := c.kind()
		if err != nil {
			t.Fatal(err)
		}
		kinds[k] = true
	}
	for _, k := range []string{"compare", "suite", "replicas", "overhead"} {
		if !kinds[k] {
			t.Errorf("no claim of kind %s: RESULTS.md lost a claim", k)
		}
	}
}

// claimDir is a temporary claims directory holding one claim of the given kind, with an
// earlier run's command, commit, machine and note.
func claimDir(t *testing.T, name string, set func(*Claim)) string {
	t.Helper()
	dir := t.TempDir()
	c := &Claim{Name: name, Title: "T", Claim: "C", Command: "old command", Commit: "old", Machine: "old machine",
		Source: "old source", Notes: []string{"a note about the old run"}}
	set(c)
	if err := c.save(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func importInto(t *testing.T, dir, name string, paths ...string) (*Claim, string) {
	t.Helper()
	c, err := loadClaim(filepath.Join(dir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := importRun(c, run{Command: "new command", Commit: "abc1234", Machine: "2 cores"}, paths); err != nil {
		t.Fatal(err)
	}
	if err := c.save(dir); err != nil {
		t.Fatal(err)
	}
	md, err := renderDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Commit != "abc1234" || c.Command != "new command" || len(c.Notes) != 0 || strings.Contains(md, "old run") {
		t.Errorf("import kept the old run's metadata or notes: %+v", c)
	}
	return c, md
}

func mode(name string, p95 float64, cached int64) report.Mode {
	return report.Mode{Mode: name, Requests: 100, RPS: 10, OutputTPS: 500, CachedTokenRatio: float64(cached) / 1000,
		PromptTokens: 1000, CachedTokens: cached, MaxShareOverMean: 1.1,
		TTFT: report.Latency{P50: p95 / 2, P95: p95, P99: 2 * p95}, ITL: report.Latency{P50: 0.8}, E2E: report.Latency{P95: 10 * p95}}
}

// A bench compare report.json, written by the bench's own writer, replaces a compare claim's
// table; two files (one mode per run) become one table; a file of another workload is refused.
func TestImportCompare(t *testing.T) {
	dir := claimDir(t, "mt", func(c *Claim) {
		c.Compare = &CompareResult{Workload: "multi-turn", Modes: []report.Mode{mode("prefix", 99, 1)}}
	})
	runs := t.TempDir()
	rr := &report.Report{Workload: "multi-turn", Replicas: 4, Speedup: 8, Modes: []report.Mode{mode("round-robin", 30, 840)}}
	pfx := &report.Report{Workload: "multi-turn", Replicas: 4, Speedup: 8, Modes: []report.Mode{mode("prefix", 5, 973)}}
	for name, r := range map[string]*report.Report{"rr.json": rr, "prefix.json": pfx} {
		if err := r.WriteJSON(filepath.Join(runs, name)); err != nil {
			t.Fatal(err)
		}
	}
	_, md := importInto(t, dir, "mt", filepath.Join(runs, "rr.json"), filepath.Join(runs, "prefix.json"))
	for _, want := range []string{
		"| round-robin | 100 | 0 | 15.0 | 30.0 | 60.0 | 0.8 | 300 | 10.00 | 500 | 0.840 | 1.10 |",
		"| prefix | 100 | 0 | 2.5 | 5.0 | 10.0 | 0.8 | 50.0 | 10.00 | 500 | 0.973 | 1.10 |",
		"TTFT p95 is 6.0× below round-robin's",
		"`--speedup 8`",
		"- commit: abc1234",
		"`rr.json`, `prefix.json`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("rendered claim lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| prefix | 100 | 0 | 50.0") {
		t.Error("the old run's row survived the import")
	}
	other := &report.Report{Workload: "mooncake", Modes: []report.Mode{mode("least-load", 1, 1)}}
	if err := other.WriteJSON(filepath.Join(runs, "other.json")); err != nil {
		t.Fatal(err)
	}
	c, _ := loadClaim(filepath.Join(dir, "mt.json"))
	err := importRun(c, run{Command: "x", Commit: "x", Machine: "x"}, []string{filepath.Join(runs, "rr.json"), filepath.Join(runs, "other.json")})
	if err == nil || !strings.Contains(err.Error(), "workload") {
		t.Errorf("importing two workloads into one table: %v, want an error naming the workload", err)
	}
}

// A suite.json, written by the suite's own writer, becomes the p95 ÷ oracle matrix (the
// suite's own Analyze) for a suite claim and the multi-router comparison for a replicas claim.
func TestImportSuite(t *testing.T) {
	arm := func(p string, m report.Mode) suite.Arm { m.Mode = p; return suite.Arm{Policy: p, Mode: &m} }
	policies := []string{"round-robin", "prefix", "prefix×3+peer", "oracle"}
	res := &suite.Result{Policies: policies, Cells: []suite.CellResult{{
		Cell:     suite.Cell{Workload: "multi-turn", Level: "closed"},
		Requests: 100,
		Arms: []suite.Arm{arm("round-robin", mode("", 40, 840)), arm("prefix", mode("", 5, 970)),
			arm("prefix×3+peer", mode("", 5.5, 965)), arm("oracle", mode("", 4, 980))},
	}}}
	runs := t.TempDir()
	path := filepath.Join(runs, "suite.json")
	if err := suite.WriteJSON(path, res); err != nil {
		t.Fatal(err)
	}

	dir := claimDir(t, "s", func(c *Claim) { c.Suite = &SuiteScores{Policies: []string{"x"}} })
	c, md := importInto(t, dir, "s", path)
	if got := len(c.Suite.Cells); got != 1 {
		t.Fatalf("%d cells, want 1", got)
	}
	if !strings.Contains(md, "| multi-turn closed | 1 | 10.00 | 1.25 | 1.38 | 1.00 | not judged |") {
		t.Errorf("p95 ÷ oracle row missing or wrong:\n%s", md)
	}

	dir = claimDir(t, "r", func(c *Claim) { c.Replicas = &ReplicaScores{Policy: "prefix×3+peer"} })
	c, md = importInto(t, dir, "r", path)
	if len(c.Replicas.Cells) != 1 {
		t.Fatalf("replica cells %+v, want one", c.Replicas.Cells)
	}
	// cached 0.965 ÷ 0.970 = 0.995 (meets ≥ 0.99), p95 5.5 ÷ 5 = 1.10 (meets ≤ 1.15).
	if !strings.Contains(md, "| multi-turn closed | 0.995 | 1.10 | – | yes |") {
		t.Errorf("replica row missing or wrong:\n%s", md)
	}

	dir = claimDir(t, "r2", func(c *Claim) { c.Replicas = &ReplicaScores{Policy: "prefix×5+peer"} })
	c, _ = loadClaim(filepath.Join(dir, "r2.json"))
	if err := importRun(c, run{Command: "x", Commit: "x", Machine: "x"}, []string{path}); err == nil {
		t.Error("a suite.json without the claim's arm imported without an error")
	}
}

// An overhead.json, written by the harness's own writer, replaces an overhead claim's table;
// the ratios are the harness's own Derive.
func TestImportOverhead(t *testing.T) {
	cpu := 0.05
	row := func(target string, rps, p50 float64) overhead.Row {
		return overhead.Row{Target: target, BodyBytes: 16 << 10, Shape: overhead.ShapeChat, RPS: rps, P50us: p50,
			LatRequests: 1000, SatCPUPer1k: &cpu, PeakRSSBytes: 30 << 20}
	}
	rep := &overhead.Report{Rows: []overhead.Row{row(overhead.TargetDirect, 20000, 200), row(overhead.TargetHAProxy, 10000, 400),
		row(overhead.TargetPrefixlbPfx, 9000, 450)},
		Routing: []overhead.RoutingResult{{BodyBytes: 16 << 10, Shape: overhead.ShapeChat, P50us: 6.2, P99us: 40, PickP50us: 1.3, LearnP50us: 2.1}}}
	runs := t.TempDir()
	path, err := overhead.WriteJSON(rep, runs)
	if err != nil {
		t.Fatal(err)
	}
	dir := claimDir(t, "o", func(c *Claim) { c.Overhead = &OverheadResult{} })
	_, md := importInto(t, dir, "o", path)
	for _, want := range []string{
		"| 16 KB | prefixlb prefix | 9000 | 0.90 | 450 | +250 | 0.050 | 30.0 |",
		"| 16 KB | HAProxy | 10000 | 1.00 | 400 | +200 | 0.050 | 30.0 |",
		"| 16 KB | 6.2 | 40 | 1.3 | 2.1 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("rendered claim lacks %q:\n%s", want, md)
		}
	}
}

// A claim file with a misspelt field, no result or two results is refused, so that a figure
// is never silently dropped from the table.
func TestClaimFilesAreChecked(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"typo":  `{"title":"T","claim":"C","command":"c","commit":"c","machine":"m","source":"s","compare":{"workload":"w","modes":[{"mode":"prefix","ttft":{"p95_msec":1}}]}}`,
		"none":  `{"title":"T","claim":"C","command":"c","commit":"c","machine":"m","source":"s"}`,
		"two":   `{"title":"T","claim":"C","command":"c","commit":"c","machine":"m","source":"s","suite":{"policies":[],"cells":[]},"overhead":{"rows":[]}}`,
		"empty": `{"title":"T","claim":"C","command":"","commit":"c","machine":"m","source":"s","suite":{"policies":[],"cells":[]}}`,
	} {
		p := filepath.Join(dir, name+".json")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := loadClaim(p); err == nil {
			t.Errorf("claim %s loaded without an error", name)
		}
	}
}

// A compare claim from the overload workload renders its per-tenant table under the modes'.
func TestRenderCompareTenants(t *testing.T) {
	r := &CompareResult{Workload: "overload", Replicas: 2, Modes: []report.Mode{{Mode: "prefix", Requests: 3,
		Tenants: []report.Tenant{{Name: "chat", Priority: 1, Requests: 3, Completed: 3}}}}}
	var b strings.Builder
	renderCompare(&b, r)
	if !strings.Contains(b.String(), "| prefix | chat | 1 | 3 | 3 | 0 | 0 | 0 |") {
		t.Fatalf("no tenant row:\n%s", b.String())
	}
}

// A suite.json merged from two parts (bench suite merge) imports into a suite claim: both
// ratio matrices with their intervals over the pooled rounds, the targets judged on the
// intervals, and every part with its commit and machine.
func TestImportMergedSuite(t *testing.T) {
	arm := func(p string, p95s ...float64) suite.Arm {
		rs := make([]suite.Arm, len(p95s))
		for i, v := range p95s {
			m := mode(p, v, 500)
			m.RequestsDigest = "d"
			rs[i] = suite.Arm{Policy: p, Mode: &m}
		}
		return suite.Combine(p, rs)
	}
	policies := []string{"round-robin", "prefix", "sglang", "oracle"}
	part := func(commit string, rr, pre, sgl, orc []float64) string {
		res := &suite.Result{Seed: 1, Policies: policies, WallS: 600, Commit: commit, Machine: "2 shared cores",
			Started: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
			Cells: []suite.CellResult{{Cell: suite.Cell{Workload: "agentic", Level: "medium", Rounds: len(pre)}, Requests: 100, Replicas: 4, Speedup: 16,
				Arms: []suite.Arm{arm("round-robin", rr...), arm("prefix", pre...), arm("sglang", sgl...), arm("oracle", orc...)}}}}
		suite.Analyze(res)
		p := filepath.Join(t.TempDir(), "suite.json")
		if err := suite.WriteJSON(p, res); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// prefix ÷ sglang per round 0.5, 0.5 | 0.5: wholly below 1; prefix ÷ oracle 1, 1 | 1.
	p1 := part("abc", []float64{40, 40}, []float64{10, 10}, []float64{20, 20}, []float64{10, 10})
	p2 := part("abc", []float64{40}, []float64{10}, []float64{20}, []float64{10})
	var parts []*suite.Result
	for _, p := range []string{p1, p2} {
		r, err := suite.ReadJSON(p)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, r)
	}
	merged, err := suite.Merge(parts, []string{p1, p2})
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := suite.Score(merged, out, io.Discard); err != nil {
		t.Fatal(err)
	}
	dir := claimDir(t, "s", func(c *Claim) { c.Suite = &SuiteScores{Policies: []string{"x"}} })
	c, md := importInto(t, dir, "s", filepath.Join(out, "suite.json"))
	if got := c.Suite; got.TargetsJudged != 1 || got.TargetsMet != 1 || !got.Intervals || len(got.Parts) != 2 || got.Cells[0].Rounds != 3 {
		t.Errorf("suite scores %+v", got)
	}
	for _, want := range []string{
		"| agentic medium | 3 | 4.00 [4.00–4.00] | 1.00 [1.00–1.00] | 2.00 [2.00–2.00] | 1.00 [1.00–1.00] | met |",
		"| cell | rounds | round-robin | sglang | prefix's targets |",
		"| agentic medium | 3 | 0.25 [0.25–0.25] | 0.50 [0.50–0.50] | met |",
		"Every target met in 1 of 1 cells; not met in 0; not shown in 0.",
		"upper end ≤ the bound",
		"Merged from 2 parts",
		"1. agentic medium · commit abc · 2 shared cores · started 2027-01-01T00:00:00Z, 10m0s",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("rendered claim lacks %q:\n%s", want, md)
		}
	}
}

// A suite.json of the overload workload's fair-shares cell imports into a suite claim with
// its per-tenant rows and issue 56's target rows (the suite's own FlowTargets), and renders
// both; with no oracle arm, no p95 ÷ oracle matrix.
func TestImportSuiteFlowControl(t *testing.T) {
	round := func(p string, jain float64) suite.Arm {
		m := mode(p, 60, 500) // cache hits: an arm without any is flagged
		m.OutputTPS, m.Requests = 1000, 200
		m.Tenants = []report.Tenant{
			{Name: "light", Priority: 1, Requests: 100, Completed: 100, TTFT: report.Latency{P50: 30, P95: 60, P99: 120}, GoodputShare: 1, GPUWorkShare: 0.5},
			{Name: "heavy", Priority: 1, Requests: 100, Completed: 100, TTFT: report.Latency{P50: 450, P95: 900, P99: 1800}, GoodputShare: 0.1, GPUWorkShare: 0.5},
		}
		m.Fairness = []report.Fairness{{Priority: 1, Tenants: []string{"light", "heavy"}, Jain: &jain}}
		return suite.Arm{Policy: p, Mode: &m}
	}
	res := &suite.Result{Policies: []string{suite.PrefixPolicy, suite.FlowPolicy}, Cells: []suite.CellResult{{
		Cell:     suite.Cell{Workload: suite.OverloadWorkload, Level: suite.FairSharesLevel, Rounds: 3},
		Requests: 200,
		Arms: []suite.Arm{
			suite.Combine(suite.PrefixPolicy, []suite.Arm{round(suite.PrefixPolicy, 0.6), round(suite.PrefixPolicy, 0.61), round(suite.PrefixPolicy, 0.62)}),
			suite.Combine(suite.FlowPolicy, []suite.Arm{round(suite.FlowPolicy, 0.97), round(suite.FlowPolicy, 0.98), round(suite.FlowPolicy, 0.99)}),
		},
	}}}
	path := filepath.Join(t.TempDir(), "suite.json")
	if err := suite.WriteJSON(path, res); err != nil {
		t.Fatal(err)
	}
	dir := claimDir(t, "fc", func(c *Claim) { c.Suite = &SuiteScores{Policies: []string{"x"}} })
	c, md := importInto(t, dir, "fc", path)
	if len(c.Suite.Tenants) != 1 || len(c.Suite.Tenants[0].Rows) != 4 {
		t.Fatalf("tenant rows %+v, want one cell of 2 arms × 2 tenants", c.Suite.Tenants)
	}
	for _, want := range []string{
		"Per tenant, overload fair-shares (medians over 3 round(s)",
		"| prefix+fc | light | 1 | 100 | 100 |",
		"| overload fair-shares | prefix+fc Jain ≥ 0.95 | 0.98 [",
		"| overload fair-shares | prefix Jain ≥ 0.95 | 0.61 [",
		"prefix+fc on these targets together: met.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("rendered claim lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "÷ the oracle's p95 in the same cell") {
		t.Errorf("a p95 ÷ oracle matrix without an oracle arm:\n%s", md)
	}
}
