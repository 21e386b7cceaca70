package suite

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Workloads are the suite's workloads in scoreboard order.
var Workloads = []string{"multi-turn", "shared-prefix", "agentic", "mooncake", "oasst"}

// Sizes and load levels per workload. Arms run at bench.DefaultSpeedup (8× model time) unless
// a workload or level says otherwise (agentic 16×, four cells 2×: SlowSpeedup)
// on bench's default 4 simulated replicas; rates are in model time, as the workloads take
// them. The wall times below are one arm's, measured on this machine with `prefixlb bench
// compare` (round-robin and prefix) at these sizes. With 9 policies and every cell at 8× in one
// round the full suite took ≈37 minutes; the 10th policy, the 2× cells and the 3-round cells
// (each with its measurement below) brought it to 1h12m (eae6d50, 10 policies, 2 shared
// cores), and --quick to ≈4 minutes.
const (
	// Multi-turn (closed loop, one level): bench compare's defaults, 11 conversations × 30
	// turns = 330 requests, 4 users; ≈23 s an arm. Quick: 6 × 10 = 60 requests (4.5 s).
	MultiTurnConversations      = bench.DefaultConversations
	MultiTurnTurns              = bench.DefaultTurns
	QuickMultiTurnConversations = 6
	QuickMultiTurnTurns         = 10

	// Shared-prefix (open loop): llm-d's full 32 groups × 32 prompts = 1024 requests. On 256
	// requests (8 × 32) TTFT p95 was 19.0 / 19.3 / 36.3 / 132 ms (round-robin) at 10 / 20 /
	// 40 / 80 req/s, and 80 req/s delivered only ≈39 req/s: 4 sims saturate near 40. Light is
	// 10 (p95 = unloaded), medium 25, near-saturation 40 (round-robin's p95 doubled).
	SharedPrefixGroups      = 32
	SharedPrefixPrompts     = 32
	SharedPrefixLight       = 10.0
	SharedPrefixMedium      = 25.0
	SharedPrefixNearSat     = 40.0
	QuickSharedPrefixGroups = 8
	// QuickSharedPrefixPrompts: 8 × 16 = 128 requests at the medium rate, 0.9 s an arm.
	QuickSharedPrefixPrompts = 16

	// Agentic (open loop, sessions/s): coding-agent sessions over a context growing to ~100k
	// tokens, think time median ~10 s (issue 14 item 3), at the workload's default median of
	// bench.DefaultAgenticRequests (16) requests per session: a session lasts ≈16 × 13 s ≈
	// 210 s of model time, the longest about twice that, whatever the rate. Each level sends
	// sessions for AgenticArrivalSpanS seconds (rate × span sessions): an arm takes ≈ (120 +
	// 450) s ÷ 16 ≈ 36 s. bench compare's default (12 sessions at 0.1/s, 8×) queued: round-robin
	// p95 1.5 s against prefix 0.27 s. So light 0.05 (6 sessions), medium 0.1 (12, that
	// default's density), near saturation 0.2 (24 sessions, ≈20 in flight: ~1M tokens of
	// context against 4 × 432k of KV cache). Quick: 5 sessions of a median 6 requests at 0.2/s:
	// 43 requests with one sub-agent fork (seed 1; 3 sessions of 5 had none, and their p95 was
	// the cold prefill under every policy), sessions overlapping enough that placement matters
	// (TTFT p95 426 ms oracle, 464–563 ms prefix and the affinity peers, 807 ms round-robin;
	// ≈14 s an arm, 126 s for the cell's 9 arms then, ≈140 s for 10).
	AgenticArrivalSpanS  = 120
	AgenticMinSessions   = 2
	AgenticLight         = 0.05
	AgenticMedium        = 0.1
	AgenticNearSat       = 0.2
	QuickAgenticSessions = 5
	QuickAgenticRequests = 6
	QuickAgenticRate     = 0.2
	// AgenticSpeedup: agentic prefills are long (a 2k-token tool result on a 50k-token context
	// is ≈0.25 s of model time, a cold 17k-token system prompt ≈1.2 s), so at 16× a prefill is
	// still ≥15 ms wall, above a busy machine's scheduling noise, and the 9-minute sessions
	// take half the wall time they take at bench's default 8×.
	AgenticSpeedup = 16

	// Mooncake (open loop, the trace's own arrivals; load = --time-scale): the trace's first
	// 200 requests, at bench's default 8× (at 16× the same 200 requests gave p95s 30–60% off
	// in model time and prefix and round-robin swapped order: too fast for this trace's long
	// prefills). 4 sims are past saturation at the trace's own rate on 400 requests (p95 2.5 s
	// wall = 20 s model) and still queue at time-scale 4 (p50 ≈ 3× an unloaded prefill), so
	// light, medium and near saturation are time-scale 3, 1.5 and 1: ≈29 / 16 / 11 s an arm
	// (200 requests at time-scale 2 took 20.5 s). Quick: 100 requests at time-scale 1.5 (9.8 s).
	MooncakeCount      = 200
	MooncakeLight      = 3.0
	MooncakeMedium     = 1.5
	MooncakeNearSat    = 1.0
	QuickMooncakeCount = 100

	// OASST (open loop, conversations/s): 300 of the 626 OpenAssistant threads (573
	// requests). The levels were chosen at 8×, where round-robin's TTFT p95 read 5.3 / 10.4 /
	// 52.5 ms at 4 / 32 / 64 conversations/s; that growth was the bench machine running out of
	// CPU, not the sims loading (see SlowSpeedup): medium and near saturation now run at 2×
	// (≈7 s an arm; light at 8×, ≈12 s), where round-robin read p95 19.5 and 21.4 ms wall, and
	// the names are the rates' order, not the sims' load. Quick: 100 threads at 32, at 2×.
	OASSTConversations      = 300
	OASSTLight              = 4.0
	OASSTMedium             = 32.0
	OASSTNearSat            = 64.0
	QuickOASSTConversations = 100
)

// Cells where one arm at bench's default 8× measured the bench machine rather than the
// routing. The sims, the proxy and the load generator share 2 cores; past ≈200 requests/s or
// ≈50k streamed tokens/s of wall time the stream backs up and tokens come in bursts (bench
// flags such arms: BurstITLShare). At 8×, OASST at 32 and 64 conversations/s (≈300
// requests/s wall) read ITL p50 0.01 ms against a 0.75 ms step, TTFT p95 spread 10–60 and
// 48–145 ms over five rounds of one binary, and round-robin's 19 ms wall were 150 ms of model
// time, where at 2× the same 64/s read 22 ms wall = 45 ms model (37 ms at 1×, ITL 3.7 ms against
// a 3 ms step). Shared-prefix at 40 req/s read ITL 0.0 at 8×; at 2× 7.8 ms. So:
//   - SlowSpeedup (2×) for those three cells, and for shared-prefix at 25 req/s (≈200
//     requests/s wall): at 8× its ITL p50 first read 0.78–0.96 ms against the 0.75 ms step
//     over 3 rounds of 4 policies, but two full suites on 288895d flagged a round of 4 and 5
//     of its 10 arms (ITL p50 0.003–0.29 ms), the second on a quiet machine, and its p95
//     spread 18–510 ms over the rounds of one arm. Their arms last ≈7–25 s instead of 2–4.
//   - ShortArmRounds interleaved rounds, scored by each arm's median (Combine), for the cells
//     whose arms are still shortest: OASST medium and near saturation, shared-prefix medium,
//     and Mooncake near saturation (11 s arms past saturation, where one round's p95 is
//     chaotic: the oracle read 643 ms wall at 8× in one run and 1652 at 4× in the next, prefix
//     1497 and 1415), and cells where one round was not a verdict: Mooncake medium (prefix
//     p95 read 646, 682 and 1455 ms in three single rounds of one routing code; its
//     200-request p95 is the 10th-worst request), Mooncake light (the same 10th-worst request:
//     prefix ÷ oracle read 1.15, 0.95, 1.00, 1.02 and 1.13 in the single rounds of five full
//     suites, routing changes between them below that spread) and OASST light (9 s arms: in
//     one full suite least-load, prefix and prefix×3 read p50 3.4–4.0 ms where the other arms
//     read 2.1–2.5; a rerun of the same binary minutes later read 2.1–2.4, prefix p95 10.4
//     against 4.3). These add ≈19 minutes (Mooncake light ≈10 of them). And multi-turn and
//     shared-prefix light, whose p95 sits at 4 and 9 ms wall where one round's verdict
//     against a peer was noise: on 3c507cd's single rounds sglang read 3.2 against prefix's
//     4.2 ms on multi-turn and 7.6 against 9.0 on shared-prefix light; 3 rounds of the same
//     code (2026-12-05) read prefix 4.6 (4.3–4.7), sglang 4.4 (4.0–5.5), llm-d 4.3
//     (4.1–4.7), with all three placing the 11 conversations 3/3/3/2 and never moving one, and on shared-prefix light prefix 8.4 (8.0–9.5) against
//     sglang 9.0 (7.5–9.3). These add ≈12 minutes.
//
// OASST's short prompts hardly load 4 sims at any of its rates: at 1× its p95 was 37 ms at 64,
// 128 and 256 conversations/s (the threads' think times, not the arrival rate, set the request
// rate, ≈45 requests/s). Its cells test that routing costs nothing where caching gains little.
const (
	SlowSpeedup    = 2
	ShortArmRounds = 3
)

// level is one load level of a workload: its name, the value of its load knob, how many
// rounds the full suite runs it (0: one) and its speedup (0: the plan's).
type level struct {
	name    string
	load    float64 // requests, conversations or sessions per second; mooncake: time scale
	rounds  int
	speedup float64
}

// plan is one workload's place in the suite.
type plan struct {
	name string
	// shared is the data file under the shared directory the workload needs ("" none).
	shared string
	full   []level
	quick  *level // nil: not in --quick
	// speedup is the arms' bench.Options.Speedup (0: bench.DefaultSpeedup).
	speedup float64
	// flags are the workload's sizes and load for one level.
	flags func(quick bool, l level) bench.WorkloadFlags
	// unit describes the load for the scoreboard.
	unit func(l level) string
}

func perSecond(unit string) func(level) string {
	return func(l level) string { return fmt.Sprintf("%g %s/s", l.load, unit) }
}

var plans = []plan{
	{name: "multi-turn", full: []level{{name: "closed", rounds: ShortArmRounds}}, quick: &level{name: "closed"},
		flags: func(q bool, _ level) bench.WorkloadFlags {
			if q {
				return bench.WorkloadFlags{Conversations: QuickMultiTurnConversations, Turns: QuickMultiTurnTurns}
			}
			return bench.WorkloadFlags{Conversations: MultiTurnConversations, Turns: MultiTurnTurns}
		},
		unit: func(level) string { return fmt.Sprintf("%d users", bench.DefaultUsers) }},
	{name: "shared-prefix",
		full:  []level{{name: "light", load: SharedPrefixLight, rounds: ShortArmRounds}, {"medium", SharedPrefixMedium, ShortArmRounds, SlowSpeedup}, {"near-saturation", SharedPrefixNearSat, 1, SlowSpeedup}},
		quick: &level{name: "medium", load: SharedPrefixMedium},
		flags: func(q bool, l level) bench.WorkloadFlags {
			if q {
				return bench.WorkloadFlags{Groups: QuickSharedPrefixGroups, PromptsPerGroup: QuickSharedPrefixPrompts, Rate: l.load}
			}
			return bench.WorkloadFlags{Groups: SharedPrefixGroups, PromptsPerGroup: SharedPrefixPrompts, Rate: l.load}
		},
		unit: perSecond("req")},
	{name: "agentic",
		full:    []level{{name: "light", load: AgenticLight}, {name: "medium", load: AgenticMedium}, {name: "near-saturation", load: AgenticNearSat}},
		quick:   &level{name: "near-saturation", load: QuickAgenticRate},
		speedup: AgenticSpeedup,
		flags: func(q bool, l level) bench.WorkloadFlags {
			if q {
				return bench.WorkloadFlags{Conversations: QuickAgenticSessions, Turns: QuickAgenticRequests, Rate: l.load}
			}
			return bench.WorkloadFlags{Conversations: max(AgenticMinSessions, int(math.Round(l.load*AgenticArrivalSpanS))), Rate: l.load}
		},
		unit: perSecond("sessions")},
	{name: "mooncake", shared: workload.MooncakeTrace,
		full:  []level{{"light", MooncakeLight, ShortArmRounds, 0}, {"medium", MooncakeMedium, ShortArmRounds, 0}, {"near-saturation", MooncakeNearSat, ShortArmRounds, 0}},
		quick: &level{name: "medium", load: MooncakeMedium},
		flags: func(q bool, l level) bench.WorkloadFlags {
			return bench.WorkloadFlags{Count: pick(q, QuickMooncakeCount, MooncakeCount), TimeScale: l.load}
		},
		unit: func(l level) string { return fmt.Sprintf("trace arrivals × time-scale %g", l.load) }},
	{name: "oasst", shared: workload.OASSTThreads,
		full:  []level{{"light", OASSTLight, ShortArmRounds, 0}, {"medium", OASSTMedium, ShortArmRounds, SlowSpeedup}, {"near-saturation", OASSTNearSat, ShortArmRounds, SlowSpeedup}},
		quick: &level{name: "medium", load: OASSTMedium, speedup: SlowSpeedup},
		flags: func(q bool, l level) bench.WorkloadFlags {
			return bench.WorkloadFlags{Conversations: pick(q, QuickOASSTConversations, OASSTConversations), Rate: l.load}
		},
		unit: perSecond("conversations")},
}

func pick(quick bool, q, full int) int {
	if quick {
		return q
	}
	return full
}

// Plan returns the suite's cells for the named workloads (nil: all), in Workloads order,
// and the workloads it must skip: those this build lacks and those whose data is not under
// the shared directory. The error names an unknown workload.
func Plan(quick bool, only []string) ([]Cell, []Skip, error) {
	for _, w := range only {
		if !slices.Contains(Workloads, w) {
			return nil, nil, fmt.Errorf("--workloads: unknown %q (want some of %s)", w, strings.Join(Workloads, ", "))
		}
	}
	var cells []Cell
	var skipped []Skip
	for _, p := range plans {
		if len(only) > 0 && !slices.Contains(only, p.name) {
			continue
		}
		if !slices.Contains(bench.Workloads, p.name) {
			skipped = append(skipped, Skip{p.name, "not in this build: bench has no such workload yet"})
			continue
		}
		if p.shared != "" {
			if path, err := workload.SharedFile(p.shared); err != nil {
				if !errors.Is(err, workload.ErrNoShared) {
					return nil, nil, err
				}
				skipped = append(skipped, Skip{p.name, "not found at " + path})
				continue
			}
		}
		levels := p.full
		if quick {
			if p.quick == nil {
				continue
			}
			levels = []level{*p.quick}
		}
		for _, l := range levels {
			o := bench.DefaultOptions()
			o.Workload = p.name
			o.Flags = p.flags(quick, l)
			if p.speedup > 0 {
				o.Speedup = p.speedup
			}
			if l.speedup > 0 {
				o.Speedup = l.speedup
			}
			c := Cell{Workload: p.name, Level: l.name, Load: p.unit(l), Rounds: max(l.rounds, 1), Options: o}
			if quick {
				c.Rounds = 1
			}
			if p.name != "mooncake" {
				c.Rate = o.Flags.Rate
			}
			cells = append(cells, c)
		}
	}
	return cells, skipped, nil
}

// Levels are the load levels' names, as --levels takes them.
var Levels = []string{"closed", "light", "medium", "near-saturation"}

// KeepLevels returns the cells at the named levels (nil: all), in order; the error names an
// unknown level. A repeated A/B of one load level then costs a third of its workload's cells.
func KeepLevels(cells []Cell, only []string) ([]Cell, error) {
	for _, l := range only {
		if !slices.Contains(Levels, l) {
			return nil, fmt.Errorf("--levels: unknown %q (want some of %s)", l, strings.Join(Levels, ", "))
		}
	}
	if len(only) == 0 {
		return cells, nil
	}
	var out []Cell
	for _, c := range cells {
		if slices.Contains(only, c.Level) {
			out = append(out, c)
		}
	}
	return out, nil
}
