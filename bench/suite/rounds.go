// Rounds: a cell's arms run several times and are scored by their median.

package suite

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/prefixlb/prefixlb/bench/report"
)

// Combine makes one arm of a policy's rounds (runs of the same cell, same seed, each on fresh
// replicas). One round is returned as it is. With several, Mode is a copy of the round with
// the median TTFT p95 (for the request counts, ITL, shares and routes) whose scored figures are
// each the median over the rounds: TTFT and E2E p50/p90/p95/p99, mean and max, cached-token
// ratio, max share / mean. Rounds in which no request succeeded have no figures and are left
// out of the medians (unless no round has any). A median never hides a bad round: Errors and
// UsageMissing are the most any round had; each round's flags are kept, prefixed "round N:";
// a round that failed (Error) or produced no row, or that sent other requests (digest or
// count) than the representative, flags the arm. WallS is the rounds' sum; Rounds keeps every
// round.
func Combine(policy string, rounds []Arm) Arm {
	if len(rounds) == 1 {
		return rounds[0]
	}
	a := Arm{Policy: policy, Rounds: rounds}
	var modes, scored []*report.Mode
	var errs, flags []string
	for i, r := range rounds {
		a.WallS += r.WallS
		switch {
		case r.Error != "":
			errs = append(errs, fmt.Sprintf("round %d: %s", i+1, r.Error))
		case r.Mode == nil:
			errs = append(errs, fmt.Sprintf("round %d: no report", i+1))
		}
		if r.Mode == nil {
			continue
		}
		modes = append(modes, r.Mode)
		if r.Mode.Requests > r.Mode.Errors {
			scored = append(scored, r.Mode)
		}
		for _, f := range r.Mode.Flags {
			flags = append(flags, fmt.Sprintf("round %d: %s", i+1, f))
		}
	}
	a.Error = strings.Join(errs, "; ")
	if len(modes) == 0 {
		return a
	}
	if len(scored) == 0 {
		scored = modes
	}
	byP95 := slices.Clone(scored)
	slices.SortStableFunc(byP95, func(x, y *report.Mode) int { return cmp.Compare(x.TTFT.P95, y.TTFT.P95) })
	repr := byP95[(len(byP95)-1)/2]
	m := *repr
	m.TTFT = medianLatency(scored, repr, func(x *report.Mode) *report.Latency { return &x.TTFT })
	m.E2E = medianLatency(scored, repr, func(x *report.Mode) *report.Latency { return &x.E2E })
	m.CachedTokenRatio = medianOf(scored, func(x *report.Mode) float64 { return x.CachedTokenRatio })
	m.MaxShareOverMean = medianOf(scored, func(x *report.Mode) float64 { return x.MaxShareOverMean })
	m.Flags = flags
	for _, x := range modes {
		m.Errors = max(m.Errors, x.Errors)
		m.UsageMissing = max(m.UsageMissing, x.UsageMissing)
		if x.RequestsDigest != repr.RequestsDigest || x.Requests != repr.Requests {
			if f := "rounds sent different requests"; !slices.Contains(m.Flags, f) {
				m.Flags = append(m.Flags, f)
			}
		}
	}
	a.Mode = &m
	return a
}

// medianOf is the median of f over the rounds' rows.
func medianOf(modes []*report.Mode, f func(*report.Mode) float64) float64 {
	xs := make([]float64, len(modes))
	for i, x := range modes {
		xs[i] = f(x)
	}
	return report.Median(xs)
}

// medianLatency is the per-field median of the rounds' latencies (Count the representative's).
func medianLatency(modes []*report.Mode, repr *report.Mode, l func(*report.Mode) *report.Latency) report.Latency {
	field := func(f func(*report.Latency) float64) float64 {
		return medianOf(modes, func(x *report.Mode) float64 { return f(l(x)) })
	}
	return report.Latency{
		P50:   field(func(x *report.Latency) float64 { return x.P50 }),
		P90:   field(func(x *report.Latency) float64 { return x.P90 }),
		P95:   field(func(x *report.Latency) float64 { return x.P95 }),
		P99:   field(func(x *report.Latency) float64 { return x.P99 }),
		Mean:  field(func(x *report.Latency) float64 { return x.Mean }),
		Max:   field(func(x *report.Latency) float64 { return x.Max }),
		Count: l(repr).Count,
	}
}

// spread is the lowest and highest of a figure over an arm's rounds in which some request
// succeeded (ok false with fewer than two).
func spread(a *Arm, f func(*report.Mode) float64) (lo, hi float64, ok bool) {
	n := 0
	for _, r := range a.Rounds {
		if r.Mode == nil || r.Mode.Requests == r.Mode.Errors {
			continue
		}
		v := f(r.Mode)
		if n == 0 || v < lo {
			lo = v
		}
		if n == 0 || v > hi {
			hi = v
		}
		n++
	}
	return lo, hi, n > 1
}
