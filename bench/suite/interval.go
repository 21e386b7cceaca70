// Intervals: an arm's TTFT p95 ÷ another's over a cell's interleaved rounds, with a ~95% interval.

package suite

import (
	"math"

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

// pairedP95Ratio is num's TTFT p95 ÷ den's over their rounds, paired by round number: nil
// when either arm has no usable row. Arms of one round (no Rounds) give their ratio without an
// interval; arms with rounds use the rounds in which both ran and some request succeeded (an
// arm with a failed or flagged round is flagged as a whole and has no ratio in the
// scoreboard: Analyze calls this for valid arms only).
func pairedP95Ratio(num, den *Arm) *RatioInterval {
	p95 := func(m *report.Mode) (float64, bool) {
		if m == nil || m.Requests <= m.Errors || !(m.TTFT.P95 > 0) {
			return 0, false
		}
		return m.TTFT.P95, true
	}
	var ratios []float64
	if len(num.Rounds) > 1 && len(den.Rounds) > 1 {
		for i := range min(len(num.Rounds), len(den.Rounds)) {
			a, okA := p95(num.Rounds[i].Mode)
			b, okB := p95(den.Rounds[i].Mode)
			if okA && okB {
				ratios = append(ratios, a/b)
			}
		}
	} else {
		a, okA := p95(num.Mode)
		b, okB := p95(den.Mode)
		if okA && okB {
			ratios = []float64{a / b}
		}
	}
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
