// The predicted-TTFT targets for the prefix arm, per cell: the scoreboard's last table.

package suite

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prefixlb/prefixlb/bench/report"
)

// The predicted-TTFT targets, per cell, for the prefix arm: TTFT p95 at
// most TargetP95Oracle × the oracle's and at most every peer policy's; TTFT p99 at most
// round-robin's; cached-token ratio at least TargetCachedOracle × the oracle's; max share /
// mean at most TargetMaxShare, or at most the oracle's where the oracle itself concentrates.
// Each is judged on the ~95% interval of its ratio over the cell's rounds (Verdict).
const (
	TargetP95Oracle    = 1.10
	TargetCachedOracle = 0.90
	TargetMaxShare     = 1.3
)

// TargetCheck is the prefix arm of one cell against the predicted-TTFT targets, each figure a
// ratio over the cell's rounds with its ~95% interval (RatioInterval: round i of prefix against
// round i of the yardstick) and judged on that interval (AtMost, AtLeast): met only when the
// whole interval is within the bound. A figure whose yardstick arm is missing or flagged is nil
// (Unjudged).
type TargetCheck struct {
	Cell string
	// P95Oracle is prefix's TTFT p95 ÷ the oracle's.
	P95Oracle *RatioInterval
	// Peers are prefix's TTFT p95 ÷ each valid peer arm's (Peers order; empty: none valid).
	Peers []PeerRatio
	// P99RR is prefix's TTFT p99 ÷ round-robin's.
	P99RR *RatioInterval
	// CachedOracle is prefix's cached-token ratio ÷ the oracle's.
	CachedOracle *RatioInterval
	// Share is prefix's max share / mean over its rounds (a ratio to 1: the figure itself, as
	// a geometric mean with its interval); ShareOracle prefix's ÷ the oracle's.
	Share, ShareOracle *RatioInterval
}

// PeerRatio is prefix's TTFT p95 ÷ one peer's.
type PeerRatio struct {
	Policy string
	Ratio  *RatioInterval
}

// Verdicts are the five targets in order: p95 ÷ oracle ≤ TargetP95Oracle, p95 ≤ every peer's
// (each prefix ÷ peer ≤ 1), p99 ≤ round-robin's, cached ÷ oracle ≥ TargetCachedOracle, max
// share ≤ TargetMaxShare or ≤ the oracle's.
func (t TargetCheck) Verdicts() [5]Verdict {
	peers := make([]Verdict, len(t.Peers))
	for i, p := range t.Peers {
		peers[i] = AtMost(p.Ratio, 1)
	}
	return [5]Verdict{
		AtMost(t.P95Oracle, TargetP95Oracle),
		All(peers...),
		AtMost(t.P99RR, 1),
		AtLeast(t.CachedOracle, TargetCachedOracle),
		Any(AtMost(t.Share, TargetMaxShare), AtMost(t.ShareOracle, 1)),
	}
}

// Verdict is the cell's verdict on every target together (All of Verdicts).
func (t TargetCheck) Verdict() Verdict {
	v := t.Verdicts()
	return All(v[:]...)
}

// Judged reports whether every yardstick arm (oracle, round-robin, at least one peer) was
// valid, so that each target could be judged.
func (t TargetCheck) Judged() bool {
	v := t.Verdicts()
	return !slices.Contains(v[:], Unjudged)
}

// Meets reports whether the cell holds every target, each on its interval.
func (t TargetCheck) Meets() bool { return t.Verdict() == Met }

// targetChecks is the cell's check, ok false when its prefix arm is not valid. arms are the
// cell's arms, rows' index for index.
func targetChecks(cell string, rows []Row, arms []Arm) (TargetCheck, bool) {
	find := func(p string) *Arm {
		if i := slices.IndexFunc(rows, func(r Row) bool { return r.Policy == p && r.Valid() }); i >= 0 {
			return &arms[i]
		}
		return nil
	}
	pre := find(PrefixPolicy)
	if pre == nil {
		return TargetCheck{}, false
	}
	p95 := func(m *report.Mode) float64 { return m.TTFT.P95 }
	share := func(m *report.Mode) float64 { return m.MaxShareOverMean }
	t := TargetCheck{Cell: cell, Share: scaledRatio(pre, share, 1)}
	if o := find(OraclePolicy); o != nil {
		t.P95Oracle = pairedRatio(pre, o, p95)
		t.CachedOracle = pairedRatio(pre, o, func(m *report.Mode) float64 { return m.CachedTokenRatio })
		t.ShareOracle = pairedRatio(pre, o, share)
	}
	if rr := find("round-robin"); rr != nil {
		t.P99RR = pairedRatio(pre, rr, func(m *report.Mode) float64 { return m.TTFT.P99 })
	}
	for _, p := range Peers {
		if a := find(p); a != nil {
			t.Peers = append(t.Peers, PeerRatio{Policy: p, Ratio: pairedRatio(pre, a, p95)})
		}
	}
	return t, true
}

// TargetsCaption states how the targets table judges: the bounds and the interval rule.
func TargetsCaption() string {
	return fmt.Sprintf("Targets: p95 ÷ oracle ≤ %.2f; p95 ≤ every peer's (prefix ÷ peer ≤ 1); p99 ≤ round-robin's; cached ÷ oracle ≥ %.2f; max share / mean ≤ %.1f or ≤ the oracle's. "+
		"Each figure is prefix's ÷ the yardstick arm's, round i against round i, with its %.0f%% t-interval in brackets. "+
		"A target is **met** when the whole interval is within the bound (for ≤: the upper end ≤ the bound), **not met** when the whole interval is beyond it, "+
		"**not shown** when the interval holds the bound or there is no interval (one round): a central estimate alone never decides. - : the yardstick arm is missing or flagged.",
		TargetP95Oracle, TargetCachedOracle, TargetMaxShare, IntervalLevel*100)
}

// targetsBlock is the targets' table: one row per cell with a valid prefix arm, the tally of
// judged cells by verdict, and the cells not judged (a yardstick missing or flagged) or whose
// prefix arm is flagged.
func targetsBlock(b *Board) string {
	if len(b.Targets) == 0 && len(b.PrefixFlagged) == 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n## Prefix against issue 15's targets\n\n%s\n\n", TargetsCaption())
	sb.WriteString("| cell | p95 ÷ oracle | p95 ÷ each peer | p99 ÷ rr | cached ÷ oracle | max share (÷ oracle) | all |\n|---|---|---|---|---|---|---|\n")
	count := map[Verdict]int{}
	var unjudged []string
	for _, t := range b.Targets {
		v := t.Verdicts()
		all := t.Verdict()
		if t.Judged() {
			count[all]++
		} else {
			unjudged = append(unjudged, t.Cell)
		}
		share := "-"
		if t.Share != nil {
			share = fmt.Sprintf("%s: %s (%s)", v[4], intervalText(t.Share), intervalText(t.ShareOracle))
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s |\n", t.Cell, judged(v[0], t.P95Oracle), peersText(t.Peers),
			judged(v[2], t.P99RR), judged(v[3], t.CachedOracle), share, all)
	}
	judgedN := count[Met] + count[NotMet] + count[NotShown]
	fmt.Fprintf(&sb, "\n%d of %d judged cells meet every target (%d not met, %d not shown)", count[Met], judgedN, count[NotMet], count[NotShown])
	if len(unjudged) > 0 {
		fmt.Fprintf(&sb, "; not judged (a yardstick arm missing or flagged): %s", strings.Join(unjudged, ", "))
	}
	if len(b.PrefixFlagged) > 0 {
		fmt.Fprintf(&sb, "; prefix flagged (see Validity): %s", strings.Join(b.PrefixFlagged, ", "))
	}
	sb.WriteString("\n")
	return sb.String()
}

// judged is a verdict with its figure ("-" when not judged).
func judged(v Verdict, ri *RatioInterval) string {
	if v == Unjudged {
		return "-"
	}
	return v.String() + ": " + intervalText(ri)
}

// peersText is the peers' verdict: "met" with the highest upper end when every peer is met,
// else each peer not met or not shown with its figure.
func peersText(peers []PeerRatio) string {
	if len(peers) == 0 {
		return "-"
	}
	var out []string
	worst := peers[0]
	for _, p := range peers {
		if v := AtMost(p.Ratio, 1); v != Met {
			out = append(out, fmt.Sprintf("%s %s %s", v, p.Policy, intervalText(p.Ratio)))
		}
		if upper(p.Ratio) > upper(worst.Ratio) {
			worst = p
		}
	}
	if len(out) == 0 {
		return fmt.Sprintf("met (highest: %s %s)", worst.Policy, intervalText(worst.Ratio))
	}
	return strings.Join(out, "; ")
}

// intervalText is "1.02 [0.95–1.10]", or the ratio alone without an interval ("-" for nil).
func intervalText(ri *RatioInterval) string {
	switch {
	case ri == nil:
		return "-"
	case !ri.HasInterval():
		return fmt.Sprintf("%.2f (one round)", ri.Ratio)
	}
	return fmt.Sprintf("%.2f [%.2f–%.2f]", ri.Ratio, ri.Lo, ri.Hi)
}

// upper is the interval's upper end, the ratio without an interval, 0 for nil.
func upper(ri *RatioInterval) float64 {
	switch {
	case ri == nil:
		return 0
	case ri.HasInterval():
		return ri.Hi
	}
	return ri.Ratio
}
