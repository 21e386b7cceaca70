package suite

import (
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench"
)

// The overload workload is opt-in: not in the default plan; when --workloads names it, five
// cells on 2 replicas, each in ShortArmRounds rounds: overload and light (the three tenants
// at 4×) and the fairness cells (fair10x at 2×, light alone in fair-alone); `--cells
// 'overload/fair*'` selects the fairness cells alone, and a wildcard workload never matches
// overload.
func TestOverloadPlanOptIn(t *testing.T) {
	all, _, err := Plan(false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if c.Workload == "overload" {
			t.Fatalf("the default plan holds %s", c.Name())
		}
	}
	cells, _, err := Plan(false, []string{"overload"})
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		load    string
		tenants string
		speedup float64
	}
	wants := map[string]want{OverloadLevel: {"2", "", 4}, "light": {"0.5", "", 4},
		FairAloneLevel: {"fair10x:0.4", "light", FairSpeedup}, FairLevel: {"fair10x:0.4", "", FairSpeedup}, FairSharesLevel: {"fair10x:0.6", "", FairSpeedup}}
	if len(cells) != len(wants) {
		t.Fatalf("%d overload cells, want %d", len(cells), len(wants))
	}
	for _, c := range cells {
		o, w := c.Options, wants[c.Level]
		if o.Workload != "overload" || o.Flags.Load != w.load || strings.Join(o.Flags.Tenants, ",") != w.tenants || o.Replicas != 2 || o.Speedup != w.speedup || c.Rounds != ShortArmRounds {
			t.Errorf("%s: workload %s, load %q tenants %v (want %+v), %d replicas, %g×, %d rounds", c.Name(), o.Workload, o.Flags.Load, o.Flags.Tenants, w, o.Replicas, o.Speedup, c.Rounds)
		}
		if strings.HasPrefix(c.Level, "fair") && o.Flags.Duration != FairDuration {
			t.Errorf("%s: duration %s, want %s", c.Name(), o.Flags.Duration, FairDuration)
		}
	}
	if kept, err := KeepLevels(cells, []string{OverloadLevel}); err != nil || len(kept) != 1 {
		t.Errorf("--levels overload: %d cells, %v", len(kept), err)
	}
	if got := CellWorkloads([]string{"overload/fair*"}); strings.Join(got, ",") != "overload" {
		t.Errorf("CellWorkloads(overload/fair*) = %v", got)
	}
	if got := CellWorkloads([]string{"*/light", "over*"}); slices.Contains(got, "overload") {
		t.Errorf("a wildcard named overload: %v", got)
	}
	kept, err := KeepCells(cells, []string{"overload/fair*"})
	var names []string
	for _, c := range kept {
		names = append(names, c.Level)
	}
	if err != nil || strings.Join(names, ",") != "fair-alone,fair,fair-shares" {
		t.Errorf("--cells overload/fair*: %v, %v", names, err)
	}
	if kept, err := KeepCells(cells, []string{"*/light"}); err != nil || len(kept) != 0 {
		t.Errorf("--cells */light kept %d overload cells (%v): a wildcard must not match an opt-in workload", len(kept), err)
	}
	for _, p := range bench.FlowControlArms {
		if mode, n, canon, err := ParsePolicy(p); err != nil || mode != p || n != 1 || canon != p {
			t.Errorf("ParsePolicy(%q) = %q, %d, %q, %v", p, mode, n, canon, err)
		}
	}
}

// The fairness cells' options build their workloads: fair-alone holds light alone, with the
// same requests as light's in the fair cell (a tenant's arrivals and texts are its own).
func TestFairCellsBuild(t *testing.T) {
	cells, _, err := Plan(false, []string{"overload"})
	if err != nil {
		t.Fatal(err)
	}
	light := map[string]int{}
	for _, c := range cells {
		o := c.Options
		w, err := bench.BuildWorkload(o.Workload, o.Flags, o.Replicas, o.KVTokens, 0)
		if err != nil {
			t.Fatalf("%s: %v", c.Name(), err)
		}
		for _, conv := range w.Conversations {
			if conv.Tenant != nil && conv.Tenant.Name == FairLightTenant && (c.Level == FairAloneLevel || c.Level == FairLevel) {
				light[c.Level]++
			}
		}
		if c.Level == FairAloneLevel && len(w.Tenants) != 1 {
			t.Errorf("%s: %d tenants, want light alone", c.Name(), len(w.Tenants))
		}
	}
	if light[FairAloneLevel] == 0 || light[FairAloneLevel] != light[FairLevel] {
		t.Errorf("light's requests: alone %d, with heavy %d; want the same, > 0", light[FairAloneLevel], light[FairLevel])
	}
}
