package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench"
)

func TestPlotWritesPNG(t *testing.T) {
	cases := []struct {
		name string
		res  *Result
	}{
		{"ratios", cell("w", Arm{Policy: "round-robin", Mode: mode(30)}, Arm{Policy: "prefix", Mode: mode(12)}, Arm{Policy: "oracle", Mode: mode(10)})},
		{"no oracle: no bars", cell("w", Arm{Policy: "prefix", Mode: mode(12)}, Arm{Policy: "oracle", Error: "not in this build"})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.res.Cells = append(tc.res.Cells, tc.res.Cells[0])
			tc.res.Cells[1].Level = "light"
			path := filepath.Join(t.TempDir(), "suite.png")
			if err := Plot(path, Analyze(tc.res)); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			img, err := png.Decode(f)
			if err != nil {
				t.Fatalf("suite.png is not a PNG: %v", err)
			}
			if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
				t.Errorf("suite.png is %v", b)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	t.Setenv("PREFIXLB_SHARED", t.TempDir()) // no traces, no datasets
	for _, quick := range []bool{false, true} {
		cells, skipped, err := Plan(quick, nil)
		if err != nil {
			t.Fatal(err)
		}
		levels := map[string][]string{}
		for _, c := range cells {
			levels[c.Workload] = append(levels[c.Workload], c.Level)
			if c.Options.Workload != c.Workload || c.Options.Replicas < 1 {
				t.Errorf("%s: options %+v", c.Name(), c.Options)
			}
			if c.Workload == "shared-prefix" && c.Rate != c.Options.Flags.Rate {
				t.Errorf("%s: rate %g, flags %g", c.Name(), c.Rate, c.Options.Flags.Rate)
			}
		}
		wantMT, wantSP := []string{"closed"}, []string{"light", "medium", "near-saturation"}
		if quick {
			wantSP = []string{"medium"}
		}
		if !slices.Equal(levels["multi-turn"], wantMT) || !slices.Equal(levels["shared-prefix"], wantSP) {
			t.Errorf("quick=%v: levels %v", quick, levels)
		}
		reasons := map[string]string{}
		for _, s := range skipped {
			reasons[s.Workload] = s.Reason
		}
		for _, w := range []string{"mooncake", "oasst"} {
			if !strings.HasPrefix(reasons[w], "not found at ") || len(levels[w]) > 0 {
				t.Errorf("quick=%v: %s without data: skip %q, levels %v", quick, w, reasons[w], levels[w])
			}
		}
		if has := slices.Contains(bench.Workloads, "agentic"); has == (reasons["agentic"] != "") {
			t.Errorf("agentic in bench %v, skipped %q", has, reasons["agentic"])
		}
	}
	if _, _, err := Plan(true, []string{"multi-turn", "nope"}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown workload: %v", err)
	}
	cells, _, err := Plan(false, []string{"shared-prefix"})
	if err != nil || len(cells) != 3 {
		t.Errorf("--workloads shared-prefix: %d cells, %v", len(cells), err)
	}
}

// Tiny real cells for the smoke test: a handful of requests on 2 sims at 20× speed.
const (
	smokeSpeedup  = 20
	smokeReplicas = 2
	smokeTimeout  = 2 * time.Minute // bound on the whole smoke run, far above its seconds
)

// TestSuiteSmoke runs a tiny real suite end to end: two workloads, real sims and in-process
// prefixlbs on 127.0.0.1, through bench.Compare, to the scoreboard, suite.json and suite.png.
func TestSuiteSmoke(t *testing.T) {
	tiny := func(w string, f bench.WorkloadFlags) bench.Options {
		o := bench.DefaultOptions()
		o.Workload, o.Flags, o.Replicas, o.Speedup = w, f, smokeReplicas, smokeSpeedup
		o.AllowBursts = true // 20×: counts and digests, not latencies
		o.RequestTimeout = time.Minute
		return o
	}
	cells := []Cell{
		{Workload: "multi-turn", Level: "closed", Load: "2 users", Options: tiny("multi-turn",
			bench.WorkloadFlags{Conversations: 2, Turns: 3, Users: 2, DocTokens: 300, OutputTokens: 8})},
		// 3 req/s: the 6 prompts arrive over ≈100 ms wall, mostly after one another's
		// prefills (≈8 ms), so every arm has prefixes to reuse: at higher rates a burst can
		// arrive before any prefill ended, and the greedy oracle or the three unpeered
		// routers (each placing a new prefix by its own in-flight view) then spread it so
		// that no repeat finds its group cached, which flags the arm.
		{Workload: "shared-prefix", Level: "medium", Load: "3 req/s", Rate: 3, Options: tiny("shared-prefix",
			bench.WorkloadFlags{Groups: 2, PromptsPerGroup: 3, SystemTokens: 256, QuestionTokens: 16, OutputTokens: 8, Rate: 3})},
	}
	policies := []string{"round-robin", "prefix", "prefix-x3", "prefix-x3+peer", "sglang", "oracle"}
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), smokeTimeout)
	defer cancel()
	res, err := Run(ctx, Options{Out: dir, Policies: policies, Seed: 7, Stdout: &stdout, Stderr: &stderr}, cells,
		[]Skip{{"mooncake", "not found at /x"}})
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr.String())
	}
	wantReq := map[string]int{"multi-turn": 6, "shared-prefix": 6}
	for _, c := range res.Cells {
		if c.Requests != wantReq[c.Workload] || len(c.Arms) != len(policies) || c.Replicas != smokeReplicas || c.Speedup != smokeSpeedup {
			t.Fatalf("%s: %d requests, %d arms, %d replicas at %g×", c.Name(), c.Requests, len(c.Arms), c.Replicas, c.Speedup)
		}
		for _, a := range c.Arms {
			// Every arm, the oracle and the three routers included: every request answered,
			// the replicas reported cache hits (both workloads repeat prefixes), no flag, and
			// the same requests as the rest of the cell.
			if a.Mode == nil || a.Mode.Requests != c.Requests || a.Mode.Errors != 0 || a.Mode.CachedTokens == 0 || len(a.Flags) > 0 ||
				a.Mode.RequestsDigest == "" || a.Mode.RequestsDigest != c.Arms[0].Mode.RequestsDigest {
				t.Errorf("%s %s: mode %+v flags %v error %q", c.Name(), a.Policy, a.Mode, a.Flags, a.Error)
			}
			if (a.Policy == "prefix×3" || a.Policy == "prefix×3+peer") && (a.Mode == nil || len(a.Mode.RouterRequests) != 3) {
				t.Errorf("%s %s: router requests %v, want 3 routers", c.Name(), a.Policy, a.Mode)
			}
		}
	}
	out := stdout.String()
	t.Logf("scoreboard:\n%s", out)
	for _, want := range []string{"## multi-turn closed (2 users), 6 requests per arm", "## shared-prefix medium (3 req/s)",
		"| prefix×3 |", "| prefix×3+peer |", "several prefixlb replicas against one", "## Validity", "## Where prefix loses", "skipped: mooncake (not found at /x)", "suite.json"} {
		if !strings.Contains(out, want) {
			t.Errorf("scoreboard lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count("\n"+stderr.String(), "\n["); n != len(cells)*len(policies) {
		t.Errorf("stderr has %d per-arm lines, want %d:\n%s", n, len(cells)*len(policies), stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "suite.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Cells) != 2 || back.Seed != 7 || back.Cells[1].Arms[1].Mode == nil ||
		back.Cells[1].Arms[1].Mode.TTFT.P95 != res.Cells[1].Arms[1].Mode.TTFT.P95 {
		t.Errorf("suite.json does not hold the result: %s", b)
	}
	f, err := os.Open(filepath.Join(dir, "suite.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("suite.png: %v", err)
	}
}

// cancelOnWrite cancels a context at the first write (the first arm's progress line).
type cancelOnWrite struct {
	cancel context.CancelFunc
	buf    bytes.Buffer
}

func (w *cancelOnWrite) Write(p []byte) (int, error) { w.cancel(); return w.buf.Write(p) }

// TestSuiteInterrupted: a run cut short after its first arm still scores and writes that arm,
// says so, and returns the context's error.
func TestSuiteInterrupted(t *testing.T) {
	o := bench.DefaultOptions()
	o.Workload, o.Replicas, o.Speedup = "shared-prefix", smokeReplicas, smokeSpeedup
	o.AllowBursts = true
	o.Flags = bench.WorkloadFlags{Groups: 1, PromptsPerGroup: 2, SystemTokens: 64, QuestionTokens: 8, OutputTokens: 4, Rate: 40}
	cells := []Cell{{Workload: "shared-prefix", Level: "medium", Options: o}, {Workload: "shared-prefix", Level: "light", Options: o}}
	ctx, cancel := context.WithTimeout(context.Background(), smokeTimeout)
	defer cancel()
	stderr := &cancelOnWrite{cancel: cancel}
	var stdout bytes.Buffer
	dir := t.TempDir()
	res, err := Run(ctx, Options{Out: dir, Policies: []string{"round-robin", "prefix"}, Stdout: &stdout, Stderr: stderr}, cells, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if len(res.Cells) != 1 || len(res.Cells[0].Arms) != 1 || res.Cells[0].Arms[0].Mode == nil {
		t.Fatalf("cells %+v, want the first arm only", res.Cells)
	}
	if !strings.Contains(stdout.String(), "interrupted after 1 of 4 arm runs") || !strings.Contains(stdout.String(), "| round-robin |") {
		t.Errorf("scoreboard:\n%s", stdout.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "suite.json")); err != nil {
		t.Errorf("suite.json not written: %v", err)
	}
}

// TestKeepLevels: --levels keeps the named levels' cells in plan order and refuses an unknown
// name.
func TestKeepLevels(t *testing.T) {
	cells, _, err := Plan(false, []string{"multi-turn", "shared-prefix"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		levels []string
		want   []string
	}{
		{nil, []string{"multi-turn closed", "shared-prefix light", "shared-prefix medium", "shared-prefix near-saturation"}},
		{[]string{"near-saturation", "closed"}, []string{"multi-turn closed", "shared-prefix near-saturation"}},
		{[]string{"medium"}, []string{"shared-prefix medium"}},
	}
	for _, tc := range cases {
		kept, err := KeepLevels(cells, tc.levels)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range kept {
			got = append(got, c.Name())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("levels %v: %v, want %v", tc.levels, got, tc.want)
		}
	}
	if _, err := KeepLevels(cells, []string{"heavy"}); err == nil || !strings.Contains(err.Error(), `"heavy"`) {
		t.Errorf("unknown level: %v, want an error naming it", err)
	}
}
