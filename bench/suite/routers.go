// Several prefixlb replicas against one: the target for the multi-router arms.

package suite

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prefixlb/prefixlb/bench/report"
)

// The target for N prefixlb replicas behind a per-request spread, against one prefixlb
// (the prefix arm) in the same cell: the cached-token ratio at least RoutersCachedTarget of
// prefix's and TTFT p95 at most RoutersP95Target × prefix's, both compared round by round
// where the cell ran several (pairedRounds).
const (
	RoutersCachedTarget = 0.99
	RoutersP95Target    = 1.15
)

// RouterCheck is one multi-router arm of one cell against the cell's prefix arm.
type RouterCheck struct {
	Cell   string
	Policy string // prefix×N or prefix×N+peer
	// Cached is the arm's cached-token ratio ÷ prefix's, over the rounds both ran (cached
	// tokens summed over them); P95 its TTFT p95 ÷ prefix's: the median over the rounds of
	// each round's ratio to prefix's round of the same number (pairedRounds).
	Cached, P95 float64
	// Rounds are the per-round p95 ratios P95 is the median of (nil: one round each).
	Rounds []float64
}

// Meets reports whether the arm holds the several-replicas target (RoutersCachedTarget,
// RoutersP95Target).
func (c RouterCheck) Meets() bool {
	return c.Cached >= RoutersCachedTarget && c.P95 <= RoutersP95Target
}

// routerChecks compares each valid multi-router arm of a cell with its valid prefix arm
// (none: nothing is compared; a prefix arm without cache hits or p95 is no yardstick). arms
// are the cell's arms, rows' index for index.
func routerChecks(cell string, rows []Row, arms []Arm) []RouterCheck {
	oi := slices.IndexFunc(rows, func(r Row) bool { return r.Policy == PrefixPolicy && r.Valid() })
	if oi < 0 || rows[oi].Mode.CachedTokenRatio <= 0 || rows[oi].Mode.TTFT.P95 <= 0 {
		return nil
	}
	one := rows[oi].Mode
	var out []RouterCheck
	for i, r := range rows {
		if _, n, _, err := ParsePolicy(r.Policy); err != nil || n < 2 || !r.Valid() {
			continue
		}
		c := RouterCheck{Cell: cell, Policy: r.Policy,
			Cached: r.Mode.CachedTokenRatio / one.CachedTokenRatio, P95: r.Mode.TTFT.P95 / one.TTFT.P95}
		if cached, p95, rounds, ok := pairedRounds(&arms[i], &arms[oi]); ok {
			c.Cached, c.P95, c.Rounds = cached, p95, rounds
		}
		out = append(out, c)
	}
	return out
}

// pairedRounds compares arm x with arm y round by round, for cells that ran several rounds
// (ok false otherwise, or when a round of either has no figures): the cached-token ratio of
// x's rounds together ÷ y's (cached tokens over prompt tokens, summed over the rounds), and
// the median over the rounds of x's TTFT p95 ÷ y's in the same round, with those ratios in
// round order.
//
// Why not the ratio of the two arms' medians (Combine), as the rest of the scoreboard: the
// suite interleaves rounds (every policy once, then again), so the two arms of a round ran a
// few seconds apart, and a shared machine's speed drifts between rounds by more than
// RoutersP95Target's margin; the paired ratio cancels that drift. Cached tokens are a sum
// that a slow moment does not move, so they are pooled. To see the drift: interleave
// `bench compare --workload oasst --conversations 300 --rate 32 --speedup 2 --modes prefix`
// with the same plus `--router-replicas 3 --peering`, ten times each.
func pairedRounds(x, y *Arm) (cached, p95 float64, rounds []float64, ok bool) {
	if len(x.Rounds) < 2 || len(x.Rounds) != len(y.Rounds) {
		return 0, 0, nil, false
	}
	var xc, xp, yc, yp int64
	for i := range x.Rounds {
		a, b := x.Rounds[i].Mode, y.Rounds[i].Mode
		if a == nil || b == nil || a.Requests == a.Errors || b.Requests == b.Errors || a.TTFT.P95 <= 0 || b.TTFT.P95 <= 0 {
			return 0, 0, nil, false
		}
		rounds = append(rounds, a.TTFT.P95/b.TTFT.P95)
		xc, xp, yc, yp = xc+a.CachedTokens, xp+a.PromptTokens, yc+b.CachedTokens, yp+b.PromptTokens
	}
	if xp == 0 || yp == 0 || yc == 0 {
		return 0, 0, nil, false
	}
	return (float64(xc) / float64(xp)) / (float64(yc) / float64(yp)), report.Median(rounds), rounds, true
}

// routersBlock is the part of "where prefix loses" on the multi-router arms: per cell each
// arm's cached-token ratio and TTFT p95 ÷ prefix's, whether it meets the several-replicas
// target, and a tally per arm. Empty when the suite ran no multi-router arm.
func routersBlock(b *Board) string {
	var arms []string // multi-router policies, in the suite's order
	for _, p := range b.Result.Policies {
		if _, n, _, err := ParsePolicy(p); err == nil && n > 1 {
			arms = append(arms, p)
		}
	}
	if len(arms) == 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "- several prefixlb replicas against one (issue 16's target: cached-token ratio ≥ %.0f%% of prefix's, TTFT p95 ≤ %.2f× prefix's",
		RoutersCachedTarget*100, RoutersP95Target)
	if slices.ContainsFunc(b.Routers, func(c RouterCheck) bool { return len(c.Rounds) > 0 }) {
		sb.WriteString("; over several rounds the p95 ratio is the median of the per-round ratios and the cached ratio that of the tokens summed over the rounds, not the tables' medians")
	}
	sb.WriteString("):\n")
	met, judged := map[string]int{}, map[string]int{}
	var order []string
	byCell := map[string][]string{}
	for _, c := range b.Routers {
		if byCell[c.Cell] == nil {
			order = append(order, c.Cell)
		}
		verdict := "misses"
		if c.Meets() {
			verdict = "meets"
			met[c.Policy]++
		}
		judged[c.Policy]++
		line := fmt.Sprintf("%s cached %.3f×, p95 %.2f× (%s)", c.Policy, c.Cached, c.P95, verdict)
		if len(c.Rounds) > 0 {
			rs := make([]string, len(c.Rounds))
			for i, r := range c.Rounds {
				rs[i] = fmt.Sprintf("%.2f", r)
			}
			line += fmt.Sprintf(", per-round p95 ratios %s", strings.Join(rs, " / "))
		}
		byCell[c.Cell] = append(byCell[c.Cell], line)
	}
	for _, cell := range order {
		fmt.Fprintf(&sb, "  - %s: %s\n", cell, strings.Join(byCell[cell], "; "))
	}
	var tally []string
	for _, p := range arms {
		tally = append(tally, fmt.Sprintf("%s meets it in %d of %d judged cells", p, met[p], judged[p]))
	}
	fmt.Fprintf(&sb, "  - %s\n", strings.Join(tally, "; "))
	return sb.String()
}
