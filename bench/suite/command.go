package suite

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// Command returns `prefixlb bench suite`. It is registered under `prefixlb bench` by main
// (bench/suite imports bench, so bench cannot import it).
func Command() *cobra.Command {
	var (
		o                                      Options
		workloads, policies, levels, cellsFlag string
	)
	c := &cobra.Command{
		Use:   "suite",
		Short: "Every workload × load level × policy on fresh sims: one scoreboard against the oracle",
		Long: `suite runs bench compare's arms for every workload (` + strings.Join(Workloads, ", ") + `;
mooncake and oasst when their data is under the shared directory) × load level (light, medium,
near saturation for open-loop workloads; one level for closed-loop ones) × policy (` + strings.Join(Policies, ", ") + `),
each arm on fresh simulated replicas with the same seed. It prints one scoreboard (TTFT
p50/p95/p99, E2E p95, cached-token ratio, max share / mean, TTFT p95 ÷ the oracle's), a validity
summary and the cells where prefix's p95 is more than 10% above the oracle's or a peer's, and
writes DIR/suite.json and DIR/suite.png. The full suite (every cell in 3 interleaved rounds)
takes about 4 hours on 2 cores: run it in parts with --cells, each part to its own --out, and
pool them with 'bench suite merge' (bench/README.md lists the parts). --quick (one level per
workload, smaller sizes) takes about 5 minutes.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Repeat < 0 {
				return fmt.Errorf("--rounds must be ≥ 1, or 0 for the plan's rounds (got %d)", o.Repeat)
			}
			patterns, only := splitList(cellsFlag), splitList(workloads)
			if len(only) == 0 {
				only = CellWorkloads(patterns)
			}
			cells, skipped, err := Plan(o.Quick, only)
			if err != nil {
				return err
			}
			if cells, err = KeepCells(cells, patterns); err != nil {
				return err
			}
			if cells, err = KeepLevels(cells, splitList(levels)); err != nil {
				return err
			}
			o.Policies = splitList(policies)
			o.Stdout, o.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			parent := cmd.Context()
			if parent == nil {
				parent = context.Background()
			}
			ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
			defer stop()
			_, err = Run(ctx, o, cells, skipped)
			return err
		},
	}
	fs := c.Flags()
	fs.BoolVar(&o.Quick, "quick", false, "one load level per workload and smaller sizes (about 5 minutes on 2 cores)")
	fs.StringVar(&o.Out, "out", "bench-out/suite", "directory for suite.json and suite.png (empty: write nothing)")
	fs.StringVar(&workloads, "workloads", "", "comma-separated workloads (default: all of "+strings.Join(Workloads, ", ")+")")
	fs.StringVar(&levels, "levels", "", "comma-separated load levels (default: all of "+strings.Join(Levels, ", ")+")")
	fs.StringVar(&policies, "policies", "", "comma-separated policies (default: all of "+strings.Join(Policies, ", ")+"; prefix-x3 = prefix×3, prefix-x3+peer = prefix×3+peer)")
	fs.Uint64Var(&o.Seed, "seed", 1, "workload seed, the same for every arm")
	fs.IntVar(&o.Repeat, "rounds", 0, "interleaved rounds of every cell, each arm scored by its medians over them and its p95 ÷ oracle by the rounds' ratios with a 95% interval (default: the plan's, 3 in every cell, 1 with --quick; more rounds of one cell: run it again and merge)")
	fs.IntVar(&o.Repeat, "repeat", 0, "the same as --rounds")
	fs.StringVar(&cellsFlag, "cells", "", "comma-separated cells as WORKLOAD/LEVEL patterns, e.g. 'agentic/*,mooncake/cache-pressure' (default: all; with --workloads and --levels, the cells all three keep)")
	fs.StringVar(&o.Machine, "machine", "", "a note on what this run is on, recorded in suite.json before the machine's own description (e.g. \"shared 2-core VM, nothing else running\")")
	fs.BoolVarP(&o.Quiet, "quiet", "q", false, "no progress bar or per-arm lines on stderr")
	c.AddCommand(mergeCommand())
	return c
}

// mergeCommand is `prefixlb bench suite merge PART/suite.json... --out DIR`.
func mergeCommand() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "merge PART/suite.json...",
		Short: "Pool suite parts (runs with --cells, --rounds) into one scoreboard",
		Long: `merge reads the suite.json of each part, takes the union of their cells and scores it as
one suite: the scoreboard on stdout, DIR/suite.json and DIR/suite.png. A cell that several parts
ran has its rounds pooled (every arm's rounds one part after another, so round i is still one
interleaved pass), only when the parts ran it with the same seed, sizes, load, speed-up, arms
and commit; otherwise merge refuses and says what differs. The merged suite.json lists every
part with its commit, machine, start and cells; a merged suite.json may be merged again.`,
		Args:         cobra.MinimumNArgs(1),
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, paths []string) error {
			parts := make([]*Result, len(paths))
			for i, p := range paths {
				r, err := ReadJSON(p)
				if err != nil {
					return err
				}
				parts[i] = r
			}
			res, err := Merge(parts, paths)
			if err != nil {
				return err
			}
			return Score(res, out, cmd.OutOrStdout())
		},
	}
	c.Flags().StringVar(&out, "out", "bench-out/suite", "directory for the merged suite.json and suite.png (empty: write nothing)")
	return c
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
