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

	"github.com/prefixlb/prefixlb/bench/report"
)

// TestCompareReportsSavings runs a multi-turn workload through two sims in round-robin and
// prefix mode and checks each arm's "routing cost X, saved Y" from its prefixlb's /metrics:
// routing time in both stages, the cached tokens prefixlb counted equal to those the clients'
// usage chunks reported, saved prefill seconds once prefix mode has learned the sims' prefill
// rate (the 8 first turns, each a 1500-token document, teach it before the later turns hit
// the cache), and both columns in the printed table and in report.json. Counts, not timings.
func TestCompareReportsSavings(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and proxies")
	}
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	o := DefaultOptions()
	o.Modes, o.Replicas = []string{"round-robin", "prefix"}, 2
	o.Out, o.Speedup, o.AllowBursts, o.Quiet = dir, 50, true, true
	o.Stdout, o.Stderr = &stdout, &stderr
	// 16 conversations: their 16 first turns are the fleet's prefill-rate samples, twice
	// backend.MinPrefillSamples, so that a sample or two set aside on a busy machine still
	// leaves a learned rate (8 conversations left exactly 8 and, under CI load, sometimes none).
	o.Flags = WorkloadFlags{Conversations: 16, Turns: 3, DocTokens: 1500, OutputTokens: 4, Users: 16,
		ThinkMin: time.Millisecond, ThinkMax: 5 * time.Millisecond, thinkSet: true}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rep, err := Compare(ctx, o)
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, stderr.String())
	}
	if len(rep.Modes) != 2 {
		t.Fatalf("%d modes", len(rep.Modes))
	}
	for _, m := range rep.Modes {
		s := m.Savings
		if m.Requests != 48 || m.Errors != 0 || s == nil {
			t.Fatalf("%s: %d requests, %d errors, savings %+v", m.Mode, m.Requests, m.Errors, s)
		}
		if !(s.KeySeconds > 0 && s.PickSeconds > 0) || s.RoutingSeconds != s.KeySeconds+s.PickSeconds {
			t.Errorf("%s: routing key %v + pick %v = %v", m.Mode, s.KeySeconds, s.PickSeconds, s.RoutingSeconds)
		}
		if s.CachedTokens != m.CachedTokens || m.CachedTokens == 0 {
			t.Errorf("%s: prefixlb counted %d cached tokens, the clients' usage chunks %d", m.Mode, s.CachedTokens, m.CachedTokens)
		}
		if s.Shadow {
			t.Errorf("%s: shadow figures without a shadow", m.Mode)
		}
	}
	prefix := rep.Modes[1].Savings
	if !(prefix.SavedPrefillSeconds > 0) {
		t.Errorf("prefix: saved %v prefill seconds on %d cached tokens", prefix.SavedPrefillSeconds, prefix.CachedTokens)
	}
	table := stdout.String()
	t.Log(table)
	if !strings.Contains(table, "| routing cost s | saved prefill s |") || !strings.Contains(table, "Routing cost s: the time prefixlb spent") {
		t.Errorf("table lacks the savings columns or their note:\n%s", table)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Modes []struct {
			Mode    string          `json:"mode"`
			Savings *report.Savings `json:"savings"`
		} `json:"modes"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Modes) != 2 || doc.Modes[1].Savings == nil ||
		doc.Modes[1].Savings.SavedPrefillSeconds != prefix.SavedPrefillSeconds {
		t.Fatalf("report.json savings: %v %+v", err, doc.Modes)
	}
}
