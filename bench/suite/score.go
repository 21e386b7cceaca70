package suite

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/bench/report"
)

// LossMargin is how far above another arm's TTFT p95 prefix's must be for the cell to count
// as a loss: 10%, above the run-to-run noise of a p95 on a shared 2-core machine.
const LossMargin = 0.10

// Row is one arm in the scoreboard.
type Row struct {
	Policy string
	// Mode is the arm's report row (nil: not run).
	Mode *report.Mode
	// Flags are why the arm is not valid (empty: valid).
	Flags []string
	// Ratio is TTFT p95 ÷ the oracle's TTFT p95 in the same cell (Interval.Ratio: over
	// several rounds, the geometric mean of the rounds' ratios); NaN when this arm or the
	// cell's oracle arm is flagged, missing or has no p95.
	Ratio float64
	// Interval is Ratio with its rounds and its ~95% interval (nil where Ratio is NaN).
	Interval *RatioInterval
	// PrefixOver is the cell's prefix arm's TTFT p95 ÷ this arm's, paired by round with its
	// ~95% interval (pairedRatio); nil for the prefix arm itself and where either is flagged.
	PrefixOver *RatioInterval
	// P95 and P99 are the lowest and highest TTFT p95 and p99 over the arm's rounds (ms;
	// zero for one round: Combine).
	P95, P99 [2]float64
	// Failed is the most requests any of the arm's rounds failed (armFailed): its errors, less,
	// on a multi-tenant workload, the refused and expired ones.
	Failed int
}

// Valid reports whether the row counts: it ran, has no flags and no failed requests.
func (r Row) Valid() bool {
	return r.Mode != nil && len(r.Flags) == 0 && r.Failed == 0 && r.Mode.Requests > 0
}

// failedRequests are a report row's failed requests: its errors, less, on a multi-tenant
// workload (the overload cells), the requests refused (429/503) or given up by their client
// before the first token, which its clients and the flow-control arms do by design and the
// tenant table counts (bench's validity check counts them the same way).
func failedRequests(m *report.Mode) int {
	if len(m.Tenants) == 0 {
		return m.Errors
	}
	return max(m.Errors-m.Refused-m.Expired, 0)
}

// armFailed is the most requests one of an arm's rounds failed (failedRequests; the arm's own
// row for one round).
func armFailed(a *Arm) int {
	if len(a.Rounds) == 0 {
		if a.Mode == nil {
			return 0
		}
		return failedRequests(a.Mode)
	}
	n := 0
	for _, r := range a.Rounds {
		if r.Mode != nil {
			n = max(n, failedRequests(r.Mode))
		}
	}
	return n
}

// Loss is one cell where prefix's TTFT p95 exceeds another valid arm's by more than LossMargin.
type Loss struct {
	Cell      string
	Against   string
	PrefixP95 float64 // ms
	OtherP95  float64 // ms
}

// Board is the analysed suite: per cell, one row per arm in policy order.
type Board struct {
	Result *Result
	Rows   [][]Row
	Losses []Loss
	// Unjudged are cells where prefix or every arm it is compared with is not valid.
	Unjudged []string
	// PeersOnly are judged cells whose oracle arm ran but is flagged: prefix was compared
	// with the peers only.
	PeersOnly []string
	// Routers are the multi-router arms (prefix×N, prefix×N+peer) against the prefix arm,
	// per cell (routers.go).
	Routers []RouterCheck
	// Targets are the cells' prefix arms against the predicted-TTFT targets (targets.go),
	// for the cells with a valid prefix arm; PrefixFlagged the cells whose prefix arm ran but
	// is not valid.
	Targets       []TargetCheck
	PrefixFlagged []string
}

// Analyze flags every arm (not run, failed, the bench's validity flags, requests that differ
// from the rest of its cell), computes each valid arm's p95 ÷ the valid oracle's, and lists
// the cells where prefix loses. It sets each Arm's Flags and each cell's Notes in r.
func Analyze(r *Result) *Board {
	b := &Board{Result: r}
	for ci := range r.Cells {
		c := &r.Cells[ci]
		c.Notes = nil
		flags := make([][]string, len(c.Arms))
		for i, a := range c.Arms {
			switch {
			case a.Mode == nil:
				flags[i] = append(flags[i], "not run: "+or(a.Error, "no report"))
			case a.Error != "":
				flags[i] = append(flags[i], "failed: "+a.Error)
			}
			if a.Mode != nil {
				flags[i] = append(flags[i], armFlags(*a.Mode, armFailed(&c.Arms[i]))...)
				if a.Mode.Requests != c.Requests {
					flags[i] = append(flags[i], fmt.Sprintf("%d requests, the cell's first arm sent %d", a.Mode.Requests, c.Requests))
				}
			}
		}
		digestFlags(c, flags, func(m report.Mode) string { return m.RequestsDigest })
		rows := make([]Row, len(c.Arms))
		oracle, oi := math.NaN(), -1
		for i, a := range c.Arms {
			c.Arms[i].Flags = flags[i]
			rows[i] = Row{Policy: a.Policy, Mode: a.Mode, Flags: flags[i], Ratio: math.NaN(), Failed: armFailed(&c.Arms[i])}
			if lo, hi, ok := spread(&c.Arms[i], func(m *report.Mode) float64 { return m.TTFT.P95 }); ok {
				rows[i].P95 = [2]float64{lo, hi}
			}
			if lo, hi, ok := spread(&c.Arms[i], func(m *report.Mode) float64 { return m.TTFT.P99 }); ok {
				rows[i].P99 = [2]float64{lo, hi}
			}
			c.Arms[i].P95Oracle = nil
			if a.Policy == OraclePolicy && rows[i].Valid() && a.Mode.TTFT.P95 > 0 {
				oracle, oi = a.Mode.TTFT.P95, i
			}
		}
		pi := slices.IndexFunc(rows, func(r Row) bool { return r.Policy == PrefixPolicy && r.Valid() })
		for i := range rows {
			c.Arms[i].PrefixOver = nil
			if !rows[i].Valid() {
				continue
			}
			if oi >= 0 {
				if ri := pairedP95Ratio(&c.Arms[i], &c.Arms[oi]); ri != nil {
					rows[i].Ratio, rows[i].Interval, c.Arms[i].P95Oracle = ri.Ratio, ri, ri
				}
			}
			if pi >= 0 && i != pi {
				rows[i].PrefixOver = pairedP95Ratio(&c.Arms[pi], &c.Arms[i])
				c.Arms[i].PrefixOver = rows[i].PrefixOver
			}
		}
		b.Rows = append(b.Rows, rows)
		c.ExactCache = exactCache(rows, c.Arms)
		losses, judged := prefixLosses(c.Name(), rows)
		b.Losses = append(b.Losses, losses...)
		b.Routers = append(b.Routers, routerChecks(c.Name(), rows, c.Arms)...)
		// Overload cells are judged by issue 56's targets (flowChecks), not issue 15's:
		// their tenants are refused by design and the oracle places without holding.
		if c.Workload != OverloadWorkload {
			if t, ok := targetChecks(c.Name(), rows, c.Arms); ok {
				b.Targets = append(b.Targets, t)
			} else if slices.ContainsFunc(rows, func(r Row) bool { return r.Policy == PrefixPolicy && r.Mode != nil }) {
				b.PrefixFlagged = append(b.PrefixFlagged, c.Name())
			}
		}
		switch {
		case !judged:
			b.Unjudged = append(b.Unjudged, c.Name())
		case math.IsNaN(oracle) && slices.ContainsFunc(rows, func(r Row) bool { return r.Policy == OraclePolicy }):
			b.PeersOnly = append(b.PeersOnly, c.Name())
		}
	}
	flowChecks(b)
	return b
}

// digestFlags flags the arms of a cell whose requests digest differs from the cell's most
// common one (every arm must have sent byte-identical requests in the same order), and notes
// the cell when no arm reports a digest.
// digest is the arm's requests digest ("" when not reported).
// armFlags are the arm's validity flags: the bench's (bench.Compare sets report.Mode.Flags
// for errors and for replicas that reported no cache hit on a workload with reuse), else the
// same checks on the report's own fields (a report made elsewhere: every suite workload reuses
// prefixes, so no cached token at all means caching was not measured), and missing usage.
// failed is the arm's failed requests (armFailed).
func armFlags(m report.Mode, failed int) []string {
	f := append([]string(nil), m.Flags...)
	if len(f) == 0 {
		if failed > 0 {
			f = append(f, fmt.Sprintf("%d errors", failed))
		}
		if m.PromptTokens > 0 && m.CachedTokens == 0 {
			f = append(f, "no cache hits")
		}
	}
	if m.UsageMissing > 0 {
		f = append(f, fmt.Sprintf("usage missing on %d", m.UsageMissing))
	}
	return f
}

func digestFlags(c *CellResult, flags [][]string, digest func(report.Mode) string) {
	count := map[string]int{}
	ref := ""
	for _, a := range c.Arms {
		if a.Mode == nil {
			continue
		}
		if d := digest(*a.Mode); d != "" {
			count[d]++
			if ref == "" || count[d] > count[ref] {
				ref = d
			}
		}
	}
	if ref == "" {
		c.Notes = append(c.Notes, "requests digest not reported: identical requests across arms not checked")
		return
	}
	for i, a := range c.Arms {
		if a.Mode == nil {
			continue
		}
		switch d := digest(*a.Mode); {
		case d == "":
			flags[i] = append(flags[i], "no requests digest")
		case d != ref:
			flags[i] = append(flags[i], fmt.Sprintf("requests differ (digest %s, the cell's %s)", short(d), short(ref)))
		}
	}
	if len(count) > 1 {
		c.Notes = append(c.Notes, fmt.Sprintf("arms sent different requests (%d digests)", len(count)))
	}
}

// validRow is the cell's valid row of policy (nil: none; a cell has one arm per policy).
func validRow(rows []Row, policy string) *Row {
	for i := range rows {
		if rows[i].Policy == policy && rows[i].Valid() {
			return &rows[i]
		}
	}
	return nil
}

// prefixLosses compares the cell's valid prefix arm with its valid oracle and peer arms.
// judged is false when there is no valid prefix arm or nothing valid to compare it with.
func prefixLosses(cell string, rows []Row) (losses []Loss, judged bool) {
	prefix := validRow(rows, PrefixPolicy)
	if prefix == nil {
		return nil, false
	}
	for _, r := range rows {
		if !r.Valid() || (r.Policy != OraclePolicy && !slices.Contains(Peers, r.Policy)) {
			continue
		}
		judged = true
		if prefix.Mode.TTFT.P95 > (1+LossMargin)*r.Mode.TTFT.P95 {
			losses = append(losses, Loss{Cell: cell, Against: r.Policy, PrefixP95: prefix.Mode.TTFT.P95, OtherP95: r.Mode.TTFT.P95})
		}
	}
	return losses, judged
}

// Render is the scoreboard: the skipped workloads, one table per cell, the p95 ÷ oracle
// matrix, the validity summary and where prefix loses.
func Render(b *Board) string {
	r := b.Result
	var sb strings.Builder
	kind := "full"
	if r.Quick {
		kind = "quick"
	}
	arms := 0
	for _, c := range r.Cells {
		arms += len(c.Arms)
	}
	fmt.Fprintf(&sb, "\n# prefixlb bench suite (%s, seed %d): %d cells × %d policies = %d arms in %s\n",
		kind, r.Seed, len(r.Cells), len(r.Policies), arms, time.Duration(r.WallS*float64(time.Second)).Round(time.Second))
	sb.WriteString(partsBlock(r))
	if r.Interrupted != "" {
		fmt.Fprintf(&sb, "\n%s\n", r.Interrupted)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(&sb, "\nskipped: %s (%s)\n", s.Workload, s.Reason)
	}
	for ci, c := range r.Cells {
		fmt.Fprintf(&sb, "\n## %s (%s), %d requests per arm\n\n", c.Name(), c.Load, c.Requests)
		if c.Replicas > 0 {
			fmt.Fprintf(&sb, "%d simulated replicas at %g× model time; latencies are wall-clock ms (× %g for model time).\n\n", c.Replicas, c.Speedup, c.Speedup)
		}
		if c.Rounds > 1 {
			fmt.Fprintf(&sb, "%d interleaved rounds per arm: each figure is its median over the rounds, TTFT p95 and p99 followed by the lowest and highest round's in parentheses; p95 ÷ oracle is the geometric mean of the rounds' ratios (round i's p95 ÷ the oracle's round i) with its %.0f%% t-interval in brackets, and prefix ÷ this is prefix's p95 ÷ this arm's in the same way.\n\n", c.Rounds, IntervalLevel*100)
		}
		sb.WriteString("| policy | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | E2E p95 ms | cached-token ratio | max share / mean | p95 ÷ oracle | prefix p95 ÷ this | validity |\n")
		sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, row := range b.Rows[ci] {
			sb.WriteString(tableRow(row))
		}
		if line := report.OracleLine(c.CacheOracle); line != "" {
			fmt.Fprintf(&sb, "\n%s\n", line)
		}
		sb.WriteString(tenantBlock(c))
	}
	sb.WriteString(ratioMatrix(b))
	sb.WriteString(validity(b))
	sb.WriteString(lossBlock(b))
	sb.WriteString(targetsBlock(b))
	sb.WriteString(exactCacheBlock(b))
	sb.WriteString(flowTargetsBlock(b))
	sb.WriteString(moonshotBlock(b))
	return sb.String()
}

func tableRow(row Row) string {
	valid := "ok"
	m := row.Mode
	switch {
	case m == nil:
		valid = "FLAGGED: not run (see Validity)"
	case !row.Valid():
		valid = "FLAGGED: " + strings.Join(flagsOrErrors(row), "; ")
	}
	if m == nil || m.Requests == m.Errors {
		return fmt.Sprintf("| %s | - | - | - | - | - | - | - | - | %s |\n", row.Policy, valid)
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %.3f | %.2f | %s | %s | %s |\n", row.Policy,
		fms(m.TTFT.P50), withSpread(m.TTFT.P95, row.P95), withSpread(m.TTFT.P99, row.P99), fms(m.E2E.P95), m.CachedTokenRatio,
		m.MaxShareOverMean, ratioCI(row), intervalCI(row.PrefixOver), valid)
}

// ratioCI is the row's p95 ÷ oracle, with its interval in brackets when it has one.
func ratioCI(row Row) string {
	if math.IsNaN(row.Ratio) || !row.Interval.HasInterval() {
		return ratio(row.Ratio)
	}
	return fmt.Sprintf("%.2f [%.2f–%.2f]", row.Ratio, row.Interval.Lo, row.Interval.Hi)
}

// intervalCI is a ratio with its interval in brackets when it has one ("-" for nil).
func intervalCI(ri *RatioInterval) string {
	switch {
	case ri == nil:
		return "-"
	case !ri.HasInterval():
		return fmt.Sprintf("%.2f", ri.Ratio)
	}
	return fmt.Sprintf("%.2f [%.2f–%.2f]", ri.Ratio, ri.Lo, ri.Hi)
}

// withSpread is v in ms, with the rounds' lowest–highest after it when there were several.
func withSpread(v float64, lohi [2]float64) string {
	if lohi == [2]float64{} {
		return fms(v)
	}
	return fmt.Sprintf("%s (%s–%s)", fms(v), fms(lohi[0]), fms(lohi[1]))
}

// flagsOrErrors is the row's flags, or its error count when the bench set no flag for it.
func flagsOrErrors(row Row) []string {
	if len(row.Flags) > 0 {
		return row.Flags
	}
	if row.Failed > 0 {
		return []string{fmt.Sprintf("%d errors", row.Failed)}
	}
	return []string{"no requests"}
}

// ratioMatrix is p95 ÷ oracle with cells as rows and policies as columns.
func ratioMatrix(b *Board) string {
	title := fmt.Sprintf("TTFT p95 ÷ oracle's (flagged arms: -; over several rounds the geometric mean of the rounds' ratios [%.0f%% t-interval])", IntervalLevel*100)
	return matrix(b, title, b.Result.Policies, ratioCI) + prefixMatrix(b)
}

// prefixMatrix is prefix's p95 ÷ each other arm's (oracle aside: the first matrix has it),
// cells as rows; empty when the suite ran no prefix arm or nothing else.
func prefixMatrix(b *Board) string {
	var pol []string
	for _, p := range b.Result.Policies {
		if p != PrefixPolicy && p != OraclePolicy {
			pol = append(pol, p)
		}
	}
	if len(pol) == 0 || !slices.Contains(b.Result.Policies, PrefixPolicy) {
		return ""
	}
	title := fmt.Sprintf("Prefix's TTFT p95 ÷ each arm's (below 1: prefix is faster; flagged arms: -; over several rounds the geometric mean of the rounds' ratios [%.0f%% t-interval])", IntervalLevel*100)
	return matrix(b, title, pol, func(r Row) string { return intervalCI(r.PrefixOver) })
}

// matrix is a section titled title with a row per cell and a column per policy of pol, each
// entry fig of that policy's row ("-" when the cell has none).
func matrix(b *Board, title string, pol []string, fig func(Row) string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n## %s\n\n| cell | rounds | %s |\n|---|---:|%s\n", title, strings.Join(pol, " | "), strings.Repeat("---:|", len(pol)))
	for ci, c := range b.Result.Cells {
		cols := make([]string, len(pol))
		for j, p := range pol {
			cols[j] = "-"
			for _, row := range b.Rows[ci] {
				if row.Policy == p {
					cols[j] = fig(row)
				}
			}
		}
		fmt.Fprintf(&sb, "| %s | %d | %s |\n", c.Name(), max(c.Rounds, 1), strings.Join(cols, " | "))
	}
	return sb.String()
}

func validity(b *Board) string {
	var sb strings.Builder
	var flagged []string
	arms := 0
	for ci, c := range b.Result.Cells {
		for _, row := range b.Rows[ci] {
			arms++
			if !row.Valid() {
				flagged = append(flagged, fmt.Sprintf("  - %s · %s: %s", c.Name(), row.Policy, strings.Join(flagsOrErrors(row), "; ")))
			}
		}
	}
	fmt.Fprintf(&sb, "\n## Validity\n\n- %d arms: %d valid, %d flagged (shown, not in any ratio)", arms, arms-len(flagged), len(flagged))
	if len(flagged) > 0 {
		sb.WriteString(":\n" + strings.Join(flagged, "\n"))
	}
	sb.WriteString("\n")
	notes := map[string][]string{}
	var order []string
	for _, c := range b.Result.Cells {
		for _, n := range c.Notes {
			if notes[n] == nil {
				order = append(order, n)
			}
			notes[n] = append(notes[n], c.Name())
		}
	}
	for _, n := range order {
		cells := "all cells"
		if len(notes[n]) < len(b.Result.Cells) {
			cells = strings.Join(notes[n], ", ")
		}
		fmt.Fprintf(&sb, "- %s: %s\n", cells, n)
	}
	if len(order) == 0 {
		sb.WriteString("- requests: byte-identical, in the same order, in every arm of every cell (digests agree)\n")
	}
	return sb.String()
}

func lossBlock(b *Board) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n## Where prefix loses (its TTFT p95 more than %.0f%% above the oracle's or a peer's)\n\n", LossMargin*100)
	if len(b.Losses) == 0 {
		sb.WriteString("- nowhere among the judged cells\n")
	}
	byCell := map[string][]string{}
	var order []string
	for _, l := range b.Losses {
		if byCell[l.Cell] == nil {
			order = append(order, l.Cell)
		}
		byCell[l.Cell] = append(byCell[l.Cell], fmt.Sprintf("%s %s ms (%.2f×)", l.Against, fms(l.OtherP95), l.PrefixP95/l.OtherP95))
	}
	for _, cell := range order {
		p := 0.0
		for _, l := range b.Losses {
			if l.Cell == cell {
				p = l.PrefixP95
			}
		}
		fmt.Fprintf(&sb, "- %s: prefix %s ms vs %s\n", cell, fms(p), strings.Join(byCell[cell], ", "))
	}
	if len(b.PeersOnly) > 0 {
		fmt.Fprintf(&sb, "- judged against the peers only (the oracle arm is flagged, see Validity): %s\n", strings.Join(b.PeersOnly, ", "))
	}
	if len(b.Unjudged) > 0 {
		fmt.Fprintf(&sb, "- not judged (no valid prefix arm, or no valid oracle or peer arm): %s\n", strings.Join(b.Unjudged, ", "))
	}
	sb.WriteString(routersBlock(b))
	return sb.String()
}

func ratio(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// fms formats milliseconds as report.Table does: no decimals from 100 ms up.
func fms(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func short(d string) string {
	if len(d) > 12 {
		return d[:12]
	}
	return d
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
