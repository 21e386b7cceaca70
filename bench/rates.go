package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/prefixlb/prefixlb/bench/workload"
)

// Load sweep: `--rates a,b,c` runs every mode at every rate of an
// open-loop workload, each arm on fresh sims with the same seed.

// BaseRates are the open-loop workloads and the rate a preset's factor multiplies, in the
// workload's RateUnit. shared-prefix: its default --rate (workload.DefaultSharedPrefix); mooncake:
// the trace's own arrival rate (a rate r replays it at --time-scale ÷ r); oasst, mt-bench: one
// conversation per second, the order of what their default closed loop of 4 users with 0.5–2 s
// think times and 256-token replies sends. The model-time rate: arrival gaps are divided by
// --speedup like everything else. Workloads not listed (multi-turn) are closed-loop and take no
// --rates.
var BaseRates = map[string]float64{
	"shared-prefix": workload.DefaultSharedPrefix().Rate,
	"mooncake":      1,
	"oasst":         1,
	"mt-bench":      1,
}

// RatePresets are the named load levels of --rates, as factors of the workload's BaseRates
// entry: light 0.5×, medium 1×, saturation 2×. They are relative to the base rate, not to a
// measured capacity: "saturation" is near saturation only as far as the base rate is near half
// of what the replicas serve.
var RatePresets = map[string]float64{"light": 0.5, "medium": 1, "saturation": 2}

// ratePresetNames is RatePresets' keys from lightest to heaviest.
var ratePresetNames = []string{"light", "medium", "saturation"}

// RateUnit names what a rate of the workload counts ("" for a closed-loop workload).
func RateUnit(name string) string {
	switch name {
	case "shared-prefix":
		return "requests/s"
	case "mooncake":
		return "× the trace's arrival rate"
	case "oasst", "mt-bench":
		return "conversations/s"
	}
	return ""
}

// ResolveRates parses a --rates value for a workload: a comma-separated list of rates (> 0,
// in RateUnit) and preset names (RatePresets), e.g. "5,10" or "light,saturation". An empty spec
// is no sweep (nil). A closed-loop workload is an error.
func ResolveRates(name, spec string) ([]float64, error) {
	items := splitList(spec)
	if len(items) == 0 {
		return nil, nil
	}
	if name == "overload" {
		return nil, errors.New("--rates: the overload workload sets its load with --load (light, overload or a multiple of the capacity)")
	}
	base, ok := BaseRates[name]
	if !ok {
		return nil, closedLoopRates(name)
	}
	var out []float64
	for _, it := range items {
		if f, ok := RatePresets[it]; ok {
			out = append(out, f*base)
			continue
		}
		v, err := strconv.ParseFloat(it, 64)
		if err != nil {
			return nil, fmt.Errorf("--rates: %q is neither a number nor a preset (%s)", it, strings.Join(ratePresetNames, ", "))
		}
		out = append(out, v)
	}
	return out, nil
}

func closedLoopRates(name string) error {
	open := make([]string, 0, len(BaseRates))
	for n := range BaseRates {
		open = append(open, n)
	}
	slices.Sort(open)
	return fmt.Errorf("--rates: %s is a closed-loop workload (users and think times set its load); the open-loop workloads are %s", name, strings.Join(open, ", "))
}

// checkRates rejects a sweep the workload cannot run: a closed-loop workload, a rate that is
// not a positive finite number or is given twice, or a flag that sets the load another way.
func checkRates(o Options) error {
	if len(o.Rates) == 0 {
		return nil
	}
	if _, ok := BaseRates[o.Workload]; !ok {
		return closedLoopRates(o.Workload)
	}
	for i, r := range o.Rates {
		if !(r > 0) || math.IsInf(r, 0) {
			return fmt.Errorf("--rates: %g is not a rate > 0", r)
		}
		if slices.Contains(o.Rates[:i], r) {
			return fmt.Errorf("--rates: %g given twice", r)
		}
	}
	switch {
	case o.Flags.Rate > 0:
		return errors.New("--rate and --rates exclude each other")
	case o.Flags.Users > 0:
		return errors.New("--users sets a closed loop; --rates runs open-loop arrivals: give one of them")
	}
	return nil
}

// flagsAtRate returns the workload flags that run name at rate (0: f unchanged). mooncake
// takes the rate as a multiple of the trace's arrival rate, i.e. --time-scale ÷ rate.
func flagsAtRate(name string, f WorkloadFlags, rate float64) WorkloadFlags {
	if rate == 0 {
		return f
	}
	if name == "mooncake" {
		f.TimeScale = or(f.TimeScale, 1) / rate
	} else {
		f.Rate = rate
	}
	return f
}
