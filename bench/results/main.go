// Command results writes bench/RESULTS.md, the current result of each of prefixlb's claims,
// from the claim files bench/results/*.json (claim.go), and imports a bench run's JSON output
// into a claim file, so that a re-run replaces its table instead of adding to a history.
//
//	go run ./bench/results                # write bench/RESULTS.md
//	go run ./bench/results check          # fail when bench/RESULTS.md is not what the claims render
//	go run ./bench/results import --claim multi-turn --commit C --machine M --command CMD bench-out/report.json
//
// Run it from the repository root (--dir and --out name other paths).
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

func main() {
	if err := command().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "results:", err)
		os.Exit(1)
	}
}

func command() *cobra.Command {
	var dir, out string
	root := &cobra.Command{
		Use:           "results",
		Short:         "Write bench/RESULTS.md from the claim files in bench/results/",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			md, err := renderDir(dir)
			if err != nil {
				return err
			}
			return os.WriteFile(out, []byte(md), 0o644)
		},
	}
	root.PersistentFlags().StringVar(&dir, "dir", filepath.Join("bench", "results"), "directory of the claim files")
	root.PersistentFlags().StringVar(&out, "out", filepath.Join("bench", "RESULTS.md"), "the Markdown file written")

	check := &cobra.Command{
		Use:   "check",
		Short: "Fail when the Markdown file is not what the claim files render",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return checkDir(dir, out)
		},
	}

	var (
		name string
		r    run
	)
	imp := &cobra.Command{
		Use:   "import FILE...",
		Short: "Replace a claim's figures with a run's output (report.json, suite.json or overhead.json), then write the Markdown file",
		Example: `  go run ./bench/results import --claim multi-turn --commit "$(git rev-parse --short HEAD)" \
    --machine "2 shared cores" --command "go run . bench compare" bench-out/report.json`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, paths []string) error {
			c, err := loadClaim(filepath.Join(dir, name+".json"))
			if err != nil {
				return err
			}
			if err := importRun(c, r, paths); err != nil {
				return err
			}
			if err := c.save(dir); err != nil {
				return err
			}
			md, err := renderDir(dir)
			if err != nil {
				return err
			}
			return os.WriteFile(out, []byte(md), 0o644)
		},
	}
	f := imp.Flags()
	f.StringVar(&name, "claim", "", "the claim to replace: the name of its file in --dir, without .json (required)")
	f.StringVar(&r.Command, "command", "", "the command that ran (required)")
	f.StringVar(&r.Commit, "commit", "", "the commit it ran on (required)")
	f.StringVar(&r.Machine, "machine", "", "what it ran on: cores, what else ran (required)")
	f.StringArrayVar(&r.Notes, "note", nil, "a note under the table (repeatable)")
	for _, req := range []string{"claim", "command", "commit", "machine"} {
		_ = imp.MarkFlagRequired(req)
	}
	root.AddCommand(check, imp)
	return root
}

// renderDir renders the claim files of dir.
func renderDir(dir string) (string, error) {
	claims, err := loadClaims(dir)
	if err != nil {
		return "", err
	}
	return render(claims)
}

// checkDir reports an error when the file at out differs from what dir's claims render.
func checkDir(dir, out string) error {
	md, err := renderDir(dir)
	if err != nil {
		return err
	}
	have, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	if !bytes.Equal(have, []byte(md)) {
		return fmt.Errorf("%s is not what %s/*.json render: run go run ./bench/results (never edit it by hand)", out, dir)
	}
	return nil
}
