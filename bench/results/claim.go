package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/prefixlb/prefixlb/bench/overhead"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/suite"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Claim is one claim file, bench/results/NAME.json: what is claimed, how it was measured,
// and the figures of the run that measured it, in the bench's own row types. Exactly one of
// Compare, Suite, Replicas and Overhead is set; it says how the table is rendered and what
// import reads.
type Claim struct {
	// Name is the file's name without .json: the claim's id for import and its anchor.
	Name string `json:"-"`
	// Order places the claim in RESULTS.md (ascending).
	Order int `json:"order"`
	// Title is the section's heading.
	Title string `json:"title"`
	// Claim is what the table shows, in a sentence or two; it stays across re-runs.
	Claim string `json:"claim"`
	// Command reproduces the run; Commit is the commit it ran on (short hash, or several with
	// what each ran); Machine is what it ran on.
	Command string `json:"command"`
	Commit  string `json:"commit"`
	Machine string `json:"machine"`
	// Source says where the figures come from (a run's output file, or a conversion).
	Source string `json:"source"`
	// Notes are what a reader needs to read this run's table; import replaces them.
	Notes []string `json:"notes,omitempty"`

	Compare  *CompareResult  `json:"compare,omitempty"`
	Suite    *SuiteScores    `json:"suite,omitempty"`
	Replicas *ReplicaScores  `json:"replicas,omitempty"`
	Overhead *OverheadResult `json:"overhead,omitempty"`
}

// CompareResult is what a claim keeps of `bench compare`'s report.json (report.Report).
type CompareResult struct {
	Workload string           `json:"workload"`
	Replicas int              `json:"replicas,omitempty"`
	Speedup  float64          `json:"speedup,omitempty"`
	Modes    []report.Mode    `json:"modes"`
	Oracle   *workload.Oracle `json:"oracle,omitempty"`
}

// SuiteScores is `bench suite`'s scoreboard: every cell's TTFT p95 ÷ the oracle's per policy
// and prefix's ÷ each policy's, with their 95% intervals over the cell's rounds (suite.Analyze
// of suite.json), and how many cells the prefix arm met every one of the predicted-TTFT
// targets in (suite.TargetCheck, judged on the intervals).
type SuiteScores struct {
	Policies []string    `json:"policies"`
	Cells    []SuiteCell `json:"cells"`
	// TargetsMet of TargetsJudged cells: the prefix arm met every target there.
	TargetsMet    int `json:"targets_met"`
	TargetsJudged int `json:"targets_judged"`
	// Intervals is true when the targets were judged on the ratios' intervals (suite.Verdict);
	// false for claims scored before, on central estimates. TargetsNotMet and TargetsNotShown
	// count the judged cells of the other verdicts.
	Intervals       bool `json:"intervals,omitempty"`
	TargetsNotMet   int  `json:"targets_not_met,omitempty"`
	TargetsNotShown int  `json:"targets_not_shown,omitempty"`
	// Parts are the suite runs a merged suite.json pooled (bench suite merge), each with its
	// commit, machine, start and cells; empty for one run.
	Parts []suite.Part `json:"parts,omitempty"`
	// Tenants are the overload cells' per-tenant medians (suite.TenantMedian), and
	// FlowTargets issue 56's targets on them with FlowVerdict, prefix+fc's verdict on them
	// together; empty without overload cells.
	Tenants     []SuiteTenants        `json:"tenants,omitempty"`
	FlowTargets []suite.FlowTargetRow `json:"flow_targets,omitempty"`
	FlowVerdict string                `json:"flow_verdict,omitempty"`
}

// SuiteTenants is one overload cell's per-tenant rows, medians over its rounds.
type SuiteTenants struct {
	Cell   string               `json:"cell"`
	Rounds int                  `json:"rounds"`
	Rows   []suite.TenantMedian `json:"rows"`
}

// SuiteCell is one row of the scoreboard.
type SuiteCell struct {
	Cell string `json:"cell"`
	// P95OverOracle is each policy's TTFT p95 ÷ the oracle's, in Policies' order; null where
	// the arm was flagged or not run, or the cell's oracle arm is not valid.
	P95OverOracle []*float64 `json:"p95_over_oracle"`
	// Rounds is how many interleaved rounds the cell's ratios pool (0: not kept).
	Rounds int `json:"rounds,omitempty"`
	// P95OverOracleCI is each ratio's 95% interval [lo, hi], in Policies' order; null where
	// there is none (one round, or no ratio).
	P95OverOracleCI []*[2]float64 `json:"p95_over_oracle_ci,omitempty"`
	// PrefixOver is the prefix arm's TTFT p95 ÷ each policy's, in Policies' order (null for
	// prefix itself, flagged arms, or no valid prefix arm), and PrefixOverCI its intervals.
	PrefixOver   []*float64    `json:"prefix_p95_over,omitempty"`
	PrefixOverCI []*[2]float64 `json:"prefix_p95_over_ci,omitempty"`
	// Targets is the prefix arm's verdict on every target together (suite.Verdict: met, not
	// met, not shown, not judged; "" where the prefix arm is flagged or the claim predates it).
	Targets string `json:"targets,omitempty"`
}

// ReplicaScores is several prefixlb replicas against one, per cell of `bench suite`
// (suite.RouterCheck of the Policy arm against the prefix arm).
type ReplicaScores struct {
	// Policy is the multi-router arm compared, as the suite names it (prefix×3+peer).
	Policy string        `json:"policy"`
	Cells  []ReplicaCell `json:"cells"`
}

// ReplicaCell is one cell: the arm's cached-token ratio and TTFT p95, each ÷ one replica's.
type ReplicaCell struct {
	Cell   string  `json:"cell"`
	Cached float64 `json:"cached_ratio"`
	P95    float64 `json:"p95_ratio"`
	// Rounds are the per-round p95 ratios P95 is the median of (empty: not kept).
	Rounds []float64 `json:"rounds,omitempty"`
}

// OverheadResult is what a claim keeps of `bench overhead`'s overhead.json (overhead.Report).
type OverheadResult struct {
	HAProxy string                   `json:"haproxy,omitempty"`
	Rows    []overhead.Row           `json:"rows"`
	Routing []overhead.RoutingResult `json:"routing,omitempty"`
	Index   *overhead.IndexMemory    `json:"index,omitempty"`
}

// kind names the claim's table: the one result field that is set.
func (c *Claim) kind() (string, error) {
	var kinds []string
	for _, k := range []struct {
		name string
		set  bool
	}{{"compare", c.Compare != nil}, {"suite", c.Suite != nil}, {"replicas", c.Replicas != nil}, {"overhead", c.Overhead != nil}} {
		if k.set {
			kinds = append(kinds, k.name)
		}
	}
	if len(kinds) != 1 {
		return "", fmt.Errorf("claim %s: want exactly one of compare, suite, replicas, overhead; has %d (%s)",
			c.Name, len(kinds), strings.Join(kinds, ", "))
	}
	return kinds[0], nil
}

// validate checks what every claim must say.
func (c *Claim) validate() error {
	for _, f := range []struct{ name, v string }{{"title", c.Title}, {"claim", c.Claim},
		{"command", c.Command}, {"commit", c.Commit}, {"machine", c.Machine}, {"source", c.Source}} {
		if strings.TrimSpace(f.v) == "" {
			return fmt.Errorf("claim %s: %s is empty", c.Name, f.name)
		}
	}
	_, err := c.kind()
	return err
}

// loadClaims reads every dir/*.json claim file, in Order (then name).
func loadClaims(dir string) ([]*Claim, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no claim files (*.json) in %s", dir)
	}
	var out []*Claim
	for _, p := range paths {
		c, err := loadClaim(p)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Order != out[j].Order {
			return out[i].Order < out[j].Order
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// loadClaim reads one claim file; unknown fields are errors (a typo would drop a figure).
func loadClaim(path string) (*Claim, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &Claim{}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.Name = strings.TrimSuffix(filepath.Base(path), ".json")
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// save writes the claim to dir/NAME.json, indented.
func (c *Claim) save(dir string) error {
	if c.Name == "" {
		return errors.New("claim without a name")
	}
	if err := c.validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, c.Name+".json"), append(b, '\n'), 0o644)
}
