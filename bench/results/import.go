package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/prefixlb/prefixlb/bench/overhead"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/suite"
)

// run is where a run's figures come from and what it ran on: what import writes into a claim
// besides the figures.
type run struct {
	Command, Commit, Machine string
	Notes                    []string
}

// importRun replaces claim c's figures with those of a run's output files, read in the format
// the claim's kind names: compare, report.json files of `bench compare` (several: their modes
// one after another, e.g. one mode per run); suite and replicas, one suite.json of `bench
// suite`; overhead, one overhead.json of `bench overhead`. The command, commit and machine
// become r's; the notes are r's (those of the previous run no longer apply).
func importRun(c *Claim, r run, paths []string) error {
	if r.Command == "" || r.Commit == "" || r.Machine == "" {
		return errors.New("import needs the run's command, commit and machine")
	}
	if len(paths) == 0 {
		return errors.New("import needs the run's output file")
	}
	kind, err := c.kind()
	if err != nil {
		return err
	}
	if kind != "compare" && len(paths) > 1 {
		return fmt.Errorf("claim %s (%s) takes one output file, got %d", c.Name, kind, len(paths))
	}
	switch kind {
	case "compare":
		var cr *CompareResult
		for _, p := range paths {
			var rep report.Report
			if err := readJSON(p, &rep); err != nil {
				return err
			}
			if len(rep.Modes) == 0 {
				return fmt.Errorf("%s: no modes: not a bench compare report.json", p)
			}
			if cr == nil {
				cr = &CompareResult{Workload: rep.Workload, Replicas: rep.Replicas, Speedup: rep.Speedup, Oracle: rep.Oracle}
			} else if rep.Workload != cr.Workload {
				return fmt.Errorf("%s: workload %q, the first file's is %q", p, rep.Workload, cr.Workload)
			}
			cr.Modes = append(cr.Modes, rep.Modes...)
		}
		c.Compare = cr
	case "suite", "replicas":
		var res suite.Result
		if err := readJSON(paths[0], &res); err != nil {
			return err
		}
		if len(res.Cells) == 0 {
			return fmt.Errorf("%s: no cells: not a bench suite suite.json", paths[0])
		}
		b := suite.Analyze(&res)
		if kind == "suite" {
			c.Suite = suiteScores(b)
		} else {
			rs, err := replicaScores(b, c.Replicas.Policy)
			if err != nil {
				return fmt.Errorf("%s: %w", paths[0], err)
			}
			c.Replicas = rs
		}
	case "overhead":
		var rep overhead.Report
		if err := readJSON(paths[0], &rep); err != nil {
			return err
		}
		if len(rep.Rows) == 0 {
			return fmt.Errorf("%s: no rows: not a bench overhead overhead.json", paths[0])
		}
		overhead.Derive(rep.Rows)
		c.Overhead = &OverheadResult{HAProxy: rep.HAProxy, Rows: rep.Rows, Routing: rep.Routing, Index: rep.Index}
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = "`" + filepath.Base(p) + "`"
	}
	c.Command, c.Commit, c.Machine, c.Notes = r.Command, r.Commit, r.Machine, r.Notes
	c.Source = "the run's " + strings.Join(names, ", ") + ", imported by `go run ./bench/results import`"
	return nil
}

// suiteScores is the scoreboard's two ratio matrices with their intervals and the targets'
// verdicts and tally.
func suiteScores(b *suite.Board) *SuiteScores {
	s := &SuiteScores{Policies: b.Result.Policies, Intervals: true, Parts: b.Result.Parts}
	verdicts := map[string]string{}
	for _, t := range b.Targets {
		verdicts[t.Cell] = t.Verdict().String()
		if !t.Judged() {
			continue
		}
		s.TargetsJudged++
		switch t.Verdict() {
		case suite.Met:
			s.TargetsMet++
		case suite.NotMet:
			s.TargetsNotMet++
		case suite.NotShown:
			s.TargetsNotShown++
		}
	}
	for ci, c := range b.Result.Cells {
		n := len(s.Policies)
		sc := SuiteCell{Cell: c.Name(), Rounds: max(c.Rounds, 1), Targets: verdicts[c.Name()], P95OverOracle: make([]*float64, n),
			P95OverOracleCI: make([]*[2]float64, n), PrefixOver: make([]*float64, n), PrefixOverCI: make([]*[2]float64, n)}
		for i, p := range s.Policies {
			for _, row := range b.Rows[ci] {
				if row.Policy != p {
					continue
				}
				if !math.IsNaN(row.Ratio) {
					v := row.Ratio
					sc.P95OverOracle[i] = &v
					sc.P95OverOracleCI[i] = ci95(row.Interval)
				}
				if row.PrefixOver != nil {
					v := row.PrefixOver.Ratio
					sc.PrefixOver[i], sc.PrefixOverCI[i] = &v, ci95(row.PrefixOver)
				}
			}
		}
		s.Cells = append(s.Cells, sc)
		if len(c.Tenants) > 0 {
			s.Tenants = append(s.Tenants, SuiteTenants{Cell: c.Name(), Rounds: max(c.Rounds, 1), Rows: c.Tenants})
		}
	}
	if rows, overall := suite.FlowTargets(b); len(rows) > 0 {
		s.FlowTargets, s.FlowVerdict = rows, overall.String()
	}
	return s
}

// ci95 is the interval's [lo, hi], nil without one.
func ci95(ri *suite.RatioInterval) *[2]float64 {
	if !ri.HasInterval() {
		return nil
	}
	return &[2]float64{ri.Lo, ri.Hi}
}

// replicaScores is the multi-router arm policy against one replica, per cell that compared
// them.
func replicaScores(b *suite.Board, policy string) (*ReplicaScores, error) {
	s := &ReplicaScores{Policy: policy}
	for _, rc := range b.Routers {
		if rc.Policy == policy {
			s.Cells = append(s.Cells, ReplicaCell{Cell: rc.Cell, Cached: rc.Cached, P95: rc.P95, Rounds: rc.Rounds})
		}
	}
	if len(s.Cells) == 0 {
		return nil, fmt.Errorf("no valid %s arm to compare with a valid prefix arm", policy)
	}
	return s, nil
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
