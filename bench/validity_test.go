package bench

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/loadgen"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// TestRequestsDigest: the digest ignores completion order but sees every body, turn number
// and arrival of the schedule.
func TestRequestsDigest(t *testing.T) {
	res := func(conv, turn int, hash uint64) loadgen.Result {
		return loadgen.Result{Conversation: conv, Turn: turn, BodyHash: hash}
	}
	base := &loadgen.Outcome{Results: []loadgen.Result{res(0, 0, 10), res(1, 0, 20), res(0, 1, 11)},
		Schedule: []loadgen.Arrival{{Conversation: 0, At: 0}, {Conversation: 1, At: time.Second}}}
	want := RequestsDigest(base)
	if len(want) != 16 {
		t.Fatalf("digest %q, want 16 hex digits", want)
	}
	for _, c := range []struct {
		name string
		out  loadgen.Outcome
		same bool
	}{
		{"other completion order", loadgen.Outcome{Results: []loadgen.Result{res(0, 1, 11), res(0, 0, 10), res(1, 0, 20)}, Schedule: base.Schedule}, true},
		{"one body differs", loadgen.Outcome{Results: []loadgen.Result{res(0, 0, 10), res(1, 0, 21), res(0, 1, 11)}, Schedule: base.Schedule}, false},
		{"turns swapped", loadgen.Outcome{Results: []loadgen.Result{res(0, 1, 10), res(1, 0, 20), res(0, 0, 11)}, Schedule: base.Schedule}, false},
		{"a request missing", loadgen.Outcome{Results: []loadgen.Result{res(0, 0, 10), res(1, 0, 20)}, Schedule: base.Schedule}, false},
		{"arrival later", loadgen.Outcome{Results: base.Results, Schedule: []loadgen.Arrival{{Conversation: 0, At: 0}, {Conversation: 1, At: 2 * time.Second}}}, false},
		{"arrivals in another order", loadgen.Outcome{Results: base.Results, Schedule: []loadgen.Arrival{{Conversation: 1, At: time.Second}, {Conversation: 0, At: 0}}}, false},
		{"no schedule (closed loop)", loadgen.Outcome{Results: base.Results}, false},
	} {
		if got := RequestsDigest(&c.out); (got == want) != c.same {
			t.Errorf("%s: digest %s vs %s, want same=%v", c.name, got, want, c.same)
		}
	}
}

// TestCheckValidity: one scenario per check, on hand-made modes.
func TestCheckValidity(t *testing.T) {
	ok := func(name string, rate float64, digest string) report.Mode {
		return report.Mode{Mode: name, Rate: rate, Requests: 10, RequestsDigest: digest, ReplicaCachedTokens: 500}
	}
	for _, c := range []struct {
		name  string
		modes []report.Mode
		reuse bool
		want  [][]string // per mode, substrings its flags must contain in order (nil: no flag)
	}{
		{"all valid", []report.Mode{ok("round-robin", 0, "aa"), ok("prefix", 0, "aa")}, true, [][]string{nil, nil}},
		{"errors flagged", []report.Mode{ok("round-robin", 0, "aa"), func() report.Mode { m := ok("prefix", 0, "aa"); m.Errors = 3; return m }()},
			true, [][]string{nil, {"errors: 3 of 10"}}},
		{"digest differs from the first arm", []report.Mode{ok("round-robin", 0, "aa"), ok("prefix", 0, "bb"), ok("least-load", 0, "aa")},
			true, [][]string{nil, {"requests differ from round-robin's"}, nil}},
		{"each rate compared with its own first arm", []report.Mode{ok("round-robin", 5, "aa"), ok("prefix", 5, "aa"), ok("round-robin", 10, "cc"), ok("prefix", 10, "dd")},
			true, [][]string{nil, nil, nil, {"requests differ from round-robin's (digest dd, not cc)"}}},
		{"no cache hits on a workload with reuse", []report.Mode{ok("round-robin", 0, "aa"), func() report.Mode { m := ok("prefix", 0, "aa"); m.ReplicaCachedTokens = 0; return m }()},
			true, [][]string{nil, {"no cache hits"}}},
		{"no cache hits without reuse is fine", []report.Mode{func() report.Mode { m := ok("prefix", 0, "aa"); m.ReplicaCachedTokens = 0; return m }()},
			false, [][]string{nil}},
		{"every request failed: errors, not also no cache hits", []report.Mode{func() report.Mode {
			m := ok("prefix", 0, "aa")
			m.Errors, m.ReplicaCachedTokens = 10, 0
			return m
		}()}, true, [][]string{{"errors: 10 of 10"}}},
		{"tokens in bursts on a busy machine: short of CPU", []report.Mode{func() report.Mode {
			m := ok("round-robin", 0, "aa")
			m.ITL, m.BenchCores = report.Latency{P50: 0.8, Count: 100}, 1.9 // at the step: fine
			return m
		}(), func() report.Mode {
			m := ok("prefix", 0, "aa")
			m.ITL, m.BenchCores = report.Latency{P50: 0.01, Count: 100}, 1.2
			return m
		}(), func() report.Mode {
			m := ok("llm-d", 0, "aa")
			m.ITL, m.BenchCores = report.Latency{P50: 0.01, Count: 100}, 0.3 // idle machine: the sims' pacing
			return m
		}(), func() report.Mode {
			m := ok("dynamo", 0, "aa")
			m.ITL = report.Latency{P50: 0.01, Count: 100} // CPU not measured: flagged
			return m
		}(), func() report.Mode {
			m := ok("sglang", 0, "aa")
			m.ITL, m.BenchCores = report.Latency{P50: 0.01, Count: 99}, 1.9 // too few gaps to judge
			return m
		}(), ok("oracle", 0, "aa")}, // no tokens measured: not judged
			true, [][]string{nil, {"bench machine short of CPU: tokens came in bursts (ITL p50 0.010 ms, a sim step is at least 0.75 ms) with the bench using 1.20 of 2 cores"}, nil, {"short of CPU"}, nil, nil}},
		{"sims stalled by the machine", []report.Mode{func() report.Mode {
			m := ok("round-robin", 0, "aa")
			m.ReplicaStallShare = 0.013 // busy loops beside it: not flagged
			return m
		}(), func() report.Mode {
			m := ok("prefix", 0, "aa")
			m.ReplicaStallShare = 0.08
			return m
		}()}, true, [][]string{nil, {"simulated replicas lost 8.0% of their time"}}},
		{"other processes on the machine", []report.Mode{func() report.Mode {
			m := ok("round-robin", 0, "aa")
			m.OtherCores, m.StealCores = 0.05, 0.5 // the agent's shell; steal is recorded, not flagged
			return m
		}(), func() report.Mode {
			m := ok("prefix", 0, "aa")
			m.OtherCores = 1.4 // a test run beside the bench
			return m
		}()}, true, [][]string{nil, {"other processes used 1.40 of 2 cores"}}},
		{"several flags on one arm", []report.Mode{ok("round-robin", 0, "aa"), func() report.Mode {
			m := ok("prefix×3", 0, "bb")
			m.Errors, m.ReplicaCachedTokens = 1, 0
			return m
		}()}, true, [][]string{nil, {"errors: 1 of 10", "requests differ", "no cache hits"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			modes := slices.Clone(c.modes)
			checkValidity(modes, c.reuse, 750*time.Microsecond, 2) // StepBase 6 ms at --speedup 8, 2 cores
			for i, m := range modes {
				if len(m.Flags) != len(c.want[i]) {
					t.Fatalf("%s: flags %q, want %d matching %q", m.Mode, m.Flags, len(c.want[i]), c.want[i])
				}
				for j, sub := range c.want[i] {
					if !strings.Contains(m.Flags[j], sub) {
						t.Fatalf("%s: flag %d %q lacks %q", m.Mode, j, m.Flags[j], sub)
					}
				}
			}
			lines := validityLines(modes, c.reuse, "src", 750*time.Microsecond)
			flagged := slices.ContainsFunc(modes, func(m report.Mode) bool { return len(m.Flags) > 0 })
			if strings.HasPrefix(lines[0], "Validity: every arm") == flagged {
				t.Fatalf("flagged %v, lines %q", flagged, lines)
			}
			if !flagged && !strings.Contains(lines[0], "no arm's tokens came in bursts") {
				t.Fatalf("all-clear line does not mention the burst check: %q", lines[0])
			}
		})
	}
}

// TestStallCheckOffWithoutSims: the stall and contention checks run where the burst check
// does (a sims' step to judge by): not for tests that allow bursts, nor for external replicas.
func TestStallCheckOffWithoutSims(t *testing.T) {
	modes := []report.Mode{{Mode: "prefix", Requests: 10, RequestsDigest: "aa", ReplicaCachedTokens: 5, ReplicaStallShare: 0.5, OtherCores: 2}}
	checkValidity(modes, true, 0, 2)
	if len(modes[0].Flags) != 0 {
		t.Errorf("flags %q with no sim step to judge by", modes[0].Flags)
	}
}

// TestSimMinStep: the burst check's yardstick is the sims' StepBase ÷ speedup, and it is off
// for external replicas, a target and AllowBursts.
func TestSimMinStep(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.StepBase = 6 * time.Millisecond
	base := DefaultOptions()
	base.Speedup = 8
	for _, c := range []struct {
		name string
		edit func(*Options)
		want time.Duration
	}{
		{"sims at 8×", func(*Options) {}, 750 * time.Microsecond},
		{"sims at 2×", func(o *Options) { o.Speedup = 2 }, 3 * time.Millisecond},
		{"external backends", func(o *Options) { o.Backends = []string{"http://127.0.0.1:1"} }, 0},
		{"a target", func(o *Options) { o.Target = "http://127.0.0.1:1" }, 0},
		{"bursts allowed", func(o *Options) { o.AllowBursts = true }, 0},
	} {
		o := base
		c.edit(&o)
		if got := simMinStep(o, cfg); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestHasReuse: multi-turn conversations and shared system prompts reuse prefixes; distinct
// single-turn prompts do not.
func TestHasReuse(t *testing.T) {
	one := func(sys string) *workload.Conversation {
		return &workload.Conversation{System: sys, Turns: []workload.Turn{{User: "q"}}}
	}
	for _, c := range []struct {
		name string
		w    workload.Workload
		want bool
	}{
		{"distinct single turns", workload.Workload{Conversations: []*workload.Conversation{one("a"), one("b"), one("")}}, false},
		{"shared system prompt", workload.Workload{Conversations: []*workload.Conversation{one("a"), one("b"), one("a")}}, true},
		{"two turns", workload.Workload{Conversations: []*workload.Conversation{{Turns: []workload.Turn{{User: "q"}, {User: "r"}}}}}, true},
		{"trace with an oracle hit ratio", workload.Workload{Conversations: []*workload.Conversation{one("")}, Oracle: &workload.Oracle{InfiniteRatio: 0.4}}, true},
		{"trace without reuse", workload.Workload{Conversations: []*workload.Conversation{one("")}, Oracle: &workload.Oracle{}}, false},
	} {
		if got := hasReuse(&c.w); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
