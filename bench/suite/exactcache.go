// The exact-cache gain (issue 55): what Dynamo's KV-event-fed exact index gains over the best
// approximate arm, per cell.

package suite

import (
	"fmt"
	"slices"
	"strings"
)

// ExactPolicy is the exact-cache arm: Dynamo's default mode, its index fed by the replicas'
// KV events; ApproxPolicy is the same router with an approximate index of what it routed
// (--no-kv-events), so ExactPolicy ÷ ApproxPolicy is the exact index's gain at the same cost
// function.
const (
	ExactPolicy  = "dynamo-kv"
	ApproxPolicy = "dynamo"
)

// ExactCache is one cell's exact-cache gain: ExactPolicy's TTFT p95 ÷ the best approximate
// arm's and ÷ ApproxPolicy's, each paired by round with its ~95% interval (pairedRatio). The
// best approximate arm is the valid arm with the lowest TTFT p95 (its median over the rounds)
// among all but the oracle and ExactPolicy. A ratio is nil where either arm is missing or
// flagged. Below 1: the exact index helps.
type ExactCache struct {
	// Best names the best approximate arm ("" when none is valid).
	Best     string         `json:"best_approximate,omitempty"`
	OverBest *RatioInterval `json:"p95_over_best,omitempty"`
	// OverApprox is ExactPolicy's p95 ÷ ApproxPolicy's.
	OverApprox *RatioInterval `json:"p95_over_dynamo,omitempty"`
}

// exactCache is the cell's exact-cache gain; nil when the cell has no ExactPolicy arm. arms
// are the cell's arms, rows' index for index.
func exactCache(rows []Row, arms []Arm) *ExactCache {
	xi := slices.IndexFunc(rows, func(r Row) bool { return r.Policy == ExactPolicy })
	if xi < 0 {
		return nil
	}
	e := &ExactCache{}
	best := -1
	for i, r := range rows {
		if i == xi || r.Policy == OraclePolicy || !r.Valid() || !(r.Mode.TTFT.P95 > 0) {
			continue
		}
		if best < 0 || r.Mode.TTFT.P95 < rows[best].Mode.TTFT.P95 {
			best = i
		}
	}
	if best >= 0 {
		e.Best = rows[best].Policy
	}
	if !rows[xi].Valid() {
		return e
	}
	if best >= 0 {
		e.OverBest = pairedP95Ratio(&arms[xi], &arms[best])
	}
	if ai := slices.IndexFunc(rows, func(r Row) bool { return r.Policy == ApproxPolicy && r.Valid() }); ai >= 0 {
		e.OverApprox = pairedP95Ratio(&arms[xi], &arms[ai])
	}
	return e
}

// exactReading is what a ratio's interval shows about the exact index: faster or slower when
// the whole interval is on one side of 1, else not shown.
func exactReading(ri *RatioInterval) string {
	switch {
	case ri == nil:
		return "-"
	case AtMost(ri, 1) == Met && ri.Hi < 1:
		return "exact faster"
	case AtLeast(ri, 1) == Met && ri.Lo > 1:
		return "exact slower"
	}
	return "not shown"
}

// exactCacheBlock is the exact-cache table, one row per cell that ran ExactPolicy; "" when no
// cell did.
func exactCacheBlock(b *Board) string {
	var sb strings.Builder
	for _, c := range b.Result.Cells {
		e := c.ExactCache
		if e == nil {
			continue
		}
		if sb.Len() == 0 {
			fmt.Fprintf(&sb, "\n## Exact cache index (issue 55): %s's TTFT p95 ÷ the best approximate arm's and ÷ %s's\n\n", ExactPolicy, ApproxPolicy)
			fmt.Fprintf(&sb, "Best approximate: the valid arm with the lowest median p95 other than %s and the oracle. Each ratio is %s's round i ÷ the other's round i, geometric mean with its %.0f%% t-interval (- : an arm missing or flagged).\n\n",
				ExactPolicy, ExactPolicy, IntervalLevel*100)
			fmt.Fprintf(&sb, "| cell | rounds | best approximate | %s ÷ best | reading | %s ÷ %s | reading |\n|---|---:|---|---|---|---|---|\n", ExactPolicy, ExactPolicy, ApproxPolicy)
		}
		fmt.Fprintf(&sb, "| %s | %d | %s | %s | %s | %s | %s |\n", c.Name(), max(c.Rounds, 1), or(e.Best, "-"),
			intervalText(e.OverBest), exactReading(e.OverBest), intervalText(e.OverApprox), exactReading(e.OverApprox))
	}
	if sb.Len() > 0 {
		fmt.Fprintf(&sb, "\nBelow 1: the exact index (KV events) helps, against the best approximate arm (should prefixlb consume KV events?) and against the same router without them; \"exact faster\" / \"exact slower\" only when the whole interval is below / above 1.\n")
	}
	return sb.String()
}
