package bench

import (
	"slices"
	"strings"
	"testing"
)

func TestResolveRates(t *testing.T) {
	for _, c := range []struct {
		workload, spec string
		want           []float64
		err            string
	}{
		{"shared-prefix", "", nil, ""},
		{"shared-prefix", "5, 10,2.5", []float64{5, 10, 2.5}, ""},
		{"shared-prefix", "light,medium,saturation", []float64{10, 20, 40}, ""},
		{"mooncake", "light,saturation,3", []float64{0.5, 2, 3}, ""},
		{"oasst", "medium", []float64{1}, ""},
		{"mt-bench", "saturation", []float64{2}, ""},
		{"shared-prefix", "heavy", nil, `"heavy" is neither a number nor a preset`},
		{"multi-turn", "5", nil, "multi-turn is a closed-loop workload"},
	} {
		got, err := ResolveRates(c.workload, c.spec)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s %q: err %v, want %q", c.workload, c.spec, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s %q: %v %v, want %v", c.workload, c.spec, got, err, c.want)
		}
	}
}

func TestCheckRates(t *testing.T) {
	for _, c := range []struct {
		name string
		o    Options
		err  string
	}{
		{"no sweep", Options{Workload: "multi-turn"}, ""},
		{"open loop", Options{Workload: "shared-prefix", Rates: []float64{5, 10}}, ""},
		{"closed loop", Options{Workload: "multi-turn", Rates: []float64{5}}, "closed-loop"},
		{"zero rate", Options{Workload: "oasst", Rates: []float64{0}}, "not a rate > 0"},
		{"negative rate", Options{Workload: "oasst", Rates: []float64{-1}}, "not a rate > 0"},
		{"twice", Options{Workload: "shared-prefix", Rates: []float64{5, 5}}, "given twice"},
		{"with --rate", Options{Workload: "shared-prefix", Rates: []float64{5}, Flags: WorkloadFlags{Rate: 3}}, "--rate and --rates"},
		{"with --users", Options{Workload: "oasst", Rates: []float64{5}, Flags: WorkloadFlags{Users: 3}}, "--users"},
	} {
		err := checkRates(c.o)
		if (c.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want %q", c.name, err, c.err)
		}
	}
}

// TestFlagsAtRate: mooncake's rate divides its time scale; other workloads take it as --rate.
func TestFlagsAtRate(t *testing.T) {
	if f := flagsAtRate("mooncake", WorkloadFlags{TimeScale: 1}, 4); f.TimeScale != 0.25 || f.Rate != 0 {
		t.Fatalf("mooncake ×4: %+v", f)
	}
	if f := flagsAtRate("mooncake", WorkloadFlags{TimeScale: 0.5}, 2); f.TimeScale != 0.25 {
		t.Fatalf("mooncake --time-scale 0.5 ×2: %+v", f)
	}
	if f := flagsAtRate("shared-prefix", WorkloadFlags{}, 7); f.Rate != 7 {
		t.Fatalf("shared-prefix 7: %+v", f)
	}
	if f := flagsAtRate("shared-prefix", WorkloadFlags{Rate: 3}, 0); f.Rate != 3 {
		t.Fatalf("no sweep changed the flags: %+v", f)
	}
}
