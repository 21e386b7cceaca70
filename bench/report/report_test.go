package report

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/loadgen"
	"github.com/prefixlb/prefixlb/bench/workload"
)

func near(got, want float64) bool { return math.Abs(got-want) <= want*0.001+1e-9 }

func TestPercentiles(t *testing.T) {
	r := NewRecorder()
	for i := 1; i <= 100; i++ { // 1..100 ms
		r.Record(time.Duration(i) * time.Millisecond)
	}
	s := r.Summary()
	for name, c := range map[string][2]float64{"p50": {s.P50, 50}, "p90": {s.P90, 90}, "p95": {s.P95, 95},
		"p99": {s.P99, 99}, "mean": {s.Mean, 50.5}, "max": {s.Max, 100}} {
		if !near(c[0], c[1]) {
			t.Errorf("%s = %.3f ms, want %.3f", name, c[0], c[1])
		}
	}
	if s.Count != 100 {
		t.Errorf("count %d", s.Count)
	}

	// 110 values as in the public measurement: p95 is the 6th worst.
	r = NewRecorder()
	for i := 1; i <= 110; i++ {
		r.Record(time.Duration(i) * time.Millisecond)
	}
	if s := r.Summary(); !near(s.P95, 105) || !near(s.P99, 109) || !near(s.P50, 55) {
		t.Errorf("110 values: p50 %.2f p95 %.2f p99 %.2f, want 55, 105, 109", s.P50, s.P95, s.P99)
	}
	// Microsecond resolution.
	r = NewRecorder()
	r.Record(1234 * time.Microsecond)
	if s := r.Summary(); s.P50 != 1.234 {
		t.Errorf("1234 µs → %.4f ms", s.P50)
	}
	if (NewRecorder().Summary() != Latency{}) {
		t.Error("empty recorder must give zeros")
	}
}

func outcome() *loadgen.Outcome {
	start := time.Unix(1000, 0)
	o := &loadgen.Outcome{Start: start, End: start.Add(10 * time.Second)}
	for i := 0; i < 20; i++ {
		o.Results = append(o.Results, loadgen.Result{Turn: i % 2, Route: []string{"match;chunks=4", "cold;chunks=0"}[i%2],
			TTFT: time.Duration(i+1) * time.Millisecond,
			ITL:  []time.Duration{time.Millisecond, 3 * time.Millisecond}, E2E: 50 * time.Millisecond,
			PromptTokens: 100, CachedTokens: 25, OutputTokens: 3, UsageSeen: true,
			Backend: []string{"http://a", "http://a", "http://a", "http://b"}[i%4]})
	}
	o.Results = append(o.Results, loadgen.Result{Err: "status 503"}, loadgen.Result{Err: "timeout"})
	return o
}

func TestSummarize(t *testing.T) {
	m := Summarize("prefix", outcome(), []string{"http://a", "http://b", "http://c"})
	if m.Requests != 22 || m.Errors != 2 || m.ErrorReasons["status 503"] != 1 {
		t.Fatalf("requests %d errors %d %v", m.Requests, m.Errors, m.ErrorReasons)
	}
	if !near(m.RPS, 2) || !near(m.OutputTPS, 6) || !near(m.CachedTokenRatio, 0.25) {
		t.Fatalf("rps %.3f tps %.3f cached %.3f", m.RPS, m.OutputTPS, m.CachedTokenRatio)
	}
	if m.BackendShare["http://a"] != 0.75 || m.BackendShare["http://b"] != 0.25 || m.BackendShare["http://c"] != 0 {
		t.Fatalf("share %v", m.BackendShare)
	}
	if !near(m.MaxShareOverMean, 2.25) {
		t.Fatalf("max/mean %.3f, want 0.75 × 3", m.MaxShareOverMean)
	}
	if m.ITL.Count != 40 || !near(m.ITL.P50, 1) || !near(m.TTFT.P95, 19) || len(m.TTFTMs) != 20 {
		t.Fatalf("itl %+v ttft %+v", m.ITL, m.TTFT)
	}
	if m.Routes["match"] != 10 || m.Routes["cold"] != 10 {
		t.Fatalf("routes %v", m.Routes)
	}
	// Turn 0 got TTFTs 1,3,...,19 ms; later turns 2,4,...,20 ms.
	if m.TTFTFirstTurn == nil || m.TTFTFirstTurn.Count != 10 || !near(m.TTFTFirstTurn.Mean, 10) || !near(m.TTFTLaterTurns.Mean, 11) {
		t.Fatalf("first %+v later %+v", m.TTFTFirstTurn, m.TTFTLaterTurns)
	}
}

// TestTableRatesAndFlags: a rate column appears only when a mode has a Rate, every row keeps
// the header's cell count, and a flagged mode is marked "!".
func TestTableRatesAndFlags(t *testing.T) {
	plain := Summarize("prefix", outcome(), nil)
	if tab := Table([]Mode{plain}); strings.Contains(tab, "| rate |") || strings.Contains(tab, "!") {
		t.Fatalf("no rates, no flags, yet:\n%s", tab)
	}
	slow, fast := plain, plain
	slow.Rate, fast.Rate = 2.5, 10
	fast.Mode, fast.Flags = "prefix×3", []string{"2 of 4 requests failed"}
	lines := strings.Split(strings.TrimSpace(Table([]Mode{slow, fast})), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "| mode | rate | requests |") {
		t.Fatalf("table:\n%s", strings.Join(lines, "\n"))
	}
	for i, want := range []string{"| prefix | 2.5 | ", "| prefix×3 ! | 10 | "} {
		if !strings.HasPrefix(lines[i+2], want) {
			t.Fatalf("row %d %q, want prefix %q", i, lines[i+2], want)
		}
	}
	for _, l := range lines[1:] {
		if strings.Count(l, "|") != strings.Count(lines[0], "|") {
			t.Fatalf("row %q has a different cell count from the header %q", l, lines[0])
		}
	}
}

// TestTablePreemptions: a preemptions column, with every row's count, appears only when some
// arm's replicas preempted.
func TestTablePreemptions(t *testing.T) {
	none := Summarize("round-robin", outcome(), nil)
	if tab := Table([]Mode{none}); strings.Contains(tab, "preemptions") {
		t.Fatalf("no preemptions, yet a column:\n%s", tab)
	}
	some := none
	some.Mode, some.Preemptions = "prefix", 7
	failed := some
	failed.Mode, failed.Requests, failed.Errors, failed.Preemptions = "oracle", 4, 4, 0
	lines := strings.Split(strings.TrimSpace(Table([]Mode{none, some, failed})), "\n")
	if !strings.Contains(lines[0], "| cached-token ratio | preemptions | max share / mean |") {
		t.Fatalf("header %q", lines[0])
	}
	for i, want := range []string{"| 0 | ", "| 7 | ", "| 0 | "} {
		if !strings.Contains(lines[i+2], want) {
			t.Fatalf("row %q lacks %q", lines[i+2], want)
		}
	}
	for _, l := range lines[1:] {
		if strings.Count(l, "|") != strings.Count(lines[0], "|") {
			t.Fatalf("row %q has a different cell count from the header %q", l, lines[0])
		}
	}
}

func TestTableAndJSON(t *testing.T) {
	modes := []Mode{Summarize("round-robin", outcome(), nil), Summarize("least-load", outcome(), nil),
		Summarize("prefix", outcome(), nil)}
	tab := Table(modes)
	lines := strings.Split(strings.TrimSpace(tab), "\n")
	if len(lines) != 5 {
		t.Fatalf("table has %d lines:\n%s", len(lines), tab)
	}
	for i, name := range []string{"round-robin", "least-load", "prefix"} {
		if !strings.HasPrefix(lines[i+2], "| "+name+" |") {
			t.Fatalf("row %d: %q", i, lines[i+2])
		}
		if n := strings.Count(lines[i+2], "|"); n != strings.Count(lines[0], "|") {
			t.Fatalf("row %q has %d cells", lines[i+2], n)
		}
	}

	dir := t.TempDir()
	rep := &Report{Workload: "multi-turn", Modes: modes, Oracle: &workload.Oracle{PooledRatio: 0.2, InfiniteRatio: 0.3}}
	path := filepath.Join(dir, "report.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["workload"] != "multi-turn" {
		t.Fatalf("workload %v", doc["workload"])
	}
	ms := doc["modes"].([]any)
	if len(ms) != 3 {
		t.Fatalf("%d modes", len(ms))
	}
	m := ms[2].(map[string]any)
	if m["mode"] != "prefix" {
		t.Fatalf("mode %v", m["mode"])
	}
	for _, k := range []string{"ttft", "itl", "e2e"} {
		lat := m[k].(map[string]any)
		for _, f := range []string{"p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms"} {
			if _, ok := lat[f].(float64); !ok {
				t.Fatalf("%s.%s missing", k, f)
			}
		}
	}
	for _, k := range []string{"requests", "errors", "rps", "output_tps", "cached_token_ratio"} {
		if _, ok := m[k].(float64); !ok {
			t.Fatalf("%s missing or not a number", k)
		}
	}
	if share := m["backend_share"].(map[string]any); share["http://a"] != 0.75 {
		t.Fatalf("backend_share %v", share)
	}
	if o := doc["oracle"].(map[string]any); o["pooled_lru_ratio"] != 0.2 {
		t.Fatalf("oracle %v", o)
	}
}

func TestWriteRequests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "requests-prefix.jsonl")
	if err := WriteRequests(path, outcome()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 22 {
		t.Fatalf("%d lines", len(lines))
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first["ttft_ms"] != 1.0 || first["route"] != "match;chunks=4" {
		t.Fatalf("%v %v", err, first)
	}
}

func TestPlot(t *testing.T) {
	modes := []Mode{Summarize("round-robin", outcome(), nil), Summarize("prefix", outcome(), nil)}
	path := filepath.Join(t.TempDir(), "ttft_cdf.png")
	if err := PlotTTFTCDF(path, "TTFT", modes); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatal("not a PNG")
	}
}

// TestMedian: odd and even counts, the input untouched, NaN for none.
func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := slices.Clone(tc.xs)
		if got := Median(in); got != tc.want || !slices.Equal(in, tc.xs) {
			t.Errorf("Median(%v) = %g (input now %v), want %g", tc.xs, got, in, tc.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) is not NaN")
	}
}

// TestTableSavings: the routing cost and saved prefill columns show a mode's Savings, "-"
// without; the note under the table says what they are, how --speedup scales them, and the
// shadow's estimate when an arm ran one; no note when no arm has Savings.
func TestTableSavings(t *testing.T) {
	plain := Summarize("external", outcome(), nil)
	routed := Summarize("prefix", outcome(), nil)
	routed.Savings = &Savings{KeySeconds: 0.0125, PickSeconds: 0.0025, RoutingSeconds: 0.015, SavedPrefillSeconds: 42.42}
	shadowed := Summarize("round-robin", outcome(), nil)
	shadowed.Savings = &Savings{RoutingSeconds: 1.5, SavedPrefillSeconds: 3, Shadow: true, ShadowSavedPrefillSeconds: 12.5, ShadowActualSavedPrefillSeconds: 2.75}
	lines := strings.Split(strings.TrimSpace(Table([]Mode{plain, routed, shadowed})), "\n")
	if !strings.HasSuffix(lines[0], "| max share / mean | routing cost s | saved prefill s |") {
		t.Fatalf("header %q", lines[0])
	}
	cols := func(l string) int { return strings.Count(l, "|") }
	for _, l := range lines[1:] {
		if cols(l) != cols(lines[0]) {
			t.Errorf("row %q has %d columns, header %d", l, cols(l), cols(lines[0]))
		}
	}
	for i, suffix := range []string{"| - | - |", "| 0.015 | 42.4 |", "| 1.50 | 3.00 |"} {
		if !strings.HasSuffix(lines[2+i], suffix) {
			t.Errorf("row %q: want it to end %q", lines[2+i], suffix)
		}
	}
	if SavingsLine([]Mode{plain}, 1) != "" {
		t.Error("a savings note without any arm's savings")
	}
	note := SavingsLine([]Mode{plain, routed, shadowed}, 20)
	for _, want := range []string{"prefixlb_routing_seconds_total", "prefixlb_prefill_saved_seconds_total", "At --speedup 20", "×20 for model time",
		"round-robin: shadow prefix policy 12.5 s, the mode in force 2.75 s"} {
		if !strings.Contains(note, want) {
			t.Errorf("note lacks %q: %s", want, note)
		}
	}
	if strings.Contains(SavingsLine([]Mode{routed}, 1), "speedup") || strings.Contains(SavingsLine([]Mode{routed}, 1), "Shadow") {
		t.Error("speedup or shadow mentioned for a real-time run without a shadow")
	}
}

// FlowLine names each arm that queued or refused requests, with its mean wait; none without.
func TestFlowLine(t *testing.T) {
	plain := Mode{Mode: "prefix", Requests: 10, Savings: &Savings{}}
	fc := Mode{Mode: "prefix+fc", Requests: 10, Savings: &Savings{Queued: 4, QueueDispatched: 2, QueueWaitSeconds: 0.25, Refused: 1}}
	if got := FlowLine([]Mode{plain, {Mode: "x"}}); got != "" {
		t.Errorf("no arm queued: %q", got)
	}
	want := "Flow control (prefixlb_flow_*): prefix+fc queued 4 of 10 requests (2 placed from the queue, mean wait 125 ms wall), refused 1."
	if got := FlowLine([]Mode{plain, fc}); got != want {
		t.Errorf("FlowLine:\n got %q\nwant %q", got, want)
	}
}
