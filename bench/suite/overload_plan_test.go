package suite

import (
	"testing"

	"github.com/prefixlb/prefixlb/bench"
)

// The overload workload is opt-in: not in the default plan, two cells (overload, light) on 2
// replicas at 4× when --workloads names it; the flow-control arms parse as policies.
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
	want := map[string]string{OverloadLevel: "2", "light": "0.5"}
	if len(cells) != len(want) {
		t.Fatalf("%d overload cells, want %d", len(cells), len(want))
	}
	for _, c := range cells {
		o := c.Options
		if o.Workload != "overload" || o.Flags.Load != want[c.Level] || o.Replicas != 2 || o.Speedup != 4 {
			t.Errorf("%s: workload %s, load %q (want %q), %d replicas, %g×", c.Name(), o.Workload, o.Flags.Load, want[c.Level], o.Replicas, o.Speedup)
		}
	}
	if kept, err := KeepLevels(cells, []string{OverloadLevel}); err != nil || len(kept) != 1 {
		t.Errorf("--levels overload: %d cells, %v", len(kept), err)
	}
	for _, p := range bench.FlowControlArms {
		if mode, n, canon, err := ParsePolicy(p); err != nil || mode != p || n != 1 || canon != p {
			t.Errorf("ParsePolicy(%q) = %q, %d, %q, %v", p, mode, n, canon, err)
		}
	}
}
