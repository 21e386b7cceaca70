// Intervals: an arm's TTFT p95 ÷ another's over a cell's interleaved rounds, with a ~95% interval.

package suite

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/prefixlb/prefixlb/bench/report"
)

// IntervalLevel is the confidence of the suite's ratio intervals: 95%.
const IntervalLevel = 0.95

// RatioInterval is one arm's TTFT p95 ÷ another's (the oracle's: Arm.P95Oracle) over a
// cell's rounds. Round i of each arm ran in the same pass over the policies (interleaved:
// every policy once, then again), minutes apart at most, so each round's ratio cancels most of
// a slow spell of the shared machine that hit both; the rounds, each on fresh sims, are the
// independent units, not the requests within one (whose latencies queue behind one another).
//
// Ratio is the geometric mean of the rounds' ratios (the mean of their logarithms, where
// ratios are symmetric: 2× and ½× average to 1); Lo and Hi are the Student's t interval on
// that mean log-ratio, exp(m ± t(IntervalLevel, n−1) · s/√n), with n rounds and s their
// standard deviation. With one round there is no interval (Lo and Hi are 0) and Ratio is that
// round's ratio. The interval assumes the log-ratios of rounds are independent and roughly
// normal; with 3 rounds t is 4.30, so it is wide unless the rounds agree: the rounds needed
// for a verdict are the cell's to choose (--rounds).
type RatioInterval struct {
	// Rounds are the rounds' ratios in round order.
	Rounds []float64 `json:"rounds"`
	Ratio  float64   `json:"ratio"`
	Lo     float64   `json:"lo,omitempty"`
	Hi     float64   `json:"hi,omitempty"`
	// Level is the interval's confidence (IntervalLevel; 0 without an interval).
	Level float64 `json:"level,omitempty"`
}

// HasInterval reports whether the ratio has an interval (two rounds or more).
func (r *RatioInterval) HasInterval() bool { return r != nil && r.Level > 0 }

// LogRatioInterval is the geometric mean of ratios (each > 0) and its two-sided Student's t
// interval at level: exp(mean ± t·sd/√n) over their logarithms. ok is false when a ratio is
// not positive and finite or there are none; with one ratio lo and hi are that ratio too and
// ok is true (no spread to estimate: the caller says "one round").
func LogRatioInterval(ratios []float64, level float64) (gm, lo, hi float64, ok bool) {
	n := len(ratios)
	if n == 0 {
		return 0, 0, 0, false
	}
	var sum float64
	logs := make([]float64, n)
	for i, r := range ratios {
		if !(r > 0) || math.IsInf(r, 0) {
			return 0, 0, 0, false
		}
		logs[i] = math.Log(r)
		sum += logs[i]
	}
	m := sum / float64(n)
	if n == 1 {
		v := math.Exp(m)
		return v, v, v, true
	}
	var ss float64
	for _, l := range logs {
		ss += (l - m) * (l - m)
	}
	sd := math.Sqrt(ss / float64(n-1))
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(n - 1)}.Quantile(1 - (1-level)/2)
	half := t * sd / math.Sqrt(float64(n))
	return math.Exp(m), math.Exp(m - half), math.Exp(m + half), true
}

// pairedP95Ratio is num's TTFT p95 ÷ den's over their rounds, paired by round number
// (pairedRatio of the p95s).
func pairedP95Ratio(num, den *Arm) *RatioInterval {
	return pairedRatio(num, den, func(m *report.Mode) float64 { return m.TTFT.P95 })
}

// pairedRatio is f(num) ÷ f(den) over their rounds, paired by round number: nil when either
// arm has no usable row. Arms of one round (no Rounds) give their ratio without an interval;
// arms with rounds use the rounds in which both ran, some request succeeded and f is positive
// (an arm with a failed or flagged round is flagged as a whole and has no ratio in the
// scoreboard: Analyze calls this for valid arms only).
func pairedRatio(num, den *Arm, f func(*report.Mode) float64) *RatioInterval {
	var ratios []float64
	if len(num.Rounds) > 1 && len(den.Rounds) > 1 {
		for i := range min(len(num.Rounds), len(den.Rounds)) {
			a, okA := figure(num.Rounds[i].Mode, f)
			b, okB := figure(den.Rounds[i].Mode, f)
			if okA && okB {
				ratios = append(ratios, a/b)
			}
		}
	} else {
		a, okA := figure(num.Mode, f)
		b, okB := figure(den.Mode, f)
		if okA && okB {
			ratios = []float64{a / b}
		}
	}
	return intervalOf(ratios)
}

// scaledRatio is f(a) ÷ bound over a's rounds (or its one row): the interval of one arm's
// figure against a fixed bound, e.g. max share / mean against TargetMaxShare.
func scaledRatio(a *Arm, f func(*report.Mode) float64, bound float64) *RatioInterval {
	var ratios []float64
	if len(a.Rounds) > 1 {
		for _, r := range a.Rounds {
			if v, ok := figure(r.Mode, f); ok {
				ratios = append(ratios, v/bound)
			}
		}
	} else if v, ok := figure(a.Mode, f); ok {
		ratios = []float64{v / bound}
	}
	return intervalOf(ratios)
}

// figure is f of a row in which some request succeeded, ok when it is positive and finite.
func figure(m *report.Mode, f func(*report.Mode) float64) (float64, bool) {
	if m == nil || m.Requests <= m.Errors {
		return 0, false
	}
	v := f(m)
	return v, v > 0 && !math.IsInf(v, 0)
}

// intervalOf is the ratios' geometric mean with its interval (none for one ratio); nil when
// there is no ratio.
func intervalOf(ratios []float64) *RatioInterval {
	gm, lo, hi, ok := LogRatioInterval(ratios, IntervalLevel)
	if !ok {
		return nil
	}
	ri := &RatioInterval{Rounds: ratios, Ratio: gm}
	if len(ratios) > 1 {
		ri.Lo, ri.Hi, ri.Level = lo, hi, IntervalLevel
	}
	return ri
}

// Verdict is a target judged on a ratio's interval.
type Verdict int

// The verdicts. A target is Met only when the whole interval is on its side of the bound
// (for "at most": the upper end ≤ the bound), NotMet when the whole interval is on the
// other side, NotShown when the interval holds the bound or there is no interval (one
// round): a central estimate alone never decides. Unjudged: the yardstick arm is missing or
// flagged.
const (
	Unjudged Verdict = iota
	NotShown
	NotMet
	Met
)

func (v Verdict) String() string {
	return [...]string{"not judged", "not shown", "not met", "met"}[v]
}

// AtMost judges "ratio ≤ bound": Met when the interval's upper end is ≤ bound, NotMet when
// its lower end is > bound, NotShown otherwise or without an interval, Unjudged for nil.
func AtMost(ri *RatioInterval, bound float64) Verdict {
	switch {
	case ri == nil:
		return Unjudged
	case !ri.HasInterval():
		return NotShown
	case ri.Hi <= bound:
		return Met
	case ri.Lo > bound:
		return NotMet
	}
	return NotShown
}

// AtLeast judges "ratio ≥ bound": Met when the interval's lower end is ≥ bound, NotMet when
// its upper end is < bound, NotShown otherwise or without an interval, Unjudged for nil.
func AtLeast(ri *RatioInterval, bound float64) Verdict {
	switch {
	case ri == nil:
		return Unjudged
	case !ri.HasInterval():
		return NotShown
	case ri.Lo >= bound:
		return Met
	case ri.Hi < bound:
		return NotMet
	}
	return NotShown
}

// All is the verdict of several targets together: NotMet when one is not met, else Unjudged
// when one is not judged, else NotShown when one is not shown, else Met (none: Unjudged).
func All(vs ...Verdict) Verdict {
	if len(vs) == 0 {
		return Unjudged
	}
	out := Met
	for _, v := range vs {
		switch {
		case v == NotMet:
			return NotMet
		case v == Unjudged:
			out = Unjudged
		case v == NotShown && out == Met:
			out = NotShown
		}
	}
	return out
}

// Any is the verdict of "one of these targets": Met when one is met, else NotShown when one
// is not shown, else Unjudged when one is not judged, else NotMet (none: Unjudged).
func Any(vs ...Verdict) Verdict {
	switch {
	case slices.Contains(vs, Met):
		return Met
	case slices.Contains(vs, NotShown):
		return NotShown
	case len(vs) == 0 || slices.Contains(vs, Unjudged):
		return Unjudged
	}
	return NotMet
}
