// Package report turns load-generator results into the bench's numbers: latency percentiles
// (HdrHistogram, microsecond resolution), throughput, the backends' cached-token ratio and
// per-backend share; and renders them as a Markdown table, JSON and a TTFT CDF plot.
package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/prefixlb/prefixlb/bench/loadgen"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Histogram bounds: 1 µs to 1 hour at 3 significant digits.
const (
	histMinUs  = 1
	histMaxUs  = int64(time.Hour / time.Microsecond)
	histDigits = 3
)

// Latency holds one latency distribution's summary in milliseconds.
type Latency struct {
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	Mean  float64 `json:"mean_ms"`
	Max   float64 `json:"max_ms"`
	Count int64   `json:"count"`
}

// Median is the median of xs (the mean of the middle two for an even count; NaN for none).
// xs is not modified. The suite's rounds and the overhead harness's per-round p99s use it.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Recorder accumulates durations into an HDR histogram (µs) and an exact sum for the mean.
type Recorder struct {
	h   *hdrhistogram.Histogram
	sum float64 // µs
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{h: hdrhistogram.New(histMinUs, histMaxUs, histDigits)} }

// Record adds d (clamped to the histogram's range).
func (r *Recorder) Record(d time.Duration) {
	us := d.Microseconds()
	us = min(max(us, histMinUs), histMaxUs)
	_ = r.h.RecordValue(us)
	r.sum += float64(us)
}

// Summary returns the percentiles; percentile p is the smallest recorded value (within the
// histogram's 0.1% precision) at or below which p% of the values lie.
func (r *Recorder) Summary() Latency {
	n := r.h.TotalCount()
	if n == 0 {
		return Latency{}
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return Latency{P50: ms(r.h.ValueAtQuantile(50)), P90: ms(r.h.ValueAtQuantile(90)),
		P95: ms(r.h.ValueAtQuantile(95)), P99: ms(r.h.ValueAtQuantile(99)),
		Mean: r.sum / float64(n) / 1000, Max: ms(r.h.Max()), Count: n}
}

// Mode is one row of the comparison: one mode (or label) run over the workload.
type Mode struct {
	Mode string  `json:"mode"`
	TTFT Latency `json:"ttft"`
	ITL  Latency `json:"itl"`
	E2E  Latency `json:"e2e"`
	// BenchCores is the CPU the bench process used during the arm, in cores (CPU seconds ÷
	// wall seconds): with simulated replicas that is the sims, the proxies and the load
	// generator together. 0: not measured.
	BenchCores float64 `json:"bench_cores,omitempty"`
	// OtherCores is the CPU the machine's other processes used during the arm, in cores (the
	// machine's busy time from /proc/stat less the bench process's, ÷ wall seconds);
	// StealCores the time the hypervisor gave this machine's cores to other guests. The
	// bench's timing shares those cores: the contention check flags an arm whose OtherCores
	// is over bench.MaxOtherShare of the cores. 0: none, or not measured (not Linux).
	OtherCores float64 `json:"other_cores,omitempty"`
	StealCores float64 `json:"steal_cores,omitempty"`
	// SendLag is how late requests went out (loadgen.Result.SendLag), failed ones included.
	SendLag          Latency            `json:"send_lag"`
	Requests         int                `json:"requests"`
	Errors           int                `json:"errors"`
	RPS              float64            `json:"rps"`
	OutputTPS        float64            `json:"output_tps"`
	CachedTokenRatio float64            `json:"cached_token_ratio"`
	BackendShare     map[string]float64 `json:"backend_share"`
	// Extras.
	DurationS        float64        `json:"duration_s"`
	PromptTokens     int64          `json:"prompt_tokens"`
	CachedTokens     int64          `json:"cached_tokens"`
	OutputTokens     int64          `json:"output_tokens"`
	UsageMissing     int            `json:"usage_missing"`
	MaxShareOverMean float64        `json:"max_share_over_mean"`
	ErrorReasons     map[string]int `json:"error_reasons,omitempty"`
	// Routes counts prefixlb's routing reasons (x-prefixlb-route), when present.
	Routes map[string]int `json:"routes,omitempty"`
	// TTFTFirstTurn and TTFTLaterTurns split TTFT by turn (multi-turn workloads): first turns
	// are cold in every mode; later turns show what routing controls.
	TTFTFirstTurn  *Latency `json:"ttft_first_turn,omitempty"`
	TTFTLaterTurns *Latency `json:"ttft_later_turns,omitempty"`
	// TTFTMs are the successful requests' TTFTs, sorted, for the CDF plot.
	TTFTMs []float64 `json:"-"`

	// Rate is the arm's open-loop arrival rate when the comparison swept rates (--rates):
	// requests/s (shared-prefix), conversations/s (oasst, mt-bench), or a multiple of the
	// trace's own arrival rate (mooncake). 0: one run at the workload's own rate.
	Rate float64 `json:"rate,omitempty"`
	// RouterRequests counts, per router of the arm (in-process prefixlb replica, in start
	// order), the requests that router answered with an x-prefixlb-backend header; set when
	// the arm had more than one router.
	RouterRequests []int `json:"router_requests,omitempty"`
	// Validity checks (bench/validity.go). RequestsDigest is the xxhash digest of the
	// request bodies sent, per (conversation, turn), and of the open-loop arrival schedule;
	// arms that got the same requests have the same digest.
	RequestsDigest string `json:"requests_digest,omitempty"`
	// ReplicaCachedTokens is the prompt tokens the replicas found in their KV caches during
	// the arm: the sims' own prefix-cache hit counters (vllm:prefix_cache_hits), or with
	// external replicas the sum of the usage chunks' cached_tokens.
	ReplicaCachedTokens int64 `json:"replica_cached_tokens"`
	// Preemptions is how many running requests the simulated replicas preempted by recompute
	// for lack of KV blocks during the arm (their vllm:num_preemptions); 0 with external
	// replicas, which the bench does not read.
	Preemptions int64 `json:"preemptions,omitempty"`
	// ReplicaPrefillTokens is the tokens the simulated replicas computed in prefill steps
	// (uncached prompt tokens and preempted requests' recompute), whether or not the request
	// was then answered; ReplicaAborted the requests they dropped unfinished because the
	// client left. Together they show GPU work spent on requests nobody received. 0 with
	// external replicas.
	ReplicaPrefillTokens int64 `json:"replica_prefill_tokens,omitempty"`
	ReplicaAborted       int64 `json:"replica_aborted,omitempty"`
	// ReplicaStallShare is the model time the simulated replicas lost to the bench machine
	// (sim.Replica.Stalled, summed) over their model time during the arm (replicas × its
	// duration × speedup): 0 on a machine that keeps up; the stall check flags an arm above
	// MaxStallShare. 0 with external replicas.
	ReplicaStallShare float64 `json:"replica_stall_share,omitempty"`
	// Flags are the validity checks this arm failed (errors, different requests, no cache
	// hits where the workload reuses prefixes): its numbers are not comparable as they are.
	Flags []string `json:"flags,omitempty"`
	// Savings is what the arm's prefixlb replicas spent routing and saved in prefill, from
	// their /metrics at the end of the arm; nil when no prefixlb ran in-process (--target).
	Savings *Savings `json:"savings,omitempty"`
	// Refused and Expired count the requests among Errors that got HTTP 429/503 and that
	// their client gave up on before the first token (loadgen.Result.Class).
	Refused int `json:"refused,omitempty"`
	Expired int `json:"expired,omitempty"`
	// Tenants has a row per tenant of a multi-tenant workload (overload), and Fairness Jain's
	// index among tenants of equal priority (SummarizeTenants).
	Tenants  []Tenant   `json:"tenants,omitempty"`
	Fairness []Fairness `json:"fairness,omitempty"`
}

// Savings is "routing cost X, saved Y" for one arm, from its prefixlb replicas' /metrics,
// summed over them: the time they spent keying and picking, and the prefill the replicas'
// reported KV-cache hits spared at their learned prefill rates.
type Savings struct {
	// KeySeconds and PickSeconds are prefixlb_routing_seconds_total{stage="key"|"pick"}, and
	// RoutingSeconds their sum: CPU time on the request path, never sped up.
	KeySeconds     float64 `json:"key_seconds"`
	PickSeconds    float64 `json:"pick_seconds"`
	RoutingSeconds float64 `json:"routing_seconds"`
	// SavedPrefillSeconds is prefixlb_prefill_saved_seconds_total over the backends: the
	// reported cached tokens' prefill at each replica's learned rate (with sped-up sims, the
	// sims' wall seconds); CachedTokens is prefixlb_backend_cached_tokens_total over them.
	SavedPrefillSeconds float64 `json:"saved_prefill_seconds"`
	CachedTokens        int64   `json:"cached_tokens"`
	// Shadow: the arm ran a shadow policy (config shadow: prefix), whose estimate for itself
	// and for the mode in force are prefixlb_shadow_prefill_saved_seconds_total{choice}.
	Shadow                          bool    `json:"shadow,omitempty"`
	ShadowSavedPrefillSeconds       float64 `json:"shadow_saved_prefill_seconds,omitempty"`
	ShadowActualSavedPrefillSeconds float64 `json:"shadow_actual_saved_prefill_seconds,omitempty"`
	// Flow control (the arm's flow_control on): Queued is prefixlb_flow_queued_total, the
	// requests that waited in prefixlb's queue; QueueWaitSeconds the wall seconds those
	// placed from it waited (prefixlb_flow_queue_wait_seconds_sum{outcome="dispatched"}),
	// QueueDispatched how many they were; Refused is prefixlb_flow_refused_total over its
	// reasons (shed, expired, full...).
	Queued           int64   `json:"queued,omitempty"`
	QueueDispatched  int64   `json:"queue_dispatched,omitempty"`
	QueueWaitSeconds float64 `json:"queue_wait_seconds,omitempty"`
	Refused          int64   `json:"refused,omitempty"`
}

// FlowLine is the note under the table on what each flow-control arm held in its queue
// (empty when no arm queued or refused anything).
func FlowLine(modes []Mode) string {
	var parts []string
	for _, m := range modes {
		s := m.Savings
		if s == nil || s.Queued == 0 && s.Refused == 0 {
			continue
		}
		wait := "-"
		if s.QueueDispatched > 0 {
			wait = fms(s.QueueWaitSeconds / float64(s.QueueDispatched) * 1000)
		}
		parts = append(parts, fmt.Sprintf("%s queued %d of %d requests (%d placed from the queue, mean wait %s ms wall), refused %d",
			m.Mode, s.Queued, m.Requests, s.QueueDispatched, wait, s.Refused))
	}
	if len(parts) == 0 {
		return ""
	}
	return "Flow control (prefixlb_flow_*): " + strings.Join(parts, "; ") + "."
}

// Summarize computes a Mode from an outcome. backends lists the backends the proxy had, so a
// backend that served nothing shows a share of 0 (nil: only those seen).
func Summarize(mode string, out *loadgen.Outcome, backends []string) Mode {
	m := Mode{Mode: mode, Requests: len(out.Results), BackendShare: map[string]float64{}}
	ttft, itl, e2e, lag := NewRecorder(), NewRecorder(), NewRecorder(), NewRecorder()
	first, later := NewRecorder(), NewRecorder()
	counts := map[string]int{}
	for _, b := range backends {
		counts[b] = 0
	}
	ok, withBackend := 0, 0
	for i := range out.Results {
		r := &out.Results[i]
		lag.Record(r.SendLag)
		switch r.Class() {
		case loadgen.Refused:
			m.Refused++
		case loadgen.Expired:
			m.Expired++
		}
		if !r.OK() {
			m.Errors++
			if m.ErrorReasons == nil {
				m.ErrorReasons = map[string]int{}
			}
			m.ErrorReasons[r.Err]++
			continue
		}
		ok++
		ttft.Record(r.TTFT)
		if r.Turn == 0 {
			first.Record(r.TTFT)
		} else {
			later.Record(r.TTFT)
		}
		m.TTFTMs = append(m.TTFTMs, float64(r.TTFT.Microseconds())/1000)
		for _, g := range r.ITL {
			itl.Record(g)
		}
		e2e.Record(r.E2E)
		m.OutputTokens += int64(r.OutputTokens)
		if r.UsageSeen {
			m.PromptTokens += int64(r.PromptTokens)
			m.CachedTokens += int64(r.CachedTokens)
		} else {
			m.UsageMissing++
		}
		if r.Backend != "" {
			counts[r.Backend]++
			withBackend++
		}
		if r.Route != "" {
			if m.Routes == nil {
				m.Routes = map[string]int{}
			}
			reason, _, _ := strings.Cut(r.Route, ";")
			m.Routes[reason]++
		}
	}
	sort.Float64s(m.TTFTMs)
	m.TTFT, m.ITL, m.E2E, m.SendLag = ttft.Summary(), itl.Summary(), e2e.Summary(), lag.Summary()
	if later.h.TotalCount() > 0 {
		f, l := first.Summary(), later.Summary()
		m.TTFTFirstTurn, m.TTFTLaterTurns = &f, &l
	}
	m.DurationS = out.Duration().Seconds()
	if m.DurationS > 0 {
		m.RPS = float64(ok) / m.DurationS
		m.OutputTPS = float64(m.OutputTokens) / m.DurationS
	}
	if m.PromptTokens > 0 {
		m.CachedTokenRatio = float64(m.CachedTokens) / float64(m.PromptTokens)
	}
	if withBackend > 0 {
		maxShare := 0.0
		for b, c := range counts {
			s := float64(c) / float64(withBackend)
			m.BackendShare[b] = s
			maxShare = math.Max(maxShare, s)
		}
		m.MaxShareOverMean = maxShare * float64(len(counts))
	}
	return m
}

// Report is the whole comparison, as written to report.json.
type Report struct {
	Workload string         `json:"workload"`
	Params   map[string]any `json:"params,omitempty"`
	Replicas int            `json:"replicas,omitempty"`
	Speedup  float64        `json:"speedup,omitempty"`
	Target   string         `json:"target,omitempty"`
	Started  time.Time      `json:"started"`
	Modes    []Mode         `json:"modes"`
	// Oracle is the best cached-token ratio the trace allows (mooncake only).
	Oracle *workload.Oracle `json:"oracle,omitempty"`
	Notes  []string         `json:"notes,omitempty"`
}

// WriteJSON writes the report to path (indented).
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Table renders the side-by-side Markdown table, one row per mode. A mode that failed a
// validity check (Flags) is marked "!" after its name; a rate column appears when any mode
// has a Rate, a preemptions column when any mode's replicas preempted.
func Table(modes []Mode) string {
	rates := slices.ContainsFunc(modes, func(m Mode) bool { return m.Rate != 0 })
	preempted := slices.ContainsFunc(modes, func(m Mode) bool { return m.Preemptions != 0 })
	rateHead, rateAlign := "", ""
	if rates {
		rateHead, rateAlign = " rate |", "---:|"
	}
	preHead, preAlign := "", ""
	if preempted {
		preHead, preAlign = " preemptions |", "---:|"
	}
	var sb strings.Builder
	sb.WriteString("| mode |" + rateHead + " requests | errors | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | ITL p50 ms | E2E p95 ms | rps | out tok/s | cached-token ratio |" + preHead + " max share / mean | routing cost s | saved prefill s |\n")
	sb.WriteString("|---|" + rateAlign + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + preAlign + "---:|---:|---:|\n")
	for _, m := range modes {
		name := m.Mode
		if len(m.Flags) > 0 {
			name += " !"
		}
		if rates {
			name += fmt.Sprintf(" | %g", m.Rate)
		}
		share := "-"
		if len(m.BackendShare) > 0 {
			share = fmt.Sprintf("%.2f", m.MaxShareOverMean)
		}
		cost, saved := "-", "-"
		if s := m.Savings; s != nil {
			cost, saved = fsec(s.RoutingSeconds), fsec(s.SavedPrefillSeconds)
		}
		if preempted {
			share = fmt.Sprintf("%d | %s", m.Preemptions, share)
		}
		if m.Requests == m.Errors { // nothing succeeded: no latency to show
			fmt.Fprintf(&sb, "| %s | %d | %d | - | - | - | - | - | - | - | - | %s | %s | %s |\n", name, m.Requests, m.Errors, share, cost, saved)
			continue
		}
		fmt.Fprintf(&sb, "| %s | %d | %d | %s | %s | %s | %s | %s | %.2f | %.0f | %.3f | %s | %s | %s |\n",
			name, m.Requests, m.Errors, fms(m.TTFT.P50), fms(m.TTFT.P95), fms(m.TTFT.P99),
			fms(m.ITL.P50), fms(m.E2E.P95), m.RPS, m.OutputTPS, m.CachedTokenRatio, share, cost, saved)
	}
	return sb.String()
}

// fsec formats seconds with three significant digits, at most three decimals (0.000 for
// under half a millisecond).
func fsec(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

// SavingsLine is the note under the table on its last two columns (empty when no mode has
// Savings); speedup is the run's --speedup.
func SavingsLine(modes []Mode, speedup float64) string {
	var shadow []string
	seen := false
	for _, m := range modes {
		if m.Savings == nil {
			continue
		}
		seen = true
		if s := m.Savings; s.Shadow {
			shadow = append(shadow, fmt.Sprintf("%s: shadow prefix policy %s s, the mode in force %s s", m.Mode, fsec(s.ShadowSavedPrefillSeconds), fsec(s.ShadowActualSavedPrefillSeconds)))
		}
	}
	if !seen {
		return ""
	}
	line := "Routing cost s: the time prefixlb spent keying and picking (prefixlb_routing_seconds_total, about CPU-seconds). " +
		"Saved prefill s: the prefill the replicas' reported KV-cache hits spared at the prefill rates prefixlb learned for them (prefixlb_prefill_saved_seconds_total, an estimate; hits that any policy gets count too, so compare the modes)."
	if speedup != 1 && speedup > 0 {
		line += fmt.Sprintf(" At --speedup %g the saved seconds are the sped-up replicas' (×%g for model time); routing cost is not sped up.", speedup, speedup)
	}
	if len(shadow) > 0 {
		line += " Shadow estimate of saved prefill (prefixlb_shadow_prefill_saved_seconds_total): " + strings.Join(shadow, "; ") + "."
	}
	return line
}

func fms(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// OracleLine describes the oracle under the table.
func OracleLine(o *workload.Oracle) string {
	if o == nil {
		return ""
	}
	return fmt.Sprintf("Oracle cached-token ratio (LRU over %d-token blocks, %d requests): %d replicas × %s tokens pooled into one cache %.3f; one infinite cache %.3f.",
		o.BlockTokens, o.Requests, o.Replicas, humanTokens(o.ReplicaTokens), o.PooledRatio, o.InfiniteRatio)
}

func humanTokens(n int64) string {
	switch {
	case n >= 1_000_000 && n%100_000 == 0:
		return fmt.Sprintf("%gM", float64(n)/1e6)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// requestLine is one line of requests-<mode>.jsonl.
type requestLine struct {
	Conversation int     `json:"conversation"`
	Turn         int     `json:"turn"`
	StartMs      float64 `json:"start_ms"`
	TTFTMs       float64 `json:"ttft_ms"`
	E2EMs        float64 `json:"e2e_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	OutputTokens int     `json:"output_tokens"`
	Backend      string  `json:"backend,omitempty"`
	Route        string  `json:"route,omitempty"`
	Error        string  `json:"error,omitempty"`
	Tenant       string  `json:"tenant,omitempty"`
	Status       int     `json:"status,omitempty"`
	ErrorCode    string  `json:"error_code,omitempty"`
}

// WriteRequests writes one JSON line per request, in completion order.
func WriteRequests(path string, out *loadgen.Outcome) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, r := range out.Results {
		if err := enc.Encode(requestLine{Conversation: r.Conversation, Turn: r.Turn,
			StartMs: ms(r.Scheduled.Sub(out.Start)), TTFTMs: ms(r.TTFT), E2EMs: ms(r.E2E),
			PromptTokens: r.PromptTokens, CachedTokens: r.CachedTokens, OutputTokens: r.OutputTokens,
			Backend: r.Backend, Route: r.Route, Error: r.Err, Tenant: r.Tenant, Status: r.Status,
			ErrorCode: r.ErrorCode}); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
