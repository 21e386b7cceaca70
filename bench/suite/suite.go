// Package suite is `prefixlb bench suite`: it runs bench.Compare for every workload × load
// level × routing policy (each arm on fresh simulated replicas with the same seed) and turns
// the arms' report.Modes into one scoreboard: TTFT p50/p95/p99, E2E p95, cached-token ratio,
// max share / mean, each policy's TTFT p95 ÷ the oracle's and prefix's ÷ each policy's (paired
// by round, with 95% intervals), with validity checks (arms with errors or flags are shown, not
// averaged), the cells where prefix loses and the targets judged on the intervals. It writes
// DIR/suite.json (every arm's report.Mode) and DIR/suite.png (p95 ÷ oracle, grouped bars).
// A suite runs in parts (--cells) that Merge pools into one.
package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Policy names. OraclePolicy is the bench-only physical limit every ratio divides by;
// PrefixPolicy is the policy "where prefix loses" is about.
const (
	OraclePolicy = "oracle"
	PrefixPolicy = "prefix"
	// SuiteRouterReplicas is the router count of the "prefix×3" and "prefix×3+peer" arms: N
	// prefixlb replicas behind a per-request spread (a Service in front of a 3-replica
	// Deployment, the worst case for affinity), independent (each its own index) or peered
	// (package peering: one shared index and load view).
	SuiteRouterReplicas = 3
	// PeerSuffix marks a multi-router prefix arm whose routers are peered: prefix×N+peer.
	PeerSuffix = "+peer"
	// MaxRouters bounds prefix×N: each router is an in-process prefixlb with its own listeners,
	// index and health checks, all on the suite's 2 cores; past a Deployment's usual few
	// replicas more routers add only file descriptors and scheduling noise to the arm.
	MaxRouters = 16
)

// Policies are the suite's arms in scoreboard order: prefixlb's own modes, prefix behind
// several routers (independent, then peered), the peers' published policies
// (bench/peers) and the oracle.
var Policies = []string{"round-robin", "least-load", "prefix", "prefix×3", "prefix×3" + PeerSuffix, "chwbl", "sglang", "dynamo", "dynamo-kv", "llm-d", "llm-d-default", OraclePolicy}

// Peers are the policies "where prefix loses" compares prefix against, besides the oracle.
var Peers = []string{"chwbl", "sglang", "dynamo", "dynamo-kv", "llm-d", "llm-d-default"}

// routersRe matches a multi-router prefix arm: prefix×N (also prefix-xN or prefix*N, easier to
// type), peered with the +peer suffix.
var routersRe = regexp.MustCompile(`^prefix(?:×|-x|\*)([0-9]+)(\+peer)?$`)

// ParsePolicy splits a policy name into the bench mode and its router count (1 for a single
// prefixlb); a canonical name ending in PeerSuffix has its routers peered (Peered). The error
// names the suite's policies, or the router count's bounds (1..MaxRouters; 2.. peered).
func ParsePolicy(name string) (mode string, routers int, canonical string, err error) {
	if m := routersRe.FindStringSubmatch(name); m != nil {
		n, err := strconv.Atoi(m[1])
		if err != nil || n < 1 || n > MaxRouters {
			return "", 0, "", fmt.Errorf("policy %q: router count must be 1..%d", name, MaxRouters)
		}
		if m[2] != "" {
			if n == 1 {
				return "", 0, "", fmt.Errorf("policy %q: peering needs 2..%d routers", name, MaxRouters)
			}
			return PrefixPolicy, n, fmt.Sprintf("prefix×%d%s", n, PeerSuffix), nil
		}
		if n == 1 {
			return PrefixPolicy, 1, PrefixPolicy, nil
		}
		return PrefixPolicy, n, fmt.Sprintf("prefix×%d", n), nil
	}
	if !slices.Contains(Policies, name) && !slices.Contains(bench.FlowControlArms, name) {
		return "", 0, "", fmt.Errorf("unknown policy %q (want some of %s, or the flow-control arms %s)", name, strings.Join(Policies, ", "), strings.Join(bench.FlowControlArms, ", "))
	}
	return name, 1, name, nil
}

// Peered reports whether a canonical policy name (ParsePolicy's) is a peered multi-router arm.
func Peered(canonical string) bool { return strings.HasSuffix(canonical, PeerSuffix) }

// Cell is one (workload, load level) of the suite: the bench.Options every arm of it runs
// with (Modes, Out and the writers are set per arm).
type Cell struct {
	Workload string `json:"workload"`
	// Level is light | medium | near-saturation for open-loop workloads, closed for closed-loop
	// ones.
	Level string `json:"level"`
	// Load describes the offered load for the scoreboard ("25 req/s", "4 users").
	Load string `json:"load"`
	// Rate is the open-loop rate in the workload's unit (requests/s, conversations/s or
	// sessions/s, model time); 0 for closed loop and for mooncake, whose load is TimeScale.
	Rate float64 `json:"rate,omitempty"`
	// Rounds is how many times every arm runs (interleaved: every policy once, then again);
	// the scoreboard shows each arm's medians over them (Combine). 0 counts as 1.
	Rounds int `json:"rounds,omitempty"`
	// Options are the bench options of every arm.
	Options bench.Options `json:"-"`
}

// Name is "workload level".
func (c Cell) Name() string { return c.Workload + " " + c.Level }

// Arm is one policy's run of one cell.
type Arm struct {
	Policy string `json:"policy"`
	// Mode is the arm's report row (nil when the arm did not run).
	Mode *report.Mode `json:"mode,omitempty"`
	// Error is why the arm produced no row, or Compare's error after a row (every request
	// failed).
	Error string `json:"error,omitempty"`
	// WallS is the arm's wall time in seconds, sims' start and stop included.
	WallS float64 `json:"wall_s"`
	// Flags are the validity flags the scoreboard gives the arm (see Analyze); set by Analyze.
	Flags []string `json:"flags,omitempty"`
	// P95Oracle is the arm's TTFT p95 ÷ the cell's oracle's, per round and pooled over the
	// rounds with its ~95% interval (RatioInterval); set by Analyze, nil when this arm or the
	// oracle's is flagged or missing.
	P95Oracle *RatioInterval `json:"p95_oracle,omitempty"`
	// PrefixOver is the cell's prefix arm's TTFT p95 ÷ this arm's, per round and pooled the
	// same way; set by Analyze, nil for the prefix arm and where either arm is flagged.
	PrefixOver *RatioInterval `json:"prefix_p95_over,omitempty"`
	// Rounds are the arm's runs when its cell ran more than one round (Combine made Mode
	// from them); empty for one round.
	Rounds []Arm `json:"rounds,omitempty"`
}

// CellResult is a cell and its arms, in policy order.
type CellResult struct {
	Cell
	Requests int            `json:"requests"`
	Params   map[string]any `json:"params,omitempty"`
	// Replicas and Speedup are the arms' simulated replicas and time compression.
	Replicas int     `json:"replicas"`
	Speedup  float64 `json:"speedup"`
	// CacheOracle is the best cached-token ratio the request stream allows (mooncake only).
	CacheOracle *workload.Oracle `json:"cache_oracle,omitempty"`
	Arms        []Arm            `json:"arms"`
	// Notes are the cell's validity notes (digest not checked, digests differ); set by Analyze.
	Notes []string `json:"notes,omitempty"`
	// ExactCache is the exact-cache gain (exactcache.go), Tenants each arm's tenants' medians
	// over the rounds (an overload cell's), FlowControl issue 56's targets on an overload cell
	// and Moonshot its moonshot on another cell with a prefix+fc arm (flowtargets.go); set by
	// Analyze, nil where they do not apply.
	ExactCache  *ExactCache    `json:"exact_cache,omitempty"`
	Tenants     []TenantMedian `json:"tenant_medians,omitempty"`
	FlowControl *FlowCheck     `json:"flow_control_targets,omitempty"`
	Moonshot    *Moonshot      `json:"moonshot,omitempty"`
}

// Skip is a workload the suite did not run, and why.
type Skip struct {
	Workload string `json:"workload"`
	Reason   string `json:"reason"`
}

// Result is the whole suite, as written to suite.json.
type Result struct {
	Started  time.Time    `json:"started"`
	Seed     uint64       `json:"seed"`
	Quick    bool         `json:"quick"`
	Policies []string     `json:"policies"`
	WallS    float64      `json:"wall_s"`
	Cells    []CellResult `json:"cells"`
	Skipped  []Skip       `json:"skipped,omitempty"`
	// Interrupted says how far an interrupted run got ("" when it ran to the end).
	Interrupted string `json:"interrupted,omitempty"`
	// Commit is the commit the run was built from (Commit: "+dirty" when it had local
	// changes; "" unknown) and Machine what it ran on (Machine); a merge's are its parts' when
	// they all agree, else "".
	Commit  string `json:"commit,omitempty"`
	Machine string `json:"machine,omitempty"`
	// Parts are the runs a merged result pools (Merge), each with its commit, machine, start
	// and cells; empty for one run.
	Parts []Part `json:"parts,omitempty"`
}

// Options configure a suite run.
type Options struct {
	// Out is the directory for suite.json and suite.png ("" writes nothing).
	Out string
	// Policies are the arms of every cell (nil: Policies).
	Policies []string
	// Seed is every arm's workload seed.
	Seed  uint64
	Quick bool
	// Repeat, when > 0, is every cell's rounds (Cell.Rounds), in place of the plan's.
	Repeat int
	// Machine is a note on what the run is on, recorded before the machine's own description
	// (the --machine flag: "shared 2-core VM, nothing else running").
	Machine string
	// Quiet hides the progress bar and the per-arm lines on Stderr.
	Quiet          bool
	Stdout, Stderr io.Writer
}

// Run runs every cell with every policy, one bench.Compare per arm (fresh sims each time),
// prints the scoreboard on Stdout and writes DIR/suite.json and DIR/suite.png. skipped lists
// workloads not run (shown in the scoreboard). A failed arm is recorded in its Arm and
// flagged, not returned. When ctx ends mid-run, the arms finished so far are still scored and
// written, and the error is ctx's; other errors are bad options (an unknown policy, two
// policies naming the same arm, no cell left: then the error gives each skip's reason) or
// unwritable output.
func Run(ctx context.Context, o Options, cells []Cell, skipped []Skip) (*Result, error) {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if len(o.Policies) == 0 {
		o.Policies = Policies
	}
	o.Policies = slices.Clone(o.Policies) // canonicalised below; the caller's slice stays as given
	if len(cells) == 0 {
		var why []string
		for _, s := range skipped {
			why = append(why, s.Workload+" skipped: "+s.Reason)
		}
		if len(why) == 0 {
			return nil, errors.New("suite: no cells to run")
		}
		return nil, errors.New("suite: no cells to run: " + strings.Join(why, "; "))
	}
	for i, p := range o.Policies {
		_, _, canon, err := ParsePolicy(p)
		if err != nil {
			return nil, err
		}
		if j := slices.Index(o.Policies[:i], canon); j >= 0 {
			return nil, fmt.Errorf("--policies: %q and %q are the same arm (%s)", p, o.Policies[j], canon)
		}
		o.Policies[i] = canon
	}
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return nil, fmt.Errorf("--out: %w", err)
		}
	}
	res := &Result{Started: time.Now().UTC(), Seed: o.Seed, Quick: o.Quick, Policies: o.Policies, Skipped: skipped,
		Commit: Commit(ctx), Machine: Machine(o.Machine)}
	start := time.Now()
	cells = slices.Clone(cells) // Rounds is resolved below; the caller's cells stay as given
	total := 0
	for i := range cells {
		cells[i].Rounds = o.rounds(cells[i])
		total += cells[i].Rounds * len(o.Policies)
	}
	bar, visible := newBar(o, total)
	done := 0
cells:
	for _, c := range cells {
		cr := CellResult{Cell: c}
		rounds := make([][]Arm, len(o.Policies))
		for round := 1; round <= c.Rounds && ctx.Err() == nil; round++ {
			for pi, p := range o.Policies {
				if ctx.Err() != nil {
					break
				}
				name := c.Name() + " " + p
				if c.Rounds > 1 {
					name += fmt.Sprintf(" (round %d/%d)", round, c.Rounds)
				}
				bar.Describe(fmt.Sprintf("%-40s", name))
				arm := runArm(ctx, o, c, p, &cr)
				if ctx.Err() != nil {
					break // the arm was cut short: not a measurement
				}
				rounds[pi] = append(rounds[pi], arm)
				done++
				_ = bar.Add(1)
				if !visible && !o.Quiet {
					fmt.Fprintf(o.Stderr, "[%d/%d] %s\n", done, total, armLine(c, arm, round))
				}
			}
		}
		// A run cut short mid-round keeps only the complete rounds of every arm that ran, so
		// that each arm's median is over the same rounds.
		complete := c.Rounds
		for pi := range o.Policies {
			if n := len(rounds[pi]); n > 0 {
				complete = min(complete, n)
			}
		}
		cr.Rounds = complete
		for pi, p := range o.Policies {
			if len(rounds[pi]) > 0 {
				cr.Arms = append(cr.Arms, Combine(p, rounds[pi][:complete]))
			}
		}
		if len(cr.Arms) > 0 {
			res.Cells = append(res.Cells, cr)
		}
		if ctx.Err() != nil {
			res.Interrupted = fmt.Sprintf("interrupted after %d of %d arm runs: the last cell may be partial (fewer arms or rounds) and later cells are missing", done, total)
			break cells
		}
	}
	if visible {
		_ = bar.Finish()
		fmt.Fprintln(o.Stderr)
	}
	res.WallS = time.Since(start).Seconds()
	if err := Score(res, o.Out, o.Stdout); err != nil {
		return res, err
	}
	return res, ctx.Err()
}

// Score analyses r, prints the scoreboard on w and, when dir is not "", writes dir/suite.json
// and dir/suite.png.
func Score(r *Result, dir string, w io.Writer) error {
	b := Analyze(r)
	fmt.Fprint(w, Render(b))
	if dir == "" {
		return nil
	}
	jp, pp := filepath.Join(dir, "suite.json"), filepath.Join(dir, "suite.png")
	if err := WriteJSON(jp, r); err != nil {
		return err
	}
	if err := Plot(pp, b); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nWrote %s and %s.\n", jp, pp)
	return nil
}

// runArm runs one policy on one cell through bench.Compare and fills the cell's facts from
// the first arm that produced a report.
func runArm(ctx context.Context, o Options, c Cell, policy string, cr *CellResult) Arm {
	arm := Arm{Policy: policy}
	mode, routers, _, err := ParsePolicy(policy)
	if err != nil {
		arm.Error = err.Error()
		return arm
	}
	bo := c.Options
	bo.Modes = []string{mode}
	bo.Flags.Seed = o.Seed
	bo.Out, bo.DumpRequests = "", false
	bo.Quiet, bo.Stdout, bo.Stderr = true, io.Discard, o.Stderr
	bo.RouterReplicas = max(routers, 1)
	bo.Peering = Peered(policy)
	t0 := time.Now()
	rep, err := bench.Compare(ctx, bo)
	arm.WallS = time.Since(t0).Seconds()
	if err != nil {
		arm.Error = err.Error()
	}
	if rep != nil && len(rep.Modes) == 1 {
		m := rep.Modes[0]
		m.Mode = policy
		arm.Mode = &m
		if cr.Requests == 0 {
			cr.Requests, cr.Params, cr.CacheOracle = m.Requests, rep.Params, rep.Oracle
			cr.Replicas, cr.Speedup = rep.Replicas, rep.Speedup
		}
	}
	return arm
}

// rounds is how many rounds the cell runs: Repeat when set, else the cell's own (at least 1).
func (o Options) rounds(c Cell) int {
	if o.Repeat > 0 {
		return o.Repeat
	}
	return max(c.Rounds, 1)
}

// armLine is one arm's progress line when stderr is not a terminal.
func armLine(c Cell, a Arm, round int) string {
	name := c.Name() + " " + a.Policy
	if c.Rounds > 1 {
		name += fmt.Sprintf(" round %d", round)
	}
	if a.Mode == nil {
		return fmt.Sprintf("%s: not run: %s", name, a.Error)
	}
	return fmt.Sprintf("%s: %d requests, %d errors, TTFT p95 %.1f ms, %.1f s", name,
		a.Mode.Requests, a.Mode.Errors, a.Mode.TTFT.P95, a.WallS)
}

// newBar is the suite's one bar over arms on stderr, shown only on a terminal.
func newBar(o Options, total int) (*progressbar.ProgressBar, bool) {
	visible := !o.Quiet && isTerminal(o.Stderr)
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(o.Stderr),
		progressbar.OptionSetVisibility(visible),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(200*time.Millisecond),
	), visible
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
