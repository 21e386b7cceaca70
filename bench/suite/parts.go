// Parts: a suite run in parts (--cells), each recording what it ran on, merged later.

package suite

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// Part is one run of the suite that a merged result pools (Merge): where its suite.json was,
// what it ran on and which cells it ran.
type Part struct {
	// Source is the suite.json the part was read from ("" for a run not read from a file).
	Source  string    `json:"source,omitempty"`
	Started time.Time `json:"started"`
	WallS   float64   `json:"wall_s"`
	// Commit and Machine are the run's (Result.Commit, Result.Machine).
	Commit  string `json:"commit,omitempty"`
	Machine string `json:"machine,omitempty"`
	Seed    uint64 `json:"seed"`
	// Cells are the names of the cells it ran ("agentic light").
	Cells []string `json:"cells"`
	// Interrupted is the run's Result.Interrupted.
	Interrupted string `json:"interrupted,omitempty"`
}

// KeepCells returns the cells matching any of patterns (nil: all), in order. A pattern is
// WORKLOAD/LEVEL, each side a path.Match pattern ("agentic/*", "mooncake/cache-pressure",
// "*/near-saturation"), or a bare WORKLOAD for all its levels; an opt-in workload
// (OptInWorkloads) matches only where the pattern names it ("overload/fair*"). The error names a malformed
// pattern or one whose workload or level matches none of the suite's (a typo would silently
// run nothing).
func KeepCells(cells []Cell, patterns []string) ([]Cell, error) {
	if len(patterns) == 0 {
		return cells, nil
	}
	type pat struct{ w, l string }
	ps := make([]pat, len(patterns))
	for i, p := range patterns {
		w, l, ok := strings.Cut(p, "/")
		if !ok {
			l = "*"
		}
		if _, err := path.Match(w, ""); err != nil || strings.Contains(l, "/") {
			return nil, fmt.Errorf("--cells: %q is not WORKLOAD/LEVEL", p)
		}
		if _, err := path.Match(l, ""); err != nil {
			return nil, fmt.Errorf("--cells: %q is not WORKLOAD/LEVEL", p)
		}
		if !slices.ContainsFunc(Workloads, func(x string) bool { m, _ := path.Match(w, x); return m }) && !slices.Contains(OptInWorkloads, w) {
			return nil, fmt.Errorf("--cells: %q: no workload matches %q (want some of %s, or %s by name)", p, w, strings.Join(Workloads, ", "), strings.Join(OptInWorkloads, ", "))
		}
		if !slices.ContainsFunc(Levels, func(x string) bool { m, _ := path.Match(l, x); return m }) {
			return nil, fmt.Errorf("--cells: %q: no level matches %q (want some of %s)", p, l, strings.Join(Levels, ", "))
		}
		ps[i] = pat{w, l}
	}
	var out []Cell
	for _, c := range cells {
		if slices.ContainsFunc(ps, func(p pat) bool {
			mw, _ := path.Match(p.w, c.Workload)
			mw = mw && (p.w == c.Workload || !slices.Contains(OptInWorkloads, c.Workload))
			ml, _ := path.Match(p.l, c.Level)
			return mw && ml
		}) {
			out = append(out, c)
		}
	}
	return out, nil
}

// CellWorkloads are the workloads that patterns (KeepCells') can match, in Workloads order
// (nil for no patterns): the workloads a part needs to plan, so that a part of agentic cells
// does not report the Mooncake trace missing. An opt-in workload is among them where a pattern
// names it.
func CellWorkloads(patterns []string) []string {
	if len(patterns) == 0 {
		return nil
	}
	var out []string
	for _, w := range append(slices.Clone(Workloads), OptInWorkloads...) {
		for _, p := range patterns {
			pw, _, _ := strings.Cut(p, "/")
			if m, _ := path.Match(pw, w); m && (pw == w || !slices.Contains(OptInWorkloads, w)) {
				out = append(out, w)
				break
			}
		}
	}
	return out
}

// Commit is the commit this binary was built from: the build's VCS stamp, else `git rev-parse
// --short=12 HEAD` in the working directory (`go run` and tests are not stamped), with
// "+dirty" when tracked files differ from it; "" when neither says.
func Commit(ctx context.Context) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev string
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			return short(rev) + map[bool]string{true: "+dirty"}[dirty]
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rev, err := exec.CommandContext(ctx, "git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(rev))
	if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += "+dirty"
	}
	return c
}

// Machine describes this machine: OS/arch, CPUs the Go runtime may use and their model (from
// /proc/cpuinfo where there is one) and the host name, after note (the --machine flag: what
// else ran, a VM's name) when given.
func Machine(note string) string {
	cpu := ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = " (" + strings.TrimSpace(v) + ")"
				break
			}
		}
		f.Close()
	}
	host, _ := os.Hostname()
	m := fmt.Sprintf("%s/%s, %d CPUs%s, host %s", runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), cpu, or(host, "?"))
	if note != "" {
		return note + "; " + m
	}
	return m
}

// partOf is the Part a single run's result stands for.
func partOf(r *Result, source string) Part {
	p := Part{Source: source, Started: r.Started, WallS: r.WallS, Commit: r.Commit, Machine: r.Machine, Seed: r.Seed, Interrupted: r.Interrupted}
	for _, c := range r.Cells {
		p.Cells = append(p.Cells, c.Name())
	}
	return p
}
