// The predicted-TTFT targets for the prefix arm, per cell: the scoreboard's last table.

package suite

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The predicted-TTFT targets, per cell, for the prefix arm: TTFT p95 at
// most TargetP95Oracle × the oracle's and at most every peer policy's; TTFT p99 at most
// round-robin's; cached-token ratio at least TargetCachedOracle × the oracle's; max share /
// mean at most TargetMaxShare, or at most the oracle's where the oracle itself concentrates.
const (
	TargetP95Oracle    = 1.10
	TargetCachedOracle = 0.90
	TargetMaxShare     = 1.3
)

// TargetCheck is the prefix arm of one cell against the predicted-TTFT targets. A figure whose
// yardstick arm is missing or flagged is NaN (not judged) and its check false.
type TargetCheck struct {
	Cell string
	// P95Oracle is prefix's TTFT p95 ÷ the oracle's; CachedOracle its cached-token ratio ÷
	// the oracle's.
	P95Oracle, CachedOracle float64
	// Beats lists the valid peer arms (Peers) whose p95 is below prefix's; PeersJudged counts
	// the valid peer arms.
	Beats       []string
	PeersJudged int
	// P99 and P99RR are prefix's and round-robin's TTFT p99 (ms).
	P99, P99RR float64
	// Share and ShareOracle are prefix's and the oracle's max share / mean.
	Share, ShareOracle float64
}

// Checks are the five targets in order: p95 ÷ oracle, p95 ≤ peers, p99 ≤ round-robin,
// cached ÷ oracle, max share.
func (t TargetCheck) Checks() [5]bool {
	return [5]bool{
		t.P95Oracle <= TargetP95Oracle,
		t.PeersJudged > 0 && len(t.Beats) == 0,
		t.P99 <= t.P99RR,
		t.CachedOracle >= TargetCachedOracle,
		t.Share <= TargetMaxShare || t.Share <= t.ShareOracle,
	} // every comparison with NaN is false
}

// Judged reports whether every yardstick arm (oracle, round-robin, at least one peer) was valid,
// so that each check could be made.
func (t TargetCheck) Judged() bool {
	return !math.IsNaN(t.P95Oracle) && !math.IsNaN(t.CachedOracle) && !math.IsNaN(t.P99RR) &&
		!math.IsNaN(t.ShareOracle) && t.PeersJudged > 0
}

// Meets reports whether the cell holds every target.
func (t TargetCheck) Meets() bool {
	c := t.Checks()
	return !slices.Contains(c[:], false)
}

// targetChecks is the cell's check, ok false when its prefix arm is not valid.
func targetChecks(cell string, rows []Row) (TargetCheck, bool) {
	find := func(p string) *Row { return validRow(rows, p) }
	pre := find(PrefixPolicy)
	if pre == nil {
		return TargetCheck{}, false
	}
	nan := math.NaN()
	t := TargetCheck{Cell: cell, P95Oracle: pre.Ratio, CachedOracle: nan, P99: pre.Mode.TTFT.P99, P99RR: nan,
		Share: pre.Mode.MaxShareOverMean, ShareOracle: nan}
	if o := find(OraclePolicy); o != nil {
		if o.Mode.CachedTokenRatio > 0 {
			t.CachedOracle = pre.Mode.CachedTokenRatio / o.Mode.CachedTokenRatio
		}
		t.ShareOracle = o.Mode.MaxShareOverMean
	}
	if rr := find("round-robin"); rr != nil {
		t.P99RR = rr.Mode.TTFT.P99
	}
	for _, p := range Peers {
		if r := find(p); r != nil {
			t.PeersJudged++
			if r.Mode.TTFT.P95 < pre.Mode.TTFT.P95 {
				t.Beats = append(t.Beats, p)
			}
		}
	}
	return t, true
}

// targetsBlock is the targets' table: one row per cell with a valid prefix arm, the count of
// judged cells that meet every target, and the cells not judged (a yardstick missing or
// flagged) or whose prefix arm is flagged.
func targetsBlock(b *Board) string {
	if len(b.Targets) == 0 && len(b.PrefixFlagged) == 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n## Prefix against issue 15's targets\n\np95 ÷ oracle ≤ %.2f; p95 ≤ every peer's; p99 ≤ round-robin's; cached ÷ oracle ≥ %.2f; max share / mean ≤ %.1f or ≤ the oracle's. - : the yardstick arm is missing or flagged.\n\n",
		TargetP95Oracle, TargetCachedOracle, TargetMaxShare)
	sb.WriteString("| cell | p95 ÷ oracle | p95 ≤ peers | p99 ≤ rr (prefix/rr ms) | cached ÷ oracle | max share (oracle) | all |\n|---|---:|---|---|---:|---|---|\n")
	met, judged := 0, 0
	var unjudged []string
	for _, t := range b.Targets {
		if t.Judged() {
			judged++
		} else {
			unjudged = append(unjudged, t.Cell)
		}
		ok := t.Checks()
		peers := "yes"
		switch {
		case t.PeersJudged == 0:
			peers = "-"
		case len(t.Beats) > 0:
			peers = "no: " + strings.Join(t.Beats, ", ")
		}
		p99 := "-"
		if !math.IsNaN(t.P99RR) {
			p99 = fmt.Sprintf("%s (%s/%s)", yes(ok[2]), fms(t.P99), fms(t.P99RR))
		}
		cached := "-"
		if !math.IsNaN(t.CachedOracle) {
			cached = fmt.Sprintf("%.3f", t.CachedOracle)
		}
		share := fmt.Sprintf("%.2f (%s)", t.Share, ratio(t.ShareOracle))
		all := yes(t.Meets())
		switch {
		case t.Meets():
			met++
		case !t.Judged():
			all = "not judged"
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s |\n", t.Cell, ratio(t.P95Oracle), peers, p99, cached, share, all)
	}
	fmt.Fprintf(&sb, "\n%d of %d judged cells meet every target", met, judged)
	if len(unjudged) > 0 {
		fmt.Fprintf(&sb, "; not judged (a yardstick arm missing or flagged): %s", strings.Join(unjudged, ", "))
	}
	if len(b.PrefixFlagged) > 0 {
		fmt.Fprintf(&sb, "; prefix flagged (see Validity): %s", strings.Join(b.PrefixFlagged, ", "))
	}
	sb.WriteString("\n")
	return sb.String()
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
