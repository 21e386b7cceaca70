// The scoreboard's blocks for issue 56: an overload cell's tenants, the flow-control targets
// and the moonshot.

package suite

import (
	"fmt"
	"strings"
)

// tenantBlock is an overload cell's per-tenant table (medians over the rounds) with each
// arm's output tokens/s and Jain index under it; "" for a cell without tenants.
func tenantBlock(c CellResult) string {
	if len(c.Tenants) == 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nPer tenant (medians over %d round(s); TTFT wall ms over the completed requests; in-SLO share of the requests sent; work share of all tenants' GPU work). Refused and expired requests are explicit outcomes, not failures: the table above counts TTFT over completed requests only.\n\n", max(c.Rounds, 1))
	sb.WriteString(TenantTable(c.Tenants))
	return sb.String()
}

// TenantTable is an overload cell's per-tenant rows as a Markdown table, each arm's output
// tokens/s and Jain index in a list under it; "" without rows.
func TenantTable(tenants []TenantMedian) string {
	if len(tenants) == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("| policy | tenant | prio | sent | done | refused | expired | failed | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | in-SLO share | work share |\n")
	sb.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var notes []string
	seen := map[string]bool{}
	for _, t := range tenants {
		p50, p95, p99 := "-", "-", "-"
		if t.TTFT != nil {
			p50, p95, p99 = fms(t.TTFT.P50), fms(t.TTFT.P95), fms(t.TTFT.P99)
		}
		fmt.Fprintf(&sb, "| %s | %s | %d | %g | %g | %g | %g | %g | %s | %s | %s | %.3f | %.3f |\n", t.Policy, t.Tenant, t.Priority,
			t.Sent, t.Done, t.Refused, t.Expired, t.Failed, p50, p95, p99, t.InSLOShare, t.WorkShare)
		if !seen[t.Policy] {
			seen[t.Policy] = true
			notes = append(notes, fmt.Sprintf("- %s: output %.0f tok/s over all tenants%s", t.Policy, t.OutputTPS, jainText(tenants, t.Policy)))
		}
	}
	sb.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	return sb.String()
}

// jainText is "; Jain 0.93 among priority 1 (chat, noisy)" for each priority group of an
// arm's tenants with a Jain index.
func jainText(rows []TenantMedian, policy string) string {
	groups := map[int][]string{}
	var order []int
	jain := map[int]*float64{}
	for _, t := range rows {
		if t.Policy != policy {
			continue
		}
		if groups[t.Priority] == nil {
			order = append(order, t.Priority)
		}
		groups[t.Priority] = append(groups[t.Priority], t.Tenant)
		if t.Jain != nil {
			jain[t.Priority] = t.Jain
		}
	}
	var out string
	for _, p := range order {
		if len(groups[p]) < 2 {
			continue
		}
		j := "- (no work seen while all were backlogged)"
		if jain[p] != nil {
			j = fmt.Sprintf("%.3f", *jain[p])
		}
		out += fmt.Sprintf("; Jain %s among priority %d (%s) while all were backlogged", j, p, strings.Join(groups[p], ", "))
	}
	return out
}

// FlowTargetsCaption states the flow-control targets and how they are judged.
func FlowTargetsCaption() string {
	return fmt.Sprintf("Issue 56's targets for %s (prefix mode with flow control) against %s (the same routing, every request forwarded at once). "+
		"light: p95 ÷ %s's, overall and per tenant, indistinguishable (the interval holds 1 and its upper end ≤ %.2f; not met when the whole interval is on one side of 1). "+
		"overload: the chat tenant's p95 ÷ its p95 in the light cell of the same round ≤ %.0f (%s's multiple stated beside it); chat's in-SLO share ≥ %.2f; output tok/s over all tenants ÷ %s's ≥ %.2f; no failed request (every request done, refused or expired). "+
		"fair: the light tenant's p95 with heavy at 10× its rate ÷ its p95 alone (the fair-alone cell, same round) ≤ %.1f, each arm. fair-shares: Jain over the GPU-work shares while both were backlogged ≥ %.2f, each arm. "+
		"Ratios are geometric means of the rounds' ratios; shares and Jain arithmetic means of the rounds' values; each with its %.0f%% t-interval, judged as the other targets: met only when the whole interval is within the bound. - : an arm missing or flagged.",
		FlowPolicy, PrefixPolicy, PrefixPolicy, TargetLightP95, TargetChatMultiple, PrefixPolicy, TargetChatInSLO, PrefixPolicy, TargetOutputTPS, TargetFairP95, TargetJain, IntervalLevel*100)
}

// FlowTargetRow is one row of the flow-control targets' table: a target of an overload cell,
// its figure (a ratio or share with its interval) and its verdict ("-" for a figure stated
// beside a target, not judged). Flow is true for the targets of prefix+fc, which its overall
// verdict (FlowVerdict) takes together.
type FlowTargetRow struct {
	Cell    string `json:"cell"`
	Target  string `json:"target"`
	Figure  string `json:"figure"`
	Verdict string `json:"verdict"`
	Flow    bool   `json:"flow,omitempty"`
}

// FlowTargets are the rows of issue 56's targets, one per target of each overload cell, and
// prefix+fc's verdict on them together (All); no rows without overload cells.
func FlowTargets(b *Board) (rows []FlowTargetRow, overall Verdict) {
	var fcVerdicts []Verdict
	row := func(cell, target, figure string, v Verdict, fc bool) {
		rows = append(rows, FlowTargetRow{Cell: cell, Target: target, Figure: figure, Verdict: v.String(), Flow: fc})
		if fc {
			fcVerdicts = append(fcVerdicts, v)
		}
	}
	for _, c := range b.Result.Cells {
		f := c.FlowControl
		if f == nil {
			continue
		}
		name := c.Name()
		switch f.Level {
		case "light":
			row(name, fmt.Sprintf("%s p95 ÷ %s's, all tenants", FlowPolicy, PrefixPolicy), intervalText(f.LightP95), Indistinguishable(f.LightP95, TargetLightP95), true)
			for _, t := range f.LightTenantP95 {
				row(name, fmt.Sprintf("%s p95 ÷ %s's, %s", FlowPolicy, PrefixPolicy, t.Tenant), intervalText(t.Ratio), Indistinguishable(t.Ratio, TargetLightP95), true)
			}
		case OverloadLevel:
			row(name, fmt.Sprintf("%s chat p95 ÷ its light-cell chat p95 ≤ %.0f", FlowPolicy, TargetChatMultiple), intervalText(f.ChatMultiple), AtMost(f.ChatMultiple, TargetChatMultiple), true)
			rows = append(rows, FlowTargetRow{Cell: name, Target: fmt.Sprintf("%s chat p95 ÷ its light-cell chat p95 (no flow control, stated)", PrefixPolicy), Figure: intervalText(f.ChatMultiplePrefix), Verdict: "-"})
			row(name, fmt.Sprintf("%s chat in-SLO share ≥ %.2f", FlowPolicy, TargetChatInSLO), intervalText(f.ChatInSLO), AtLeast(f.ChatInSLO, TargetChatInSLO), true)
			row(name, fmt.Sprintf("output tok/s, %s ÷ %s ≥ %.2f", FlowPolicy, PrefixPolicy, TargetOutputTPS), intervalText(f.OutputTPS), AtLeast(f.OutputTPS, TargetOutputTPS), true)
			failed := "-"
			if f.Failed != nil {
				failed = fmt.Sprintf("%d (most in a round)", *f.Failed)
			}
			row(name, fmt.Sprintf("%s failed requests = 0", FlowPolicy), failed, noneFailed(f.Failed), true)
		case FairLevel:
			if len(f.FairP95) == 0 {
				row(name, fmt.Sprintf("light p95 ÷ its p95 alone ≤ %.1f", TargetFairP95), "-", Unjudged, true)
			}
			for _, p := range f.FairP95 {
				row(name, fmt.Sprintf("%s light p95 ÷ its p95 alone ≤ %.1f", p.Policy, TargetFairP95), intervalText(p.Ratio), AtMost(p.Ratio, TargetFairP95), p.Policy == FlowPolicy)
			}
		case FairSharesLevel:
			if len(f.Jain) == 0 {
				row(name, fmt.Sprintf("Jain ≥ %.2f", TargetJain), "-", Unjudged, true)
			}
			for _, p := range f.Jain {
				row(name, fmt.Sprintf("%s Jain ≥ %.2f", p.Policy, TargetJain), intervalText(p.Ratio), AtLeast(p.Ratio, TargetJain), p.Policy == FlowPolicy)
			}
		}
	}
	return rows, All(fcVerdicts...)
}

// FlowTargetsTable is rows as a Markdown table (with its header line).
func FlowTargetsTable(rows []FlowTargetRow) string {
	var sb strings.Builder
	sb.WriteString("| cell | target | figure | verdict |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", r.Cell, r.Target, r.Figure, r.Verdict)
	}
	return sb.String()
}

// flowTargetsBlock is the scoreboard's section of issue 56's targets (FlowTargets) with
// prefix+fc's verdict on them together; "" without overload cells.
func flowTargetsBlock(b *Board) string {
	rows, overall := FlowTargets(b)
	if len(rows) == 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n## Flow control against issue 56's targets\n\n%s\n\n%s", FlowTargetsCaption(), FlowTargetsTable(rows))
	fmt.Fprintf(&sb, "\n%s on these targets together: %s\n", FlowPolicy, overall)
	return sb.String()
}

// moonshotBlock is the moonshot's table for the cells of other workloads where prefix+fc ran;
// "" when none did.
func moonshotBlock(b *Board) string {
	var sb strings.Builder
	for _, c := range b.Result.Cells {
		m := c.Moonshot
		if m == nil {
			continue
		}
		if sb.Len() == 0 {
			fmt.Fprintf(&sb, "\n## The flow-control moonshot (issue 56: on near-saturation cells, %s's p95 ≤ the greedy oracle's with nothing shed, p99 no worse than %s's)\n\n", FlowPolicy, PrefixPolicy)
			fmt.Fprintf(&sb, "Each ratio %s's round i ÷ the other arm's round i with its %.0f%% t-interval, met only when the whole interval is within the bound; shed: the most requests one round refused or saw expire.\n\n", FlowPolicy, IntervalLevel*100)
			sb.WriteString("| cell | p95 ÷ oracle ≤ 1 | p99 ÷ prefix ≤ 1 | nothing shed | all |\n|---|---|---|---|---|\n")
		}
		v := m.Verdicts()
		fmt.Fprintf(&sb, "| %s | %s | %s | %s: %d | %s |\n", c.Name(), judged(v[0], m.P95Oracle), judged(v[1], m.P99Prefix), v[2], m.Shed, All(v[:]...))
	}
	return sb.String()
}
