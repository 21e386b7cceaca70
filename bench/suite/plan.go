package suite

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/bench"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Workloads are the suite's workloads in scoreboard order.
var Workloads = []string{"multi-turn", "shared-prefix", "agentic", "mooncake", "oasst"}

// OptInWorkloads run only when --workloads names them, or a --cells pattern names them
// literally ("overload/fair*"): not in the default suite, nor matched by a wildcard workload.
// overload's cells are judged per tenant and against issue 56's flow-control targets
// (flowtargets.go) and need the flow-control arms, which the default policies do not hold:
// `bench suite --workloads overload --policies round-robin,prefix,prefix+fc,llm-d-fc,oracle`.
var OptInWorkloads = []string{"overload"}

// Sizes and load levels per workload. Arms run at bench.DefaultSpeedup (8× model time) unless
// a workload or level says otherwise (agentic 16×, four cells 2×: SlowSpeedup) on bench's
// default 4 simulated replicas; rates are in model time, as the workloads take them. The
// levels were chosen with `prefixlb bench compare --workload W --rate R` (round-robin and
// prefix) at these sizes: light is about unloaded, near saturation where round-robin's TTFT
// p95 has doubled. The wall times are rough, for a shared 2-core machine; docs/bench.md has
// the suite's total.
const (
	// Multi-turn (closed loop, one level): bench compare's defaults, 11 conversations × 30
	// turns = 330 requests, 4 users; ≈20 s an arm. Quick: 6 × 10 = 60 requests.
	MultiTurnConversations      = bench.DefaultConversations
	MultiTurnTurns              = bench.DefaultTurns
	QuickMultiTurnConversations = 6
	QuickMultiTurnTurns         = 10

	// Shared-prefix (open loop): llm-d's full 32 groups × 32 prompts = 1024 requests. 4 sims
	// saturate near 40 req/s (80 offered delivers about 40). Light is 10 (p95 = unloaded),
	// medium 25, near-saturation 40 (round-robin's p95 doubled).
	SharedPrefixGroups      = 32
	SharedPrefixPrompts     = 32
	SharedPrefixLight       = 10.0
	SharedPrefixMedium      = 25.0
	SharedPrefixNearSat     = 40.0
	QuickSharedPrefixGroups = 8
	// QuickSharedPrefixPrompts: 8 × 16 = 128 requests at the medium rate, about a second an arm.
	QuickSharedPrefixPrompts = 16

	// Agentic (open loop, sessions/s): coding-agent sessions over a context growing to ~100k
	// tokens, think time median ~10 s (workload.DefaultAgentic), at the workload's default
	// median of bench.DefaultAgenticRequests (16) requests per session: a session lasts ≈16 ×
	// 13 s ≈ 210 s of model time, the longest about twice that, whatever the rate. Each level
	// sends sessions for AgenticArrivalSpanS seconds (rate × span sessions): an arm takes ≈
	// (120 + 450) s ÷ 16 ≈ 36 s. bench compare's default (12 sessions at 0.1/s) already
	// queues under round-robin. So light 0.05 (6 sessions), medium 0.1 (12, that default's
	// density), near saturation 0.2 (24 sessions, ≈20 in flight: ~1M tokens of context
	// against 4 × 432k of KV cache). Quick: 5 sessions of a median 6 requests at 0.2/s, whose
	// seed gives a sub-agent fork and sessions that overlap enough that placement matters.
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
	// 200 requests, at bench's default 8× (16× is too fast for this trace's long prefills:
	// model-time figures drift and arms swap order). 4 sims are past saturation at the
	// trace's own rate and still queue at time-scale 4, so light, medium and near saturation
	// are time-scale 3, 1.5 and 1: ≈30 / 15 / 10 s an arm. Quick: 100 requests at time-scale
	// 1.5.
	MooncakeCount      = 200
	MooncakeLight      = 3.0
	MooncakeMedium     = 1.5
	MooncakeNearSat    = 1.0
	QuickMooncakeCount = 100

	// OASST (open loop, conversations/s): 300 of the 626 OpenAssistant threads (573
	// requests). The levels were chosen at 8×, where round-robin's TTFT p95 grew with the
	// rate because the bench machine ran out of CPU, not because the sims loaded (see
	// SlowSpeedup): medium and near saturation run at 2×, and the names are the rates' order,
	// not the sims' load. Quick: 100 threads at 32, at 2×.
	OASSTConversations      = 300
	OASSTLight              = 4.0
	OASSTMedium             = 32.0
	OASSTNearSat            = 64.0
	QuickOASSTConversations = 100
)

// Cache pressure: one cell each for agentic sessions and the Mooncake trace whose replicas'
// KV caches hold a third of what the other cells give them, small
// against the working set, so that replicas evict what an approximate index still lists and
// where a request's prefix lives changes while it is routed. The share was chosen where the
// oracle's cached-token ratio drops clearly and every request still fits a replica:
//   - agentic at the medium rate (12 sessions at 0.1/s, 16×), 144k tokens per replica
//     instead of the sim's 432k: the oracle arm's cached-token ratio 0.923 → 0.676 (½: 0.873;
//     ¼, 108k, fails requests whose context outgrows a replica's cache);
//   - Mooncake's first MooncakePressureCount requests at the light time-scale (3, 8×), 667k
//     tokens per replica instead of 2M: the oracle arm's cached-token ratio 0.146 → 0.069,
//     the pooled LRU's over the window 0.164 → 0.085 (the 200-request window of the other cells
//     reuses 6% of its tokens at most, too little for eviction to matter). At the medium
//     time-scale (1.5) the 500 requests queue for tens of seconds of model time (oracle TTFT
//     p95 7.4 s wall) and round-robin's p95 was 0.74× the oracle's: a queueing cell, not a
//     cache one. ≈65 s an arm.
//
// `prefixlb bench compare --workload agentic --rate 0.1 --speedup 16 --modes oracle
// --kv-tokens N` measures the agentic ratio at other sizes; for Mooncake the report's cache
// oracle line gives the pooled LRU's.
const (
	AgenticPressureKVTokens  int64 = 144_000 // the sim's 27,000 blocks × 16 tokens ÷ 3
	MooncakePressureKVTokens int64 = bench.MooncakeKVTokens / 3
	MooncakePressureCount          = 500
	// CachePressure is the cells' level name.
	CachePressure = "cache-pressure"
)

// Cells where one arm at bench's default 8× would measure the bench machine rather than the
// routing. The sims, the proxy and the load generator share 2 cores; past ≈200 requests/s or
// ≈50k streamed tokens/s of wall time the stream backs up and tokens come in bursts (bench
// flags such arms: BurstITLShare). So:
//   - SlowSpeedup (2×) for OASST medium and near saturation, shared-prefix medium and near
//     saturation (≈200 requests/s wall and more at 8×): their ITL collapses to bursts and
//     their p95 spreads widely between rounds of one binary at 8×. Their arms last ≈7–25 s
//     instead of 2–4.
//   - ShortArmRounds interleaved rounds in every cell, scored by each arm's median (Combine):
//     the targets are judged on the interval of each ratio over the rounds (Verdict), and one
//     round has none. The rounds matter most where arms are shortest (OASST medium and near
//     saturation, shared-prefix medium, Mooncake near saturation, where one round's p95 past
//     saturation is chaotic) and where one round is not a verdict: Mooncake medium and light
//     (the 200-request p95 is the 10th-worst request), OASST light (9 s arms), multi-turn and
//     shared-prefix light (p95 of a few ms wall, where one round against a peer is noise).
//     A closer verdict takes more rounds: run the cell again and merge (merge.go).
//
// The spread of one cell between rounds: `prefixlb bench suite --workloads W --levels L
// --repeat N` (docs/bench.md). OASST's short prompts hardly load 4 sims at any of its rates
// (the threads' think times, not the arrival rate, set the request rate): its cells test that
// routing costs nothing where caching gains little.
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
	// kvTokens is each simulated replica's KV-cache capacity (0: the workload's; the
	// cache-pressure cells) and count the requests of a trace window (0: the workload's).
	kvTokens int64
	count    int
	// mix is the overload workload's --load naming a mix (workload.FairLoad: "fair10x:0.4";
	// "": load is the three-tenant mix's multiple of the capacity) and tenants the tenants it
	// runs (nil: all).
	mix     string
	tenants []string
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
	// replicas is the arms' simulated replicas (0: bench's default 4).
	replicas int
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
		full: []level{{name: "light", load: SharedPrefixLight, rounds: ShortArmRounds}, {name: "medium", load: SharedPrefixMedium, rounds: ShortArmRounds, speedup: SlowSpeedup},
			{name: "near-saturation", load: SharedPrefixNearSat, rounds: ShortArmRounds, speedup: SlowSpeedup}},
		quick: &level{name: "medium", load: SharedPrefixMedium},
		flags: func(q bool, l level) bench.WorkloadFlags {
			if q {
				return bench.WorkloadFlags{Groups: QuickSharedPrefixGroups, PromptsPerGroup: QuickSharedPrefixPrompts, Rate: l.load}
			}
			return bench.WorkloadFlags{Groups: SharedPrefixGroups, PromptsPerGroup: SharedPrefixPrompts, Rate: l.load}
		},
		unit: perSecond("req")},
	{name: "agentic",
		full: []level{{name: "light", load: AgenticLight, rounds: ShortArmRounds}, {name: "medium", load: AgenticMedium, rounds: ShortArmRounds},
			{name: "near-saturation", load: AgenticNearSat, rounds: ShortArmRounds},
			{name: CachePressure, load: AgenticMedium, rounds: ShortArmRounds, kvTokens: AgenticPressureKVTokens}},
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
		full: []level{{name: "light", load: MooncakeLight, rounds: ShortArmRounds}, {name: "medium", load: MooncakeMedium, rounds: ShortArmRounds},
			{name: "near-saturation", load: MooncakeNearSat, rounds: ShortArmRounds},
			{name: CachePressure, load: MooncakeLight, rounds: ShortArmRounds, kvTokens: MooncakePressureKVTokens, count: MooncakePressureCount}},
		quick: &level{name: "medium", load: MooncakeMedium},
		flags: func(q bool, l level) bench.WorkloadFlags {
			n := MooncakeCount
			if l.count > 0 {
				n = l.count
			}
			return bench.WorkloadFlags{Count: pick(q, QuickMooncakeCount, n), TimeScale: l.load}
		},
		unit: func(l level) string { return fmt.Sprintf("trace arrivals × time-scale %g", l.load) }},
	{name: "oasst", shared: workload.OASSTThreads,
		full: []level{{name: "light", load: OASSTLight, rounds: ShortArmRounds}, {name: "medium", load: OASSTMedium, rounds: ShortArmRounds, speedup: SlowSpeedup},
			{name: "near-saturation", load: OASSTNearSat, rounds: ShortArmRounds, speedup: SlowSpeedup}},
		quick: &level{name: "medium", load: OASSTMedium, speedup: SlowSpeedup},
		flags: func(q bool, l level) bench.WorkloadFlags {
			return bench.WorkloadFlags{Conversations: pick(q, QuickOASSTConversations, OASSTConversations), Rate: l.load}
		},
		unit: perSecond("conversations")},
	// Overload (opt-in, OptInWorkloads): the three tenants (chat, noisy, batch) for 60 s of
	// model time on 2 replicas at 4×, the sizes of docs/bench.md's overload commands (an arm
	// ≈40 s): overload is 2× the fleet's capacity, light 0.5× (flow control on vs off must
	// not differ there). Then the fairness cells (fair.go): light alone, light with heavy at
	// 10× its rate, and the shares cell (overloadLevels).
	{name: "overload", replicas: 2, speedup: 4,
		full: overloadLevels,
		flags: func(_ bool, l level) bench.WorkloadFlags {
			if l.mix != "" {
				return bench.WorkloadFlags{Load: l.mix, Duration: FairDuration, Tenants: l.tenants}
			}
			return bench.WorkloadFlags{Load: fmt.Sprintf("%g", l.load)}
		},
		unit: func(l level) string {
			switch {
			case l.mix == "":
				return fmt.Sprintf("%g × the fleet's capacity", l.load)
			case len(l.tenants) > 0:
				return fmt.Sprintf("%s, %s alone", l.mix, strings.Join(l.tenants, ", "))
			}
			return l.mix
		}},
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
		if !slices.Contains(Workloads, w) && !slices.Contains(OptInWorkloads, w) {
			return nil, nil, fmt.Errorf("--workloads: unknown %q (want some of %s)", w, strings.Join(append(slices.Clone(Workloads), OptInWorkloads...), ", "))
		}
	}
	var cells []Cell
	var skipped []Skip
	for _, p := range plans {
		if len(only) > 0 && !slices.Contains(only, p.name) || len(only) == 0 && slices.Contains(OptInWorkloads, p.name) {
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
			if p.replicas > 0 {
				o.Replicas = p.replicas
			}
			if l.speedup > 0 {
				o.Speedup = l.speedup
			}
			if l.kvTokens > 0 {
				o.KVTokens = l.kvTokens
			}
			c := Cell{Workload: p.name, Level: l.name, Load: p.unit(l), Rounds: max(l.rounds, 1), Options: o}
			if l.kvTokens > 0 {
				c.Load += fmt.Sprintf("; KV cache %dk tokens per replica", (l.kvTokens+500)/1000)
			}
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
var Levels = []string{"closed", "light", "medium", "near-saturation", CachePressure, OverloadLevel, FairAloneLevel, FairLevel, FairSharesLevel}

// The overload workload's levels: OverloadLevel is the three-tenant mix at 2× the capacity;
// the fairness cells run the fair10x mix (workload/fair.go) for issue 56's fairness target.
// FairAloneLevel is its light tenant alone at FairLightP95 of the capacity, FairLevel light
// and heavy (10× light's rate) at that share, FairSharesLevel both at FairLightShares: light's
// p95 in the fair cell ÷ its p95 alone needs light below half the capacity, where a router
// that shares GPU work equally serves all light asks; the shares (Jain) need light above
// half, so that both stay backlogged under such a router (docs/bench.md).
const (
	OverloadLevel   = "overload"
	FairAloneLevel  = "fair-alone"
	FairLevel       = "fair"
	FairSharesLevel = "fair-shares"
	FairLightP95    = 0.4
	FairLightShares = 0.6
	// FairSpeedup and FairDuration: the fair10x mix at light 0.4 sends 67 requests/s of model
	// time on 2 replicas (0.6: 100), 2000-token prompts each; at 2× the load generator keeps
	// up on 2 shared cores (docs/bench.md's fair10x commands). 40 s of model time is 20 s of
	// arrivals at 2×, plus the clients' patience (10 s of model time) for the last ones: an arm
	// ≈25–30 s with the sims' start, and 242 light requests for its p95 (the 13th worst).
	FairSpeedup  = 2
	FairDuration = 40 * time.Second
)

// overloadLevels are the overload workload's cells, each in ShortArmRounds rounds: its
// targets are judged on intervals, which one round does not give.
var overloadLevels = []level{
	{name: OverloadLevel, load: workload.LoadPresets["overload"], rounds: ShortArmRounds},
	{name: "light", load: workload.LoadPresets["light"], rounds: ShortArmRounds},
	{name: FairAloneLevel, mix: fmt.Sprintf("%s:%g", workload.MixFair, FairLightP95), tenants: []string{"light"}, rounds: ShortArmRounds, speedup: FairSpeedup},
	{name: FairLevel, mix: fmt.Sprintf("%s:%g", workload.MixFair, FairLightP95), rounds: ShortArmRounds, speedup: FairSpeedup},
	{name: FairSharesLevel, mix: fmt.Sprintf("%s:%g", workload.MixFair, FairLightShares), rounds: ShortArmRounds, speedup: FairSpeedup},
}

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
