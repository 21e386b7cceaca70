package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestFlowControlArmsEndToEnd runs a few seconds of the overload workload (2× the capacity
// of 2 sims on 127.0.0.1) through prefix, prefix+fc and llm-d-fc and checks, for each arm,
// that every request the workload holds is counted once, under its tenant, as exactly one
// outcome, and that none of the flow-control arms' requests failed: each completed, was
// refused explicitly (429/503) or was given up by its client. Counts only, never timings.
func TestFlowControlArmsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and proxies")
	}
	var stdout, stderr bytes.Buffer
	o := DefaultOptions()
	o.Workload, o.Modes, o.Replicas = "overload", []string{"prefix", PrefixFCArm, LLMDFCArm}, 2
	o.Out, o.Quiet = t.TempDir(), true
	o.Speedup = 20
	o.AllowBursts = true // 20× delivers tokens in bursts on a small machine: counts, not latencies
	o.Stdout, o.Stderr = &stdout, &stderr
	o.Flags = WorkloadFlags{Duration: 3 * time.Second}
	w, err := BuildWorkload("overload", o.Flags, o.Replicas, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Compare(ctx, o)
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, stderr.String())
	}
	if len(rep.Modes) != 3 {
		t.Fatalf("%d arms, want 3", len(rep.Modes))
	}
	for _, m := range rep.Modes {
		if m.Requests != w.Requests() || len(m.Flags) > 0 {
			t.Errorf("%s: %d requests of the workload's %d; flags %v", m.Mode, m.Requests, w.Requests(), m.Flags)
		}
		sent, completed := 0, 0
		for _, tn := range m.Tenants {
			if tn.Completed+tn.Refused+tn.Expired+tn.Failed != tn.Requests {
				t.Errorf("%s %s: %d completed + %d refused + %d expired + %d failed != %d sent", m.Mode, tn.Name, tn.Completed, tn.Refused, tn.Expired, tn.Failed, tn.Requests)
			}
			if m.Mode != "prefix" && tn.Failed > 0 {
				t.Errorf("%s %s: %d failed (%v): a flow-control arm completes or refuses", m.Mode, tn.Name, tn.Failed, tn.FailedReasons)
			}
			for r := range tn.RefusedReasons {
				if !strings.HasPrefix(r, "429 ") && !strings.HasPrefix(r, "503 ") {
					t.Errorf("%s %s: refusal %q is not a 429 or 503", m.Mode, tn.Name, r)
				}
			}
			sent += tn.Requests
			completed += tn.Completed
		}
		if len(m.Tenants) != 3 || sent != m.Requests || completed == 0 {
			t.Errorf("%s: %d tenants sent %d of the arm's %d requests, %d completed", m.Mode, len(m.Tenants), sent, m.Requests, completed)
		}
		// What the arm's prefixlb counted in its queue (prefixlb_flow_*): nothing without
		// flow control; at 2× capacity, requests held and placed from the queue with a wait.
		s := m.Savings
		switch {
		case s == nil:
			t.Errorf("%s: no figures from prefixlb's /metrics", m.Mode)
		case m.Mode == "prefix" && (s.Queued != 0 || s.Refused != 0):
			t.Errorf("prefix without flow control: %d queued, %d refused", s.Queued, s.Refused)
		case s.QueueDispatched > s.Queued || s.QueueWaitSeconds < 0:
			t.Errorf("%s: %d placed from the queue of %d queued, %v s of waits", m.Mode, s.QueueDispatched, s.Queued, s.QueueWaitSeconds)
		case m.Mode == PrefixFCArm && !(s.Queued > 0 && s.QueueDispatched > 0 && s.QueueWaitSeconds > 0):
			// The reserve rule holds the batch tenant's documents while chat is served at 2×
			// capacity. (llm-d-fc holds only once GIE's detector sees 6 waiting per replica in
			// a scrape, which a 3 s run may never show.)
			t.Errorf("%s at 2x capacity: %d queued, %d placed from the queue after %v s of waits", m.Mode, s.Queued, s.QueueDispatched, s.QueueWaitSeconds)
		}
	}
	out := stdout.String()
	t.Log(out)
	for _, want := range []string{"| prefix+fc | chat | 1 |", "| llm-d-fc | batch | 0 |", "Flow-control arms, classified by a rule per tenant's API key", "Flow control (prefixlb_flow_*): prefix+fc queued "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
