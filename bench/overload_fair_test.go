package bench

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// TestOverloadFairEndToEnd runs a few seconds of the fair10x mix (light at 0.6 of the capacity
// of 2 sims, heavy at 10× its rate) through an in-process prefixlb, then light alone
// (--tenants light), and checks that every request of the workload was sent once and is
// counted once, under its tenant, as exactly one of completed, refused, expired or failed; that
// the pair forms one fairness group with shares summing to 1; and that light alone sends as
// many requests as it sent beside heavy (the workload's tests check they are the same ones).
// Counts only, never timings.
func TestOverloadFairEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and a proxy")
	}
	run := func(tenants []string) (report.Mode, string) {
		dir := t.TempDir()
		var stdout, stderr bytes.Buffer
		o := DefaultOptions()
		o.Workload, o.Modes, o.Replicas = "overload", []string{"round-robin"}, 2
		o.Out, o.DumpRequests, o.Quiet = dir, true, true
		// 5×, not the three-tenant test's 20×: at 20× the client's patience is 0.5 s of wall
		// time, and under 6.6× the capacity on a small machine nearly every request expired
		// (an arm where every request fails is an error).
		o.Speedup = 5
		o.AllowBursts = true // tokens may come in bursts on a small machine: counts, not latencies
		o.Stdout, o.Stderr = &stdout, &stderr
		o.Flags = WorkloadFlags{Load: "fair10x", Duration: 2 * time.Second, Tenants: tenants}
		w, err := BuildWorkload("overload", o.Flags, o.Replicas, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		rep, err := Compare(ctx, o)
		if err != nil {
			t.Fatalf("compare: %v\n%s", err, stderr.String())
		}
		m := rep.Modes[0]
		if m.Requests != w.Requests() || len(m.Flags) > 0 {
			t.Fatalf("%d requests of the workload's %d; flags %v", m.Requests, w.Requests(), m.Flags)
		}
		// Under FCFS engines at 6.6× the capacity most requests expire, light's possibly all
		// of its few: completions are required of the arm, not of each tenant.
		sent, completed := 0, 0
		for _, tn := range m.Tenants {
			if tn.Completed+tn.Refused+tn.Expired+tn.Failed != tn.Requests {
				t.Errorf("%s: %d completed + %d refused + %d expired + %d failed != %d sent", tn.Name, tn.Completed, tn.Refused, tn.Expired, tn.Failed, tn.Requests)
			}
			if (tn.Completed > 0) != (tn.GPUWorkTokens > 0) || tn.TTFT.Count != int64(tn.Completed) || tn.Priority != workload.ChatPriority {
				t.Errorf("%s: %d completed, %d work tokens, %d TTFTs, priority %d", tn.Name, tn.Completed, tn.GPUWorkTokens, tn.TTFT.Count, tn.Priority)
			}
			sent, completed = sent+tn.Requests, completed+tn.Completed
		}
		if sent != m.Requests || completed == 0 {
			t.Fatalf("tenants sent %d of the arm's %d requests, %d completed", sent, m.Requests, completed)
		}
		checkDumpOwners(t, filepath.Join(dir, "requests-round-robin.jsonl"), w, true)
		return m, stdout.String()
	}

	m, stdout := run(nil)
	if len(m.Tenants) != 2 || m.Tenants[0].Name != "light" || m.Tenants[1].Name != "heavy" {
		t.Fatalf("tenants %+v, want light and heavy", m.Tenants)
	}
	if r := float64(m.Tenants[1].Requests) / float64(m.Tenants[0].Requests); r < 6 || r > 15 {
		t.Errorf("heavy sent %.1f× light's requests", r)
	}
	if len(m.Fairness) != 1 || strings.Join(m.Fairness[0].Tenants, ",") != "light,heavy" || m.Fairness[0].Backlog != report.BacklogWaiting {
		t.Fatalf("fairness %+v, want one group: light, heavy", m.Fairness)
	}
	f := m.Fairness[0]
	if f.BackloggedS <= 0 || f.Jain == nil || *f.Jain < 0.5 || *f.Jain > 1 || math.Abs(f.Shares["light"]+f.Shares["heavy"]-1) > 1e-9 {
		t.Errorf("fairness over %.2f s: Jain %v, shares %v", f.BackloggedS, f.Jain, f.Shares)
	}
	for _, want := range []string{"| round-robin | light | 1 |", "| round-robin | heavy | 1 |", "Jain's index over priority 1 (light, heavy)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}

	// Light alone: its requests, no group.
	alone, _ := run([]string{"light"})
	if len(alone.Tenants) != 1 || alone.Tenants[0].Name != "light" || len(alone.Fairness) != 0 {
		t.Fatalf("alone: tenants %+v, fairness %+v", alone.Tenants, alone.Fairness)
	}
	if alone.Tenants[0].Requests != m.Tenants[0].Requests || alone.Tenants[0].Completed == 0 {
		t.Fatalf("light alone sent %d requests (%d completed), %d beside heavy", alone.Tenants[0].Requests, alone.Tenants[0].Completed, m.Tenants[0].Requests)
	}
}
