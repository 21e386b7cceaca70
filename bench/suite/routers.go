// Several prefixlb replicas against one: issue 16's target for the multi-router arms.

package suite

import (
	"fmt"
	"strings"
)

// Issue 16's target for N prefixlb replicas behind a per-request spread, against one prefixlb
// (the prefix arm) in the same cell: the cached-token ratio at least RoutersCachedTarget of
// prefix's and TTFT p95 at most RoutersP95Target × prefix's.
const (
	RoutersCachedTarget = 0.99
	RoutersP95Target    = 1.15
)

// RouterCheck is one multi-router arm of one cell against the cell's prefix arm.
type RouterCheck struct {
	Cell   string
	Policy string // prefix×N or prefix×N+peer
	// Cached is the arm's cached-token ratio ÷ prefix's; P95 its TTFT p95 ÷ prefix's.
	Cached, P95 float64
}

// Meets reports whether the arm holds issue 16's target.
func (c RouterCheck) Meets() bool {
	return c.Cached >= RoutersCachedTarget && c.P95 <= RoutersP95Target
}

// routerChecks compares each valid multi-router arm of a cell with its valid prefix arm
// (none: nothing is compared; a prefix arm without cache hits or p95 is no yardstick).
func routerChecks(cell string, rows []Row) []RouterCheck {
	one := validRow(rows, PrefixPolicy)
	if one == nil || one.Mode.CachedTokenRatio <= 0 || one.Mode.TTFT.P95 <= 0 {
		return nil
	}
	var out []RouterCheck
	for _, r := range rows {
		if _, n, _, err := ParsePolicy(r.Policy); err != nil || n < 2 || !r.Valid() {
			continue
		}
		out = append(out, RouterCheck{Cell: cell, Policy: r.Policy,
			Cached: r.Mode.CachedTokenRatio / one.Mode.CachedTokenRatio, P95: r.Mode.TTFT.P95 / one.Mode.TTFT.P95})
	}
	return out
}

// routersBlock is the part of "where prefix loses" on the multi-router arms: per cell each
// arm's cached-token ratio and TTFT p95 ÷ prefix's, whether it meets issue 16's target, and a
// tally per arm. Empty when the suite ran no multi-router arm.
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
	fmt.Fprintf(&sb, "- several prefixlb replicas against one (issue 16's target: cached-token ratio ≥ %.0f%% of prefix's, TTFT p95 ≤ %.2f× prefix's):\n",
		RoutersCachedTarget*100, RoutersP95Target)
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
		byCell[c.Cell] = append(byCell[c.Cell], fmt.Sprintf("%s cached %.3f×, p95 %.2f× (%s)", c.Policy, c.Cached, c.P95, verdict))
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
