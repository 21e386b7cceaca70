package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCompareEndToEnd runs a tiny multi-turn workload through fresh sims and an in-process
// prefixlb in all three modes. It checks counts and outputs only, never timings.
func TestCompareEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and proxies")
	}
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	o := DefaultOptions()
	o.Out = dir
	o.Speedup = 50
	o.AllowBursts = true // 50× is beyond any machine's token-by-token delivery: counts, not latencies
	o.Quiet = true
	o.Stdout, o.Stderr = &stdout, &stderr
	o.Flags = WorkloadFlags{Conversations: 4, Turns: 3, DocTokens: 300, OutputTokens: 8, Users: 2,
		ThinkMin: time.Millisecond, ThinkMax: 5 * time.Millisecond, thinkSet: true}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Compare(ctx, o)
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, stderr.String())
	}
	if len(rep.Modes) != 3 {
		t.Fatalf("%d modes", len(rep.Modes))
	}
	for i, want := range []string{"round-robin", "least-load", "prefix"} {
		m := rep.Modes[i]
		if m.Mode != want {
			t.Fatalf("mode %d is %q, want %q", i, m.Mode, want)
		}
		if m.Requests != 12 || m.Errors != 0 {
			t.Fatalf("%s: %d requests, %d errors %v", want, m.Requests, m.Errors, m.ErrorReasons)
		}
		if m.OutputTokens != 12*8 || m.PromptTokens == 0 || m.UsageMissing != 0 {
			t.Fatalf("%s: output %d prompt %d usage missing %d", want, m.OutputTokens, m.PromptTokens, m.UsageMissing)
		}
		if len(m.BackendShare) != 4 {
			t.Fatalf("%s: backend share %v (want the 4 sims)", want, m.BackendShare)
		}
		if m.TTFT.Count != 12 || m.TTFT.P50 <= 0 {
			t.Fatalf("%s: ttft %+v", want, m.TTFT)
		}
	}
	table := stdout.String()
	for _, want := range []string{"| round-robin |", "| least-load |", "| prefix |", "TTFT p95 ms"} {
		if !strings.Contains(table, want) {
			t.Fatalf("table lacks %q:\n%s", want, table)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Workload string `json:"workload"`
		Modes    []struct {
			Mode     string `json:"mode"`
			Requests int    `json:"requests"`
		} `json:"modes"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.Workload != "multi-turn" || len(doc.Modes) != 3 {
		t.Fatalf("report.json: %v %+v", err, doc)
	}
	if st, err := os.Stat(filepath.Join(dir, "ttft_cdf.png")); err != nil || st.Size() == 0 {
		t.Fatalf("plot: %v", err)
	}
}

// TestCompareMooncakeTiny replays a hand-made trace (completions API, open loop) and checks
// the oracle reaches the report.
func TestCompareMooncakeTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and proxies")
	}
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	var sb strings.Builder
	for i := 0; i < 12; i++ {
		ids := []int{0, 1 + i%3, 10 + i}
		b, _ := json.Marshal(map[string]any{"timestamp": i * 100, "input_length": 3*512 - 7, "output_length": 4, "hash_ids": ids})
		sb.Write(append(b, '\n'))
	}
	if err := os.WriteFile(trace, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	o := DefaultOptions()
	o.Workload, o.Out, o.Speedup, o.Quiet, o.KVTokens = "mooncake", filepath.Join(dir, "out"), 50, true, 100_000
	o.AllowBursts = true
	o.Stdout, o.Stderr = &stdout, &stdout
	o.Flags = WorkloadFlags{TracePath: trace}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Compare(ctx, o)
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, stdout.String())
	}
	if rep.Oracle == nil || rep.Oracle.Requests != 12 || rep.Oracle.InfiniteRatio <= 0 {
		t.Fatalf("oracle %+v", rep.Oracle)
	}
	for _, m := range rep.Modes {
		if m.Requests != 12 || m.Errors != 0 || m.OutputTokens != 48 {
			t.Fatalf("%s: %d requests, %d errors %v, %d output tokens", m.Mode, m.Requests, m.Errors, m.ErrorReasons, m.OutputTokens)
		}
	}
	if !strings.Contains(stdout.String(), "Oracle cached-token ratio") {
		t.Fatalf("no oracle line:\n%s", stdout.String())
	}
}

func TestParseWindow(t *testing.T) {
	s, d, err := parseWindow("60,5m")
	if err != nil || s != time.Minute || d != 5*time.Minute {
		t.Fatalf("%v %v %v", s, d, err)
	}
	for _, bad := range []string{"60", "x,1", "1,0", "-1,5"} {
		if _, _, err := parseWindow(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestBuildWorkloadDefaults(t *testing.T) {
	w, err := BuildWorkload("multi-turn", WorkloadFlags{}, 4, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Conversations) != DefaultConversations || len(w.Conversations[0].Turns) != DefaultTurns || w.Users != DefaultUsers {
		t.Fatalf("defaults: %d conversations × %d turns, %d users", len(w.Conversations), len(w.Conversations[0].Turns), w.Users)
	}
	if _, err := BuildWorkload("nope", WorkloadFlags{}, 4, 0, 0); err == nil {
		t.Fatal("unknown workload accepted")
	}
	t.Setenv("PREFIXLB_SHARED", filepath.Join(t.TempDir(), "absent"))
	for _, name := range []string{"mooncake", "oasst", "mt-bench"} {
		if _, err := BuildWorkload(name, WorkloadFlags{}, 4, 0, 0); err == nil || !strings.Contains(err.Error(), "PREFIXLB_SHARED") {
			t.Errorf("%s without shared data: %v", name, err)
		}
	}
}
