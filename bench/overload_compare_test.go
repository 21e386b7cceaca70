package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// TestOverloadEndToEnd runs a few seconds of the overload workload (2× the capacity of 2 sims)
// through an in-process prefixlb and checks that every request the workload holds was sent
// once and is counted once, under its tenant, as exactly one of completed, refused, expired or
// failed. Counts only, never timings.
func TestOverloadEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and a proxy")
	}
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	o := DefaultOptions()
	o.Workload, o.Modes, o.Replicas = "overload", []string{"round-robin"}, 2
	o.Out, o.DumpRequests, o.Quiet = dir, true, true
	o.Speedup = 20
	o.AllowBursts = true // 20× delivers tokens in bursts on a small machine: counts, not latencies
	o.Stdout, o.Stderr = &stdout, &stderr
	o.Flags = WorkloadFlags{Duration: 3 * time.Second}
	w, err := BuildWorkload("overload", o.Flags, o.Replicas, 0, 0) // its rates need no cache size
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
	sent := 0
	for _, tn := range m.Tenants {
		if tn.Completed+tn.Refused+tn.Expired+tn.Failed != tn.Requests {
			t.Errorf("%s: %d completed + %d refused + %d expired + %d failed != %d sent", tn.Name, tn.Completed, tn.Refused, tn.Expired, tn.Failed, tn.Requests)
		}
		if tn.Completed == 0 || tn.GPUWorkTokens == 0 || tn.TTFT.Count != int64(tn.Completed) {
			t.Errorf("%s: %d completed, %d work tokens, %d TTFTs", tn.Name, tn.Completed, tn.GPUWorkTokens, tn.TTFT.Count)
		}
		sent += tn.Requests
	}
	if len(m.Tenants) != 3 || sent != m.Requests {
		t.Fatalf("%d tenants sent %d of the arm's %d requests", len(m.Tenants), sent, m.Requests)
	}
	if len(m.Fairness) != 1 || strings.Join(m.Fairness[0].Tenants, ",") != "chat,noisy" {
		t.Fatalf("fairness %+v, want one group: chat, noisy", m.Fairness)
	}
	// Each (conversation, turn) once in the per-request dump, under the tenant that owns it.
	checkDumpOwners(t, filepath.Join(dir, "requests-round-robin.jsonl"), w, false)
	// report.json carries the tenants section; the table has a row per tenant.
	var back report.Report
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil || json.Unmarshal(b, &back) != nil || len(back.Modes[0].Tenants) != 3 {
		t.Fatalf("report.json: %v, tenants %d", err, len(back.Modes))
	}
	for _, want := range []string{"| round-robin | chat | 1 |", "| round-robin | noisy | 1 |", "| round-robin | batch | 0 |", "Jain's index over priority 1 (chat, noisy)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

// checkDumpOwners checks that the per-request dump at path holds each request of w once, under
// the tenant whose conversation it is, and, with oneTurn, only first turns.
func checkDumpOwners(t *testing.T, path string, w *workload.Workload, oneTurn bool) {
	t.Helper()
	owner := map[int]string{}
	for _, c := range w.Conversations {
		owner[c.ID] = c.Tenant.Name
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[[2]int]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l struct {
			Conversation, Turn int
			Tenant             string
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		k := [2]int{l.Conversation, l.Turn}
		if seen[k] || owner[l.Conversation] != l.Tenant || (oneTurn && l.Turn != 0) {
			t.Fatalf("request %v: seen before %v, tenant %q, owner %q", k, seen[k], l.Tenant, owner[l.Conversation])
		}
		seen[k] = true
	}
	if len(seen) != w.Requests() {
		t.Fatalf("%d distinct requests dumped, the workload has %d", len(seen), w.Requests())
	}
}
