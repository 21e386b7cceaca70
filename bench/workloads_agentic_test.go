package bench

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/workload"
)

func topLevel(w *workload.Workload) (convs []*workload.Conversation) {
	for _, c := range w.Conversations {
		if c.Fork == nil {
			convs = append(convs, c)
		}
	}
	return convs
}

func TestBuildAgenticFlags(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flags  WorkloadFlags
		maxLen int    // the replicas' model length (0: the sim's)
		err    string // "" when it must build
		check  func(t *testing.T, w *workload.Workload)
	}{
		{name: "defaults", check: func(t *testing.T, w *workload.Workload) {
			if n := len(topLevel(w)); n != DefaultAgenticSessions || w.Loop != workload.Open || w.Params["rate"] != DefaultAgenticRate {
				t.Fatalf("%d sessions, loop %s, rate %v", n, w.Loop, w.Params["rate"])
			}
			if len(w.Conversations[0].Tools) == 0 {
				t.Fatal("no tools")
			}
		}},
		{name: "sessions, rate, requests, output", flags: WorkloadFlags{Conversations: 30, Rate: 2, Turns: 6, OutputTokens: 50, MaxOutput: 60},
			check: func(t *testing.T, w *workload.Workload) {
				top := topLevel(w)
				var n, out []int
				for _, c := range top {
					n = append(n, len(c.Turns))
					for _, tr := range c.Turns {
						out = append(out, tr.MaxTokens)
					}
				}
				slices.Sort(n)
				slices.Sort(out)
				if len(top) != 30 || w.Params["rate"] != 2.0 || n[len(n)/2] < 5 || n[len(n)/2] > 7 || out[len(out)/2] < 40 || out[len(out)/2] > 60 || out[len(out)-1] > 60 {
					t.Fatalf("%d sessions at %v/s, median requests %d, median output %d, max %d", len(top), w.Params["rate"], n[len(n)/2], out[len(out)/2], out[len(out)-1])
				}
			}},
		{name: "a model length too short for the prefix", flags: WorkloadFlags{SystemTokens: 20000}, maxLen: 16384, err: "model length"},
		{name: "users", flags: WorkloadFlags{Users: 4}, err: "open-loop"},
		{name: "negative rate", flags: WorkloadFlags{Rate: -1}, err: "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := BuildWorkload("agentic", tc.flags, 4, 0, or(tc.maxLen, 131072))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, w)
		})
	}
}

// TestCompareAgenticTiny runs a tiny agentic workload through fresh sims and prefixlb in every
// default mode: every request succeeds and every mode's replicas report cached prompt tokens
// (each request repeats the previous one's prompt). Counts only, never timings.
func TestCompareAgenticTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sims and proxies")
	}
	var stdout, stderr bytes.Buffer
	o := DefaultOptions()
	o.Workload, o.Out, o.Speedup, o.Quiet = "agentic", "", 50, true
	o.AllowBursts = true
	o.Stdout, o.Stderr = &stdout, &stderr
	o.Flags = WorkloadFlags{Conversations: 3, Rate: 20, Turns: 4, SystemTokens: 1500, OutputTokens: 8, MaxOutput: 16,
		ThinkMin: time.Millisecond, ThinkMax: 5 * time.Millisecond, thinkSet: true}
	w, err := BuildWorkload(o.Workload, o.Flags, 4, 0, 131072)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rep, err := Compare(ctx, o)
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, stderr.String())
	}
	for _, m := range rep.Modes {
		if m.Requests != w.Requests() || m.Errors != 0 {
			t.Fatalf("%s: %d requests (want %d), %d errors %v", m.Mode, m.Requests, w.Requests(), m.Errors, m.ErrorReasons)
		}
		if m.CachedTokenRatio <= 0 {
			t.Fatalf("%s: cached-token ratio %g, want > 0", m.Mode, m.CachedTokenRatio)
		}
	}
}
