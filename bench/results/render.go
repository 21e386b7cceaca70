package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/bench/overhead"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/suite"
)

// header opens RESULTS.md: what it is and how a table is replaced.
const header = `# Results

The current result of each claim prefixlb makes, one table each, with the command that
measured it, the commit it ran on and the machine. How each is measured and how to reproduce
it: [docs/bench.md](../docs/bench.md).

This file is generated: ` + "`go run ./bench/results`" + ` writes it from the claim files in
[bench/results/](results/), and ` + "`go test ./bench/results`" + ` fails when the two differ. A re-run
replaces a table rather than adding one:

` + "```sh" + `
go run . bench compare --out bench-out          # or bench suite / bench overhead
go run ./bench/results import --claim multi-turn --commit "$(git rev-parse --short HEAD)" \
  --machine "…" --command "go run . bench compare" bench-out/report.json
` + "```" + `

What a run taught goes in its commit message, not here.
`

// render returns RESULTS.md for the claims, in their order.
func render(claims []*Claim) (string, error) {
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("\n| claim | commit |\n|---|---|\n")
	for _, c := range claims {
		fmt.Fprintf(&b, "| [%s](#%s) | %s |\n", c.Title, c.Name, c.Commit)
	}
	for _, c := range claims {
		kind, err := c.kind()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\n<a id=\"%s\"></a>\n\n## %s\n\n%s\n\n", c.Name, c.Title, c.Claim)
		fmt.Fprintf(&b, "- command: `%s`\n- commit: %s\n- machine: %s\n- source: %s\n\n", c.Command, c.Commit, c.Machine, c.Source)
		switch kind {
		case "compare":
			renderCompare(&b, c.Compare)
		case "suite":
			renderSuite(&b, c.Suite)
		case "replicas":
			renderReplicas(&b, c.Replicas)
		case "overhead":
			renderOverhead(&b, c.Overhead)
		}
		if len(c.Notes) > 0 {
			b.WriteString("\n")
			for _, n := range c.Notes {
				fmt.Fprintf(&b, "- %s\n", n)
			}
		}
	}
	return b.String(), nil
}

// ms formats a latency in milliseconds as the bench's tables do (whole ms from 100); a zero
// is a figure the run did not record ("–": a recorded latency is at least 1 µs).
func ms(v float64) string {
	switch {
	case v == 0:
		return "–"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// num formats v with format, or "–" for a zero (not recorded).
func num(v float64, format string) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf(format, v)
}

// renderCompare is bench compare's table (report.Table's columns), then how prefix's TTFT p95
// compares with every other mode's and, for a trace, the cache oracle.
func renderCompare(b *strings.Builder, r *CompareResult) {
	fmt.Fprintf(b, "Workload `%s`", r.Workload)
	if r.Replicas > 0 {
		fmt.Fprintf(b, ", %d replicas", r.Replicas)
	}
	if r.Speedup > 1 {
		fmt.Fprintf(b, ", `--speedup %g` (times are wall-clock, × %g for model time)", r.Speedup, r.Speedup)
	}
	b.WriteString(".\n\n")
	// Routing cost against prefill saved, where the run measured them (older claims did not).
	savings := false
	for _, m := range r.Modes {
		savings = savings || m.Savings != nil
	}
	b.WriteString("| mode | requests | errors | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | ITL p50 ms | E2E p95 ms | rps | out tok/s | cached-token ratio | max share / mean |")
	if savings {
		b.WriteString(" routing cost s | saved prefill s |")
	}
	b.WriteString("\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	if savings {
		b.WriteString("---:|---:|")
	}
	b.WriteString("\n")
	var prefix *report.Mode
	for i := range r.Modes {
		m := &r.Modes[i]
		if m.Mode == "prefix" {
			prefix = m
		}
		name := m.Mode
		if len(m.Flags) > 0 {
			name += " ! (" + strings.Join(m.Flags, "; ") + ")"
		}
		share := "–"
		if m.MaxShareOverMean > 0 {
			share = fmt.Sprintf("%.2f", m.MaxShareOverMean)
		}
		fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %.3f | %s |",
			name, m.Requests, m.Errors, ms(m.TTFT.P50), ms(m.TTFT.P95), ms(m.TTFT.P99), ms(m.ITL.P50),
			ms(m.E2E.P95), num(m.RPS, "%.2f"), num(m.OutputTPS, "%.0f"), m.CachedTokenRatio, share)
		switch {
		case !savings:
		case m.Savings == nil:
			b.WriteString(" – | – |")
		default:
			fmt.Fprintf(b, " %.3f | %.2f |", m.Savings.RoutingSeconds, m.Savings.SavedPrefillSeconds)
		}
		b.WriteString("\n")
	}
	if savings {
		b.WriteString("\nRouting cost s: the time prefixlb spent keying and picking (`prefixlb_routing_seconds_total`, about CPU-seconds, not sped up). " +
			"Saved prefill s: the prefill the replicas' reported KV-cache hits spared at their learned prefill rates (`prefixlb_prefill_saved_seconds_total`, an estimate, in sped-up seconds; hits any policy gets count too, so compare the modes).\n")
	}
	if t := report.TenantTable(r.Modes); t != "" { // the overload workload's tenants
		b.WriteString("\nPer tenant (TTFT and SLO in wall ms; work = uncached prompt + generated tokens):\n\n" + t)
	}
	if prefix != nil && prefix.TTFT.P95 > 0 {
		var vs []string
		for _, m := range r.Modes {
			if m.Mode == "prefix" || m.TTFT.P95 <= 0 || len(m.Flags) > 0 {
				continue
			}
			if x := m.TTFT.P95 / prefix.TTFT.P95; x >= 1 {
				vs = append(vs, fmt.Sprintf("%.1f× below %s's", x, m.Mode))
			} else {
				vs = append(vs, fmt.Sprintf("%.1f× above %s's", 1/x, m.Mode))
			}
		}
		if len(vs) > 0 {
			fmt.Fprintf(b, "\nPrefix routing's TTFT p95 is %s.\n", strings.Join(vs, ", "))
		}
	}
	if r.Oracle != nil {
		fmt.Fprintf(b, "\n%s\n", report.OracleLine(r.Oracle))
	}
}

// renderSuite is the suite's p95 ÷ oracle matrix, prefix's p95 ÷ each policy's (claims
// imported with intervals), the targets' tally and the parts a merged suite pooled.
func renderSuite(b *strings.Builder, s *SuiteScores) {
	ciNote := ""
	if s.Intervals {
		ciNote = fmt.Sprintf(" Over several rounds each ratio is the geometric mean of the rounds' ratios (round i against round i) with its %.0f%% t-interval in brackets.", suite.IntervalLevel*100)
	}
	if slices.ContainsFunc(s.Cells, func(c SuiteCell) bool {
		return slices.ContainsFunc(c.P95OverOracle, func(v *float64) bool { return v != nil })
	}) {
		fmt.Fprintf(b, "TTFT p95 ÷ the oracle's p95 in the same cell (1 = the oracle; below 1, the policy's affinity beat the oracle's greedy placement; – : the arm was flagged).%s\n\n", ciNote)
		suiteMatrix(b, s, s.Policies, func(c SuiteCell, i int) (*float64, *[2]float64) {
			return at(c.P95OverOracle, i), at(c.P95OverOracleCI, i)
		})
	} else if s.Intervals {
		fmt.Fprintf(b, "No oracle arm ran.%s\n", ciNote)
	}
	if s.Intervals && slices.Contains(s.Policies, suite.PrefixPolicy) {
		var others []string
		for _, p := range s.Policies {
			if p != suite.PrefixPolicy && p != suite.OraclePolicy {
				others = append(others, p)
			}
		}
		b.WriteString("\nThe prefix arm's TTFT p95 ÷ each policy's in the same cell (below 1: prefix is faster; – : either arm was flagged).\n\n")
		suiteMatrix(b, s, others, func(c SuiteCell, i int) (*float64, *[2]float64) {
			j := slices.Index(s.Policies, others[i])
			return at(c.PrefixOver, j), at(c.PrefixOverCI, j)
		})
	}
	targets := fmt.Sprintf("p95 ≤ %.2f× the oracle's and ≤ every peer's, p99 ≤ round-robin's, cached tokens ≥ %.0f%% of the oracle's, max share ≤ %.1f or the oracle's",
		suite.TargetP95Oracle, suite.TargetCachedOracle*100, suite.TargetMaxShare)
	switch {
	case s.TargetsJudged == 0:
	case s.Intervals:
		fmt.Fprintf(b, "\nThe prefix arm against the predicted-TTFT targets (%s), each judged on its ratio's %.0f%% interval: a target is met when the whole interval is within the bound (for ≤, the upper end ≤ the bound), not met when the whole interval is beyond it, not shown when the interval holds the bound or there is no interval (one round). Every target met in %d of %d cells; not met in %d; not shown in %d.\n",
			targets, suite.IntervalLevel*100, s.TargetsMet, s.TargetsJudged, s.TargetsNotMet, s.TargetsNotShown)
	default:
		fmt.Fprintf(b, "\nOn the central estimates (this run predates the intervals, so no target is shown by it), the prefix arm meets every predicted-TTFT target (%s) in %d of %d cells.\n",
			targets, s.TargetsMet, s.TargetsJudged)
	}
	for _, t := range s.Tenants {
		fmt.Fprintf(b, "\nPer tenant, %s (medians over %d round(s); TTFT wall ms over the completed requests; in-SLO share of the requests sent; work share of all tenants' GPU work; refused and expired are explicit outcomes):\n\n%s", t.Cell, t.Rounds, suite.TenantTable(t.Rows))
	}
	if len(s.FlowTargets) > 0 {
		fmt.Fprintf(b, "\n%s\n\n%s\n%s on these targets together: %s.\n", suite.FlowTargetsCaption(), suite.FlowTargetsTable(s.FlowTargets), suite.FlowPolicy, s.FlowVerdict)
	}
	if len(s.Parts) > 0 {
		fmt.Fprintf(b, "\nMerged from %d parts (`bench suite merge`; a cell that several parts ran pools their rounds):\n\n", len(s.Parts))
		for i, p := range s.Parts {
			fmt.Fprintf(b, "%d. %s · commit %s · %s · started %s, %s\n", i+1, strings.Join(p.Cells, ", "), or(p.Commit, "unknown"),
				or(p.Machine, "machine unknown"), p.Started.Format(time.RFC3339), time.Duration(p.WallS*float64(time.Second)).Round(time.Second))
		}
	}
}

// suiteMatrix is one table of cells × columns, each figure with its interval when it has one,
// and the cells' rounds where they were kept.
func suiteMatrix(b *strings.Builder, s *SuiteScores, cols []string, fig func(SuiteCell, int) (*float64, *[2]float64)) {
	rounds := slices.ContainsFunc(s.Cells, func(c SuiteCell) bool { return c.Rounds > 0 })
	targets := slices.ContainsFunc(s.Cells, func(c SuiteCell) bool { return c.Targets != "" })
	b.WriteString("| cell |")
	if rounds {
		b.WriteString(" rounds |")
	}
	for _, p := range cols {
		fmt.Fprintf(b, " %s |", p)
	}
	if targets {
		b.WriteString(" prefix's targets |")
	}
	b.WriteString("\n|---|")
	if rounds {
		b.WriteString("---:|")
	}
	b.WriteString(strings.Repeat("---:|", len(cols)))
	if targets {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, c := range s.Cells {
		fmt.Fprintf(b, "| %s |", c.Cell)
		if rounds {
			fmt.Fprintf(b, " %d |", c.Rounds)
		}
		for i := range cols {
			v := "–"
			if x, ci := fig(c, i); x != nil && ci != nil {
				v = fmt.Sprintf("%.2f [%.2f–%.2f]", *x, ci[0], ci[1])
			} else if x != nil {
				v = fmt.Sprintf("%.2f", *x)
			}
			fmt.Fprintf(b, " %s |", v)
		}
		if targets {
			fmt.Fprintf(b, " %s |", or(c.Targets, "–"))
		}
		b.WriteString("\n")
	}
}

// at is xs[i], nil past its end.
func at[T any](xs []*T, i int) *T {
	if i < len(xs) {
		return xs[i]
	}
	return nil
}

// renderReplicas is several replicas against one per cell, with the suite's target.
func renderReplicas(b *strings.Builder, s *ReplicaScores) {
	fmt.Fprintf(b, "`%s` against one replica (`prefix`) in each cell; target: cached tokens ≥ %.2f× and TTFT p95 ≤ %.2f× one replica's. With several rounds the p95 ratio is the median of the per-round ratios and the cached ratio that of the rounds' tokens summed.\n\n",
		s.Policy, suite.RoutersCachedTarget, suite.RoutersP95Target)
	b.WriteString("| cell | cached ÷ one | p95 ÷ one | per-round p95 ÷ | meets |\n|---|---:|---:|---|---|\n")
	met := 0
	for _, c := range s.Cells {
		rc := suite.RouterCheck{Cached: c.Cached, P95: c.P95}
		verdict := "**no**"
		if rc.Meets() {
			verdict = "yes"
			met++
		}
		rounds := "–"
		if len(c.Rounds) > 0 {
			rs := make([]string, len(c.Rounds))
			for i, r := range c.Rounds {
				rs[i] = fmt.Sprintf("%.2f", r)
			}
			rounds = strings.Join(rs, " / ")
		}
		fmt.Fprintf(b, "| %s | %.3f | %.2f | %s | %s |\n", c.Cell, c.Cached, c.P95, rounds, verdict)
	}
	fmt.Fprintf(b, "\n%d of %d cells meet the target.\n", met, len(s.Cells))
}

// overheadTargets names the harness's targets as the table shows them.
var overheadTargets = map[string]string{
	overhead.TargetDirect:       "direct",
	overhead.TargetHAProxyTCP:   "HAProxy mode tcp",
	overhead.TargetHAProxy:      "HAProxy",
	overhead.TargetPrefixlbRR:   "prefixlb round-robin",
	overhead.TargetPrefixlbPfx:  "prefixlb prefix",
	overhead.TargetPrefixlbPeer: "prefixlb prefix, peered",
}

// bodyName is a body size, and its shape when it is not chat.
func bodyName(size int, shape string) string {
	var s string
	switch {
	case size%(1<<20) == 0:
		s = fmt.Sprintf("%d MB", size>>20)
	case size%(1<<10) == 0:
		s = fmt.Sprintf("%d KB", size>>10)
	default:
		s = fmt.Sprintf("%d B", size)
	}
	if shape == overhead.ShapeAgent {
		s += " agent"
	}
	return s
}

func ptr(p *float64, format string) string {
	if p == nil {
		return "–"
	}
	return fmt.Sprintf(format, *p)
}

// renderOverhead is the targets × body sizes table, the routing decision and the index's
// memory.
func renderOverhead(b *strings.Builder, o *OverheadResult) {
	b.WriteString("Saturated rate (closed loop), p50 at an open-loop rate, CPU per 1,000 requests at saturation, peak RSS; \"added\" is over direct.\n\n")
	b.WriteString("| body | target | req/s at saturation | × HAProxy | p50 µs | added p50 µs | CPU s / 1k req | peak RSS MiB |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range o.Rows {
		name := overheadTargets[r.Target]
		if name == "" {
			name = r.Target
		}
		rss := "–"
		if r.PeakRSSBytes > 0 {
			rss = fmt.Sprintf("%.1f", float64(r.PeakRSSBytes)/(1<<20))
		}
		fmt.Fprintf(b, "| %s | %s | %.0f | %s | %s | %s | %s | %s |\n", bodyName(r.BodyBytes, r.Shape), name, r.RPS,
			ptr(r.RPSvsHAProxy, "%.2f"), num(r.P50us, "%.0f"), ptr(r.AddedP50us, "%+.0f"), ptr(r.SatCPUPer1k, "%.3f"), rss)
	}
	if len(o.Routing) > 0 {
		b.WriteString("\nThe routing decision of mode prefix (parse, key, pick, learn), µs, in the harness after the load rounds, the index at capacity:\n\n")
		b.WriteString("| body | p50 | p99 | pick p50 | learn p50 |\n|---|---:|---:|---:|---:|\n")
		for _, r := range o.Routing {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", bodyName(r.BodyBytes, r.Shape),
				num(r.P50us, "%.1f"), num(r.P99us, "%.0f"), num(r.PickP50us, "%.1f"), num(r.LearnP50us, "%.1f"))
		}
	}
	if x := o.Index; x != nil && x.Entries > 0 {
		fmt.Fprintf(b, "\nA prefix index of %d entries (%d chunks) takes %.1f heap bytes per entry.\n", x.Entries, x.Chunks, x.BytesPerEntry)
	}
}

// or is s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
