// Merge: the union of suite runs (parts) re-scored as one suite.

package suite

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// ReadJSON reads a suite.json that WriteJSON wrote.
func ReadJSON(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &Result{}
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(r.Cells) == 0 {
		return nil, fmt.Errorf("%s: no cells: not a bench suite suite.json", path)
	}
	return r, nil
}

// Merge is the union of the parts' cells as one result, to be scored by Analyze. sources name
// the parts (their suite.json paths) in errors and in Parts; a part that is itself a merge
// contributes its own Parts. A cell that several parts ran has its rounds pooled, each arm's
// rounds one part after another and re-combined (Combine), so that round i of every arm is
// still one interleaved pass: the paired ratios stay paired.
//
// Rounds are pooled only when they measured the same thing; the error says what differs: the
// parts' seeds or --quick, a pooled cell's load, rate, requests, replicas, speed-up or
// workload parameters (KV cache, counts, data file), its set of arms, or its commit (the code
// under test; unknown commits are not compared). Parts of other cells may differ in commit and
// machine: Parts lists each. A part whose arms did not all run the cell's rounds (a suite.json
// edited by hand, or written before every arm kept its rounds) is refused too.
func Merge(parts []*Result, sources []string) (*Result, error) {
	if len(parts) == 0 {
		return nil, errors.New("merge: no parts")
	}
	if len(sources) != len(parts) {
		return nil, fmt.Errorf("merge: %d parts, %d sources", len(parts), len(sources))
	}
	out := &Result{Seed: parts[0].Seed, Quick: parts[0].Quick}
	type origin struct {
		source, commit string
	}
	from := map[string]origin{} // cell name → the first part that ran it
	index := map[string]int{}   // cell name → index in out.Cells
	var interrupted []string
	for pi, r := range parts {
		src := sources[pi]
		if r.Seed != out.Seed {
			return nil, fmt.Errorf("merge: %s ran with --seed %d, %s with %d: every part must use the same seed", src, r.Seed, sources[0], out.Seed)
		}
		if r.Quick != out.Quick {
			return nil, fmt.Errorf("merge: %s is a --quick run and %s is not (or the other way round): their cells differ in size", src, sources[0])
		}
		if len(r.Parts) > 0 {
			out.Parts = append(out.Parts, r.Parts...)
		} else {
			out.Parts = append(out.Parts, partOf(r, src))
		}
		if r.Interrupted != "" {
			interrupted = append(interrupted, src+": "+r.Interrupted)
		}
		for _, p := range r.Policies {
			if !slices.Contains(out.Policies, p) {
				out.Policies = append(out.Policies, p)
			}
		}
		for _, s := range r.Skipped {
			if !slices.ContainsFunc(out.Skipped, func(x Skip) bool { return x.Workload == s.Workload }) {
				out.Skipped = append(out.Skipped, s)
			}
		}
		for _, c := range r.Cells {
			if err := checkRounds(c); err != nil {
				return nil, fmt.Errorf("merge: %s: %w", src, err)
			}
			name := c.Name()
			i, seen := index[name]
			if !seen {
				index[name] = len(out.Cells)
				from[name] = origin{src, r.Commit}
				c.Arms = slices.Clone(c.Arms)
				out.Cells = append(out.Cells, c)
				continue
			}
			if err := samePool(&out.Cells[i], &c, from[name].commit, r.Commit); err != nil {
				return nil, fmt.Errorf("merge: cell %s: %s and %s cannot be pooled: %w", name, from[name].source, src, err)
			}
			pool(&out.Cells[i], &c)
		}
	}
	slices.SortStableFunc(out.Cells, func(a, b CellResult) int {
		return cellOrder(a) - cellOrder(b)
	})
	slices.SortStableFunc(out.Policies, func(a, b string) int { return policyOrder(a) - policyOrder(b) })
	out.Skipped = slices.DeleteFunc(out.Skipped, func(s Skip) bool {
		return slices.ContainsFunc(out.Cells, func(c CellResult) bool { return c.Workload == s.Workload })
	})
	for i, p := range out.Parts {
		out.WallS += p.WallS
		if i == 0 || p.Started.Before(out.Started) {
			out.Started = p.Started
		}
	}
	out.Commit = common(out.Parts, func(p Part) string { return p.Commit })
	out.Machine = common(out.Parts, func(p Part) string { return p.Machine })
	out.Interrupted = strings.Join(interrupted, "; ")
	return out, nil
}

// checkRounds reports a cell whose arms did not each run the cell's rounds.
func checkRounds(c CellResult) error {
	for _, a := range c.Arms {
		if n := len(armRounds(a)); n != max(c.Rounds, 1) {
			return fmt.Errorf("cell %s: arm %s has %d rounds, the cell %d", c.Name(), a.Policy, n, max(c.Rounds, 1))
		}
	}
	return nil
}

// samePool reports why two runs of one cell measured different things (nil: they may be
// pooled). commits are the two runs' ("" unknown: not compared).
func samePool(a, b *CellResult, commitA, commitB string) error {
	var diffs []string
	diff := func(what string, x, y any) {
		if x != y {
			diffs = append(diffs, fmt.Sprintf("%s %v vs %v", what, x, y))
		}
	}
	diff("load", a.Load, b.Load)
	diff("rate", a.Rate, b.Rate)
	diff("requests", a.Requests, b.Requests)
	diff("replicas", a.Replicas, b.Replicas)
	diff("speedup", a.Speedup, b.Speedup)
	pa, _ := json.Marshal(a.Params) // map keys sorted: equal maps, equal bytes
	pb, _ := json.Marshal(b.Params)
	if !bytes.Equal(pa, pb) {
		diffs = append(diffs, fmt.Sprintf("workload parameters %s vs %s", pa, pb))
	}
	if x, y := policiesOf(a), policiesOf(b); !slices.Equal(x, y) {
		diffs = append(diffs, fmt.Sprintf("arms [%s] vs [%s]", strings.Join(x, ", "), strings.Join(y, ", ")))
	}
	if commitA != "" && commitB != "" && commitA != commitB {
		diffs = append(diffs, fmt.Sprintf("commit %s vs %s (rounds of different code are not one sample)", commitA, commitB))
	}
	if len(diffs) > 0 {
		return errors.New(strings.Join(diffs, "; "))
	}
	return nil
}

// policiesOf is the cell's arms' policies, sorted.
func policiesOf(c *CellResult) []string {
	ps := make([]string, len(c.Arms))
	for i, a := range c.Arms {
		ps[i] = a.Policy
	}
	slices.Sort(ps)
	return ps
}

// pool appends b's rounds to a's, arm by arm (samePool checked the arms are the same), and
// re-combines each arm.
func pool(a, b *CellResult) {
	for i, x := range a.Arms {
		j := slices.IndexFunc(b.Arms, func(y Arm) bool { return y.Policy == x.Policy })
		rounds := append(armRounds(x), armRounds(b.Arms[j])...)
		a.Arms[i] = Combine(x.Policy, rounds)
	}
	a.Rounds = max(a.Rounds, 1) + max(b.Rounds, 1)
	if a.CacheOracle == nil {
		a.CacheOracle = b.CacheOracle
	}
}

// armRounds are an arm's rounds as Run made them (one round: the arm itself), without what
// Analyze set.
func armRounds(a Arm) []Arm {
	if len(a.Rounds) > 1 {
		return slices.Clone(a.Rounds)
	}
	a.Flags, a.P95Oracle, a.PrefixOver, a.Rounds = nil, nil, nil, nil
	return []Arm{a}
}

// cellOrder places a cell in plan order: workload, then level.
func cellOrder(c CellResult) int {
	w := slices.Index(Workloads, c.Workload)
	if w < 0 {
		w = len(Workloads)
	}
	l := slices.Index(Levels, c.Level)
	if l < 0 {
		l = len(Levels)
	}
	return w*(len(Levels)+1) + l
}

// policyOrder places a policy in Policies' order, others after them.
func policyOrder(p string) int {
	if i := slices.Index(Policies, p); i >= 0 {
		return i
	}
	return len(Policies)
}

// common is f of every part when they agree, else "".
func common(parts []Part, f func(Part) string) string {
	if len(parts) == 0 {
		return ""
	}
	v := f(parts[0])
	for _, p := range parts[1:] {
		if f(p) != v {
			return ""
		}
	}
	return v
}

// partsBlock lists a merged result's parts for the scoreboard's head ("" for one run).
func partsBlock(r *Result) string {
	if len(r.Parts) == 0 {
		if r.Commit == "" && r.Machine == "" {
			return ""
		}
		return fmt.Sprintf("\ncommit %s · %s · started %s\n", or(r.Commit, "unknown"), or(r.Machine, "machine unknown"), r.Started.Format(time.RFC3339))
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nMerged from %d parts (rounds of a cell that several parts ran are pooled):\n\n", len(r.Parts))
	for i, p := range r.Parts {
		fmt.Fprintf(&sb, "%d. %s: %s · commit %s · %s · started %s, %s\n", i+1, or(p.Source, "(run)"), strings.Join(p.Cells, ", "),
			or(p.Commit, "unknown"), or(p.Machine, "machine unknown"), p.Started.Format(time.RFC3339),
			time.Duration(p.WallS*float64(time.Second)).Round(time.Second))
	}
	return sb.String()
}
