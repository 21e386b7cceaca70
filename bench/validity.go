package bench

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/bench/loadgen"
	"github.com/prefixlb/prefixlb/bench/report"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Validity checks. Published router benchmarks have been invalid for want
// of them (Dynamo #11473 ran its KV arm without KV events; llm-d-inference-sim #259 hashed
// the whole prompt), so every arm of a comparison is checked and a failing arm is flagged in
// report.Mode.Flags and marked "!" in the table, never silently averaged in:
//
//   - same requests: the arm's RequestsDigest equals the first arm's at the same rate;
//   - cache hits: where the workload reuses prefixes, the replicas reported cached tokens;
//   - no errors: every request of the arm succeeded.

// RequestsDigest is the digest of what one arm was sent: the xxhash64 of every request's
// (conversation, turn, xxhash of the exact body bytes), in (conversation, turn) order, then of
// the open-loop arrival schedule (each conversation in start order with its due offset in ns).
// "Same order" is thus each conversation's turn order plus the arrival schedule: in a closed
// loop which conversation a free user takes next depends on reply timing, so the order of
// conversations across the run legitimately differs between arms, while each conversation's
// turns are sent in order and each body carries the replies actually received. Replies from
// the sims are deterministic, so arms on sims match; replies sampled by external replicas
// differ between arms, and then so do later turns' bodies and the digest. Returned as 16 hex
// digits.
func RequestsDigest(out *loadgen.Outcome) string {
	type sent struct {
		conv, turn int
		hash       uint64
	}
	reqs := make([]sent, 0, len(out.Results))
	for _, r := range out.Results {
		reqs = append(reqs, sent{r.Conversation, r.Turn, r.BodyHash})
	}
	slices.SortFunc(reqs, func(a, b sent) int {
		return cmp.Or(cmp.Compare(a.conv, b.conv), cmp.Compare(a.turn, b.turn))
	})
	d := xxhash.New()
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		_, _ = d.Write(b[:])
	}
	put(uint64(len(reqs))) // length prefixes keep the two parts apart
	for _, r := range reqs {
		put(uint64(r.conv))
		put(uint64(r.turn))
		put(r.hash)
	}
	put(uint64(len(out.Schedule)))
	for _, a := range out.Schedule {
		put(uint64(a.Conversation))
		put(uint64(a.At))
	}
	return fmt.Sprintf("%016x", d.Sum64())
}

// FirstTurnsDigest is RequestsDigest over the conversations' first turns and the arrival
// schedule only: the digest of a multi-tenant overload arm, whose later chat turns carry the
// replies actually received, and under overload which turns got a reply (and which expired or
// were refused) is what the arms differ in.
func FirstTurnsDigest(out *loadgen.Outcome) string {
	first := &loadgen.Outcome{Schedule: out.Schedule}
	for _, r := range out.Results {
		if r.Turn == 0 {
			first.Results = append(first.Results, r)
		}
	}
	return RequestsDigest(first)
}

// hasReuse reports whether a workload's requests share prefixes that a replica's KV cache
// can hold: a conversation of two or more turns (each turn resends the history), a system
// prompt shared by two conversations, or a trace whose infinite-cache oracle ratio is above 0
// (mooncake's hash_ids). A workload with none of these (e.g. shared-prefix with
// --system-tokens 0) is not checked for cache hits.
func hasReuse(w *workload.Workload) bool {
	if w.Oracle != nil && w.Oracle.InfiniteRatio > 0 {
		return true
	}
	systems := map[string]bool{}
	for _, c := range w.Conversations {
		if len(c.Turns) > 1 {
			return true
		}
		if c.System != "" {
			if systems[c.System] {
				return true
			}
			systems[c.System] = true
		}
	}
	return false
}

// BurstITLShare and BurstCPUShare: an arm on simulated replicas whose ITL p50 is below
// BurstITLShare of the sims' shortest step (StepBase ÷ speedup, wall) while the bench process
// used at least BurstCPUShare of the machine's cores is flagged. No sim emits two tokens of
// one request less than a step apart, so a client that receives most of them closer than half
// a step got them in bursts. With the cores busy that means the sims, the proxy and the load
// generator ran short of CPU and the stream backed up, so every latency measures the machine,
// not the routing (OASST at 32 conversations/s and --speedup 8 on 2 cores does this; at 2×
// it does not). On an idle machine bursts are the sims' own pacing, a step shorter than a
// timer wake-up, which they catch up on in model time (maxCatchUp), and TTFT is unharmed
// (agentic sessions at 16×); and a busy machine need not burst (shared-prefix at 25 req/s and
// 8×). So neither sign alone is the flag.
const (
	BurstITLShare = 0.5
	BurstCPUShare = 0.5
)

// MaxStallShare: an arm whose simulated replicas lost more than this share of their model
// time to the bench machine (report.Mode.ReplicaStallShare, sim.Replica.Stalled) is flagged:
// a twentieth of the engines' time spent waiting for a CPU measures the machine. Three busy
// loops on this project's 2-core VM cost the sims 1.3% on Mooncake light and left its p95 as
// it was (one run, `bench suite --cells mooncake/light --policies prefix,oracle --rounds 1`);
// a quiet machine loses at most 0.2% (the overload suite's cells, 4 rounds). Checked where the
// burst check is (simMinStep > 0): tests that allow bursts run the sims at 20× under -race,
// where a 20 ms wait for a CPU is 400 ms of model time, and count requests, not latencies.
const MaxStallShare = 0.05

// minBurstGaps is the fewest inter-token gaps an arm needs for the burst check: a handful of
// gaps (mostly one-token replies) says nothing about the stream.
const minBurstGaps = 100

// simMinStep is the shortest step of the arms' sims in wall time, the burst check's yardstick;
// 0 (not checked) with external replicas or a target, whose steps are unknown, or when the
// options allow bursts.
func simMinStep(o Options, cfg sim.Config) time.Duration {
	if len(o.Backends) > 0 || o.Target != "" || o.AllowBursts || o.Speedup <= 0 {
		return 0
	}
	return time.Duration(float64(cfg.StepBase) / o.Speedup)
}

// checkValidity appends to each mode's Flags the checks it fails. Modes are compared for
// RequestsDigest with the first mode of the same Rate (arms at different rates have different
// schedules). reuse says whether the workload reuses prefixes (hasReuse), so that an arm whose
// replicas reported no cached tokens is flagged. minStep is the sims' shortest step in wall
// time (simMinStep; 0: not checked) and cpus the machine's cores: an arm with at least
// minBurstGaps inter-token gaps whose ITL p50 is under BurstITLShare of minStep while the bench
// used at least BurstCPUShare of cpus (or an unknown share) is flagged.
func checkValidity(modes []report.Mode, reuse bool, minStep time.Duration, cpus int) {
	first := map[float64]int{} // rate → index of its first mode
	for i := range modes {
		m := &modes[i]
		failed := m.Errors
		if len(m.Tenants) > 0 {
			failed -= m.Refused + m.Expired // a multi-tenant arm's clients give up and get refused by design
		}
		if failed > 0 {
			m.Flags = append(m.Flags, fmt.Sprintf("errors: %d of %d requests failed", failed, m.Requests))
		}
		if j, ok := first[m.Rate]; !ok {
			first[m.Rate] = i
		} else if ref := modes[j]; m.RequestsDigest != ref.RequestsDigest {
			m.Flags = append(m.Flags, fmt.Sprintf("requests differ from %s's (digest %s, not %s)", ref.Mode, m.RequestsDigest, ref.RequestsDigest))
		}
		if reuse && m.Requests > m.Errors && m.ReplicaCachedTokens == 0 {
			m.Flags = append(m.Flags, "no cache hits: the replicas reported 0 cached tokens on a workload that reuses prefixes")
		}
		if minStep > 0 && m.ReplicaStallShare > MaxStallShare {
			m.Flags = append(m.Flags, fmt.Sprintf("bench machine short of CPU: the simulated replicas lost %.1f%% of their time waiting for it (over %.0f%%); run the bench with nothing else on the machine", 100*m.ReplicaStallShare, 100*MaxStallShare))
		}
		if minStep > 0 && m.OtherCores > MaxOtherShare*float64(cpus) {
			m.Flags = append(m.Flags, fmt.Sprintf("bench machine shared: other processes used %.2f of %d cores during the arm (over %.0f%%); run the bench with nothing else on the machine", m.OtherCores, cpus, 100*MaxOtherShare))
		}
		busy := m.BenchCores == 0 || m.BenchCores >= BurstCPUShare*float64(cpus)
		if step := float64(minStep) / float64(time.Millisecond); step > 0 && busy && m.ITL.Count >= minBurstGaps && m.ITL.P50 < BurstITLShare*step {
			m.Flags = append(m.Flags, fmt.Sprintf("bench machine short of CPU: tokens came in bursts (ITL p50 %.3f ms, a sim step is at least %.2f ms) with the bench using %.2f of %d cores; lower --speedup or the load", m.ITL.P50, step, m.BenchCores, cpus))
		}
	}
}

// validityLines describes the checks under the table: one line per flagged arm, or one line
// saying every arm passed. cachedSource names where ReplicaCachedTokens came from.
func validityLines(modes []report.Mode, reuse bool, cachedSource string, minStep time.Duration) []string {
	var out []string
	for _, m := range modes {
		if len(m.Flags) > 0 {
			out = append(out, fmt.Sprintf("Flagged %s%s: %s.", m.Mode, rateSuffix(m.Rate), strings.Join(m.Flags, "; ")))
		}
	}
	if len(out) > 0 {
		return append([]string{"Validity: arms marked ! failed a check; their numbers are not comparable as they are."}, out...)
	}
	hits := "the workload has no prefix reuse, so cache hits were not checked"
	if reuse {
		hits = "every arm's replicas reported cache hits (" + cachedSource + ")"
	}
	atRate := ""
	if slices.ContainsFunc(modes, func(m report.Mode) bool { return m.Rate != 0 }) {
		atRate = " at its rate"
	}
	bursts := ""
	if minStep > 0 {
		bursts = fmt.Sprintf(", no arm's tokens came in bursts on a busy bench machine, no arm's sims lost over %.0f%% of their time to it (it kept up), other processes used at most %.0f%% of its cores during each arm", 100*MaxStallShare, 100*MaxOtherShare)
	}
	return []string{fmt.Sprintf("Validity: every arm got the same requests as the first arm%s (request digest), no request failed%s, and %s.", atRate, bursts, hits)}
}

// rateSuffix is " @ RATE" for a swept rate, "" otherwise.
func rateSuffix(rate float64) string {
	if rate == 0 {
		return ""
	}
	return fmt.Sprintf(" @ %g", rate)
}
