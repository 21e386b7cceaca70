package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Workloads the bench knows.
var Workloads = []string{"multi-turn", "shared-prefix", "agentic", "mooncake", "oasst", "mt-bench", "overload"}

// WorkloadFlags are the workload parameters a user can set. Zero values mean "the workload's
// default" (see the flag help).
type WorkloadFlags struct {
	Seed uint64
	// Common.
	Users        int
	Rate         float64
	ThinkMin     time.Duration
	ThinkMax     time.Duration
	OutputTokens int
	// multi-turn.
	Conversations  int
	Turns          int
	DocTokens      int
	QuestionTokens int
	// shared-prefix.
	Groups          int
	PromptsPerGroup int
	SystemTokens    int
	// mooncake.
	TracePath string
	TimeScale float64
	Window    string
	Count     int
	MaxOutput int
	// oasst, mt-bench.
	DatasetPath string
	// overload: Load is a preset of workload.LoadPresets, a multiple of the fleet's capacity,
	// or fair10x[:S] (the light and heavy tenants, workload.FairLoad); Duration the arrival
	// window (model time); Tenants the tenants to run.
	Load     string
	Duration time.Duration
	Tenants  []string

	thinkSet bool // ThinkMin/ThinkMax were given
}

// validate rejects negative values: zero means "the default", a negative number is a mistake
// (a negative --count would otherwise replay the whole trace for an hour).
func (f WorkloadFlags) validate() error {
	for _, c := range []struct {
		name string
		v    float64
	}{
		{"--users", float64(f.Users)}, {"--rate", f.Rate}, {"--output-tokens", float64(f.OutputTokens)},
		{"--conversations", float64(f.Conversations)}, {"--turns", float64(f.Turns)},
		{"--doc-tokens", float64(f.DocTokens)}, {"--question-tokens", float64(f.QuestionTokens)},
		{"--groups", float64(f.Groups)}, {"--prompts-per-group", float64(f.PromptsPerGroup)},
		{"--system-tokens", float64(f.SystemTokens)}, {"--time-scale", f.TimeScale},
		{"--count", float64(f.Count)}, {"--max-output", float64(f.MaxOutput)},
		{"--think-min", float64(f.ThinkMin)}, {"--think-max", float64(f.ThinkMax)},
		{"--duration", float64(f.Duration)},
	} {
		if c.v < 0 {
			return fmt.Errorf("%s must not be negative (0 means the default)", c.name)
		}
	}
	return nil
}

// Multi-turn defaults for `prefixlb bench compare` with no flags. They keep the public
// measurement's shape (11 conversations over ~4k-token documents, 150-token replies, 4 users,
// 0.5–2 s think time before every turn) and give each conversation 30 turns instead of 10; see
// DefaultTurns.
const (
	DefaultConversations = 11
	// DefaultTurns: in the 11×10 shape the first turns are 10% of the requests, and a first
	// turn is a cold 4k-token prefill under any router, so every mode's p95 TTFT is a cold
	// prefill (p95 of 110 requests is the 6th worst). At 30 turns the first turns are 3.3%
	// of the requests and p95 measures what routing controls: whether later turns find their
	// history cached on the replica they reach.
	DefaultTurns     = 30
	DefaultDocTokens = 4000
	DefaultUsers     = 4
	// DefaultSpeedup runs the simulated GPUs (and think times, and arrival gaps) 8× faster
	// than real time, so that the default comparison (3 × 330 requests) takes about a minute
	// on 2 cores. Much faster and a cold 4k-token prefill (≈230 ms of model time) shrinks
	// toward the scheduling noise of a busy machine.
	DefaultSpeedup = 8
	// Agentic defaults for `bench compare --workload agentic`: 12 sessions arriving at 0.1
	// sessions/s of model time (all started within about 2 minutes of model time, 15 s at
	// --speedup 8), so that about 12 sessions of up to ~120k tokens each are live at once on
	// 4 replicas of 432k KV-cache tokens: they fit when each session stays on one replica and
	// overflow the caches when every replica must hold every session (round-robin).
	DefaultAgenticSessions = 12
	DefaultAgenticRate     = 0.1
	// DefaultAgenticRequests is the median requests per session of the default run: 16, not
	// the published ~45 (workload.DefaultAgentic). A session lasts its requests × (think time
	// + reply), ≈45 × 13 s ≈ 10 min of model time at 45, and a run lasts as long as its longest
	// session (twice the median, more when it waits for a sub-agent), so three modes at
	// --speedup 8 would take over 10 minutes; at 16 the longest session of the default seed is
	// ≈9.5 min of model time (≈72 s at --speedup 8) and the contexts still grow to ~100k tokens
	// (larger tool results per request). --turns 45 gives the published shape.
	DefaultAgenticRequests = 16
	// DefaultMooncakeCount replays the trace's first 1000 requests (330 s of trace time).
	DefaultMooncakeCount = 1000
	// MooncakeKVTokens is the per-replica KV capacity for the Mooncake trace: 2M-token
	// replicas, as Mooncake served it from a large DRAM pool.
	MooncakeKVTokens = 2_000_000
)

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// BuildWorkload makes the named workload from the flags.
func BuildWorkload(name string, f WorkloadFlags, replicas int, kvTokens int64, maxModelLen int) (*workload.Workload, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	seed := or(f.Seed, 1)
	switch name {
	case "multi-turn":
		p := workload.PublicMultiTurn()
		p.Conversations = or(f.Conversations, DefaultConversations)
		p.Turns = or(f.Turns, DefaultTurns)
		p.DocTokens = or(f.DocTokens, DefaultDocTokens)
		p.QuestionTokens = or(f.QuestionTokens, p.QuestionTokens)
		p.OutputTokens = or(f.OutputTokens, p.OutputTokens)
		p.Users = or(f.Users, DefaultUsers)
		if f.thinkSet {
			p.ThinkMin, p.ThinkMax = f.ThinkMin, f.ThinkMax
		}
		p.Seed = seed
		if f.Rate > 0 {
			return nil, fmt.Errorf("multi-turn is closed-loop: use --users, not --rate")
		}
		return workload.MultiTurn(p)
	case "shared-prefix":
		p := workload.DefaultSharedPrefix()
		p.Groups = or(f.Groups, p.Groups)
		p.PromptsPerGroup = or(f.PromptsPerGroup, p.PromptsPerGroup)
		p.SystemTokens = or(f.SystemTokens, p.SystemTokens)
		p.QuestionTokens = or(f.QuestionTokens, p.QuestionTokens)
		p.OutputTokens = or(f.OutputTokens, p.OutputTokens)
		p.Rate = or(f.Rate, p.Rate)
		if f.Users > 0 && f.Rate == 0 {
			p.Rate, p.Users = 0, f.Users // closed loop when only --users is given
		}
		p.Seed = seed
		return workload.SharedPrefix(p)
	case "agentic":
		if f.Users > 0 {
			return nil, fmt.Errorf("agentic is open-loop: use --rate (sessions/s), not --users")
		}
		p := workload.DefaultAgentic()
		p.Sessions = or(f.Conversations, DefaultAgenticSessions)
		p.Rate = or(f.Rate, DefaultAgenticRate)
		p.Requests = or(f.Turns, DefaultAgenticRequests)
		p.PrefixTokens = or(f.SystemTokens, p.PrefixTokens)
		p.OutputTokens = or(f.OutputTokens, p.OutputTokens)
		p.MaxOutput = or(f.MaxOutput, p.MaxOutput)
		if f.thinkSet {
			p.ThinkMin, p.ThinkMax = f.ThinkMin, f.ThinkMax
		}
		if maxModelLen > 0 {
			p.MaxModelLen = maxModelLen
		}
		p.Seed = seed
		return workload.Agentic(p)
	case "mooncake":
		path := f.TracePath
		if path == "" {
			var err error
			if path, err = workload.SharedFile(workload.MooncakeTrace); err != nil {
				return nil, fmt.Errorf("mooncake: %w (or pass --trace)", err)
			}
		}
		rows, err := workload.LoadMooncake(path)
		if err != nil {
			return nil, err
		}
		p := workload.MooncakeParams{TimeScale: or(f.TimeScale, 1), MaxOutput: f.MaxOutput, Seed: seed, Count: f.Count}
		if f.Window != "" {
			if p.Start, p.Duration, err = parseWindow(f.Window); err != nil {
				return nil, err
			}
		}
		if p.Count == 0 && p.Duration == 0 {
			p.Count = DefaultMooncakeCount
		}
		if maxModelLen > 0 {
			rows = fitModelLen(rows, maxModelLen, p.MaxOutput)
		}
		w, err := workload.Mooncake(rows, p)
		if err != nil {
			return nil, err
		}
		o := workload.ComputeOracle(p.Window(rows), replicas, kvTokens)
		w.Oracle = &o
		w.Params["trace"] = path
		return w, nil
	case "overload":
		return buildOverload(f, replicas, seed)
	case "oasst", "mt-bench":
		p := workload.DefaultConversationParams()
		p.Conversations = f.Conversations
		p.OutputTokens = or(f.OutputTokens, p.OutputTokens)
		p.MaxOutput = or(f.MaxOutput, p.MaxOutput)
		p.Users = or(f.Users, p.Users)
		p.Rate = f.Rate
		if f.thinkSet {
			p.ThinkMin, p.ThinkMax = f.ThinkMin, f.ThinkMax
		}
		p.Seed = seed
		rel := workload.OASSTThreads
		if name == "mt-bench" {
			rel = workload.MTBench
		}
		path := f.DatasetPath
		if path == "" {
			var err error
			if path, err = workload.SharedFile(rel); err != nil {
				return nil, fmt.Errorf("%s: %w (or pass --dataset)", name, err)
			}
		}
		var w *workload.Workload
		if name == "oasst" {
			th, err := workload.LoadOASST(path)
			if err != nil {
				return nil, err
			}
			w, err = workload.OASST(th, p)
			if err != nil {
				return nil, err
			}
		} else {
			qs, err := workload.LoadMTBench(path)
			if err != nil {
				return nil, err
			}
			if w, err = workload.MTBenchWorkload(qs, p); err != nil {
				return nil, err
			}
		}
		w.Params["dataset"] = path
		return w, nil
	}
	return nil, fmt.Errorf("unknown workload %q (want one of %s)", name, strings.Join(Workloads, ", "))
}

// fitModelLen drops trace rows that a replica would refuse (prompt + output over the model
// length, with a margin for the chat template).
func fitModelLen(rows []workload.TraceRow, maxModelLen, maxOutput int) []workload.TraceRow {
	out := rows[:0:0]
	for _, r := range rows {
		o := r.OutputLength
		if maxOutput > 0 {
			o = min(o, maxOutput)
		}
		if r.InputLength+o+64 <= maxModelLen {
			out = append(out, r)
		}
	}
	return out
}

// parseWindow parses "start,duration" (Go durations or seconds) into trace offsets.
func parseWindow(s string) (start, dur time.Duration, err error) {
	a, b, ok := strings.Cut(s, ",")
	if !ok {
		return 0, 0, fmt.Errorf("--window %q: want start,duration (e.g. 0,600 or 10m,5m)", s)
	}
	if start, err = parseSeconds(a); err != nil {
		return 0, 0, fmt.Errorf("--window start: %w", err)
	}
	if dur, err = parseSeconds(b); err != nil {
		return 0, 0, fmt.Errorf("--window duration: %w", err)
	}
	if start < 0 || dur <= 0 {
		return 0, 0, fmt.Errorf("--window %q: start must be >= 0 and duration > 0", s)
	}
	return start, dur, nil
}

func parseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(v * float64(time.Second)), nil
	}
	return time.ParseDuration(s)
}

// buildOverload makes the overload workload for replicas simulated replicas: the rates come
// from the sims' default step-cost model (workload.OverloadTenants), also with --backends,
// where they are the model's, not a measurement of those replicas.
func buildOverload(f WorkloadFlags, replicas int, seed uint64) (*workload.Workload, error) {
	if f.Rate > 0 || f.Users > 0 {
		return nil, fmt.Errorf("overload sets its tenants' rates from the replicas' capacity: use --load (%s or a multiple of the capacity), not --rate or --users", loadPresetNames())
	}
	p := workload.DefaultOverload()
	p.Replicas, p.Seed, p.Tenants = replicas, seed, f.Tenants
	p.Duration = or(f.Duration, p.Duration)
	if load, fair, err := workload.FairLoad(f.Load); err != nil {
		return nil, err
	} else if fair {
		p.Mix, p.Load = workload.MixFair, load
	} else if f.Load != "" {
		if p.Load, err = parseLoad(f.Load); err != nil {
			return nil, err
		}
	}
	c := sim.DefaultConfig()
	p.Cost = workload.StepCost{StepBase: c.StepBase, PrefillPerToken: c.PrefillPerToken,
		PrefillPerTokenPerKContext: c.PrefillPerTokenPerKContext, DecodePerSeq: c.DecodePerSeq,
		DecodePerContextToken: c.DecodePerContextToken, BudgetTokens: c.MaxNumBatchedTokens}
	p.BlockSize = c.BlockSize
	return workload.Overload(p)
}

// parseLoad reads --load: a preset name or a number.
func parseLoad(s string) (float64, error) {
	if v, ok := workload.LoadPresets[s]; ok {
		return v, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0) {
		return 0, fmt.Errorf("--load %q: want %s, %s[:S] or a multiple of the fleet's capacity > 0", s, loadPresetNames(), workload.MixFair)
	}
	return v, nil
}

func loadPresetNames() string {
	var names []string
	for n, v := range workload.LoadPresets {
		names = append(names, fmt.Sprintf("%s (%g)", n, v))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// overloadNote describes the overload workload's tenants under the table: their marks, SLOs,
// patience, rates and the capacity arithmetic behind them.
func overloadNote(w *workload.Workload, speedup float64) string {
	var parts []string
	var offered float64
	for _, t := range w.Tenants {
		offered += t.Share
		parts = append(parts, fmt.Sprintf("%s (priority %d, fairness id %s, objective %s): %.2f req/s × %.1f ms = %.3f of the capacity, TTFT SLO %s, patience %s",
			t.Name, t.Priority, t.FairnessID, t.Objective, t.Rate, t.CostMs, t.Share, t.SLO, t.Patience))
	}
	return fmt.Sprintf("Tenants, in model time (rates × each request's GPU time on a saturated sim ÷ %v replicas; ÷ --speedup %g for wall time): %s; offered %.2f × the fleet's capacity. Arms without flow control ignore the tenants' marks; the flow-control arms classify them (note below).",
		w.Params["capacity_replicas"], speedup, strings.Join(parts, "; "), offered)
}
