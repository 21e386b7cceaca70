package proxy

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/health"
)

// Saturation: when starting a request on a replica now would only queue it inside the
// engine. Flow control (flowctl.go) holds a request only when every healthy replica of its
// pool is saturated; a replica it knows nothing about (no scrape, no configured limit) is
// never saturated, so a request that some replica could start now is never held.

// DefaultKVSaturation is the KV-cache usage at or above which a replica is saturated: with
// under 2% of its blocks free (about 2,600 tokens of a 131k-token cache) the next request's
// prompt, or the running ones' next blocks, do not fit, and vLLM's scheduler leaves the
// request waiting (or preempts a running one to make room). Lower, the engine still admits
// a typical chat turn: llm-d's 0.8 holds requests a replica would start at once, which the
// flow-control-off arm would not, and costs throughput at light load.
const DefaultKVSaturation = 0.98

// DefaultPrefillSaturation is the queued prefill, in time at the replica's prefill rate, at
// or above which a replica is saturated: a request started there now would wait at least
// that long behind the prompts ahead of it before its own prefill (chunked prefill schedules
// the running prompts' chunks first). It catches what the concurrency limit does not yet
// know: before a replica's first scrapes teach its limit, a burst of long prompts would
// otherwise all go into its engine's waiting queue (fair10x at 4.4× capacity: 78 requests
// per replica in the first scrape interval, 68 of them waiting, most abandoned there:
// `bench compare --workload overload --load fair10x:0.4 --modes prefix+fc --speedup 2`).
// Well above one long prompt's own prefill (a 6,000-token document: 0.3 s at bench/sim's
// 18.5k tokens/s), so that it holds nothing at light load.
const DefaultPrefillSaturation = 2 * time.Second

// DefaultReservePrefill is FlowControl.ReservePrefill: while a higher band was served lately,
// a lower band's request starts only on a replica whose queued prefill takes less than this,
// less than one engine step: nearly drained. The higher band's next request there then waits
// for at most one lower-band prompt's prefill (a 6,000-token document: 0.3 s at bench/sim's
// 18.5k tokens/s) before its own, within a chat reply's 500 ms TTFT objective. The
// dispatcher wakes when the queue drains under it (flowControl.place), so the engines are not
// left idle for a poll. Smaller bounds kept the chat tenant's TTFT lower at 2× capacity at no
// cost in output (`bench compare --workload overload --modes prefix+fc`; docs/flow-control.md,
// "Room kept for a higher band").
const DefaultReservePrefill = 5 * time.Millisecond

// satRule is how saturation judges replicas at one moment: FlowControl's thresholds and the
// time now (for the queued prefill's drain), read once, when first needed.
type satRule struct {
	kvFull  float64       // KV-cache usage at or above which a replica is saturated; ≤ 0: off
	prefill time.Duration // queued prefill at or above which it is; ≤ 0: off
	reserve time.Duration // the same for a lower band's request (ReservePrefill); ≤ 0: off
	keep    bool          // with reserve: keep the pool's last drained replica (keptFree)
	now     time.Time     // zero: not read yet (at)
}

// ruleOf is cfg's rule, its time read when first needed.
func ruleOf(cfg *FlowControl) satRule {
	return satRule{kvFull: cfg.KVSaturation, prefill: cfg.PrefillSaturation}
}

// at is the rule's time now, read at the first call.
func (r *satRule) at() time.Time {
	if r.now.IsZero() {
		r.now = time.Now()
	}
	return r.now
}

// replicaView is what saturation reads of one replica, all of it read once.
type replicaView struct {
	// counted is this proxy's and its peers' in-flight requests there now (Counted).
	counted int64
	// report is the health checker's last report (running, waiting, KV usage, excess).
	report backend.HealthReport
	// maxConcurrency is the configured concurrency limit (0: not configured).
	maxConcurrency int64
	// queuedPrefill is the prefill queued there (own and peers', less what it has likely
	// worked off) at its prefill rate, when b is nil; with b, read from it when the other
	// rules leave the replica unsaturated (the read takes the drain's lock).
	queuedPrefill time.Duration
	b             *backend.Backend
}

// viewOf reads b's replicaView.
func viewOf(b *backend.Backend) replicaView {
	return replicaView{counted: b.Counted(), report: b.HealthReport(), maxConcurrency: b.MaxConcurrency(), b: b}
}

// prefillAhead is the replica's queued prefill at r's time, at its prefill rate.
func (v *replicaView) prefillAhead(r *satRule) time.Duration {
	if v.b == nil {
		return v.queuedPrefill
	}
	q := v.b.QueuedPrefill(r.at())
	if q <= 0 {
		return 0
	}
	return time.Duration(float64(q) / v.b.PrefillRate() * float64(time.Second))
}

// concurrencyLimit is the most requests the replica starts at once as far as known: the
// lesser of the configured limit and the one its scrapes show (backend.HealthReport.
// LearnedLimit: what it ran while a queue persisted over two scrapes, grown while it runs
// all of it with none waiting, forgotten when its load falls away). 0: unknown.
func (v *replicaView) concurrencyLimit() int64 {
	limit := v.maxConcurrency
	if l := v.report.LearnedLimit; l > 0 && (limit == 0 || l < limit) {
		limit = l
	}
	return limit
}

// requestsNow is the requests the replica holds now as prefixlb judges them, as the cost
// model does: this proxy's and its peers' in flight, which react at once, plus the other
// senders' as of the scrape (Excess). A scrape up to an interval old still lists requests
// answered since; this does not.
func (v *replicaView) requestsNow() int64 { return v.counted + v.report.Excess }

// saturated reports whether starting one more request on the replica now would only queue
// it in the engine:
//   - it holds as many requests as it runs at once (concurrencyLimit), judged with the
//     requests counted now: one of this proxy's or its peers' that ended since the scrape
//     frees a place;
//   - its KV cache was at least r.kvFull used at the last scrape and no request counted
//     since has ended (CountedAtScrape): an ended request frees its blocks;
//   - its queued prefill is at least r.prefill long (DefaultPrefillSaturation), or, for a
//     lower band's request while a higher band was served lately, r.reserve
//     (DefaultReservePrefill).
//
// A threshold ≤ 0 turns its rule off.
func (v *replicaView) saturated(r *satRule) bool {
	now := v.requestsNow()
	if limit := v.concurrencyLimit(); limit > 0 && now >= limit {
		return true
	}
	if r.kvFull > 0 && v.report.KVUsage >= r.kvFull && v.counted >= v.report.CountedAtScrape && now > 0 {
		return true
	}
	if r.prefill <= 0 && r.reserve <= 0 {
		return false
	}
	ahead := v.prefillAhead(r)
	return r.prefill > 0 && ahead >= r.prefill || r.reserve > 0 && ahead >= r.reserve
}

// poolSaturated reports whether every one of cands (a pool's healthy replicas) is saturated;
// false for none (the request path then answers as without flow control). Allocation-free.
//
// With the reserve rule (r.reserve > 0) a pool of two or more is saturated for the lower
// band's request while at most one replica has room: the last replica whose queued prefill
// has drained is kept for the higher band (appendRoomy).
func poolSaturated(cands []*backend.Backend, r satRule) bool {
	if len(cands) == 0 {
		return false
	}
	need := keptFree(cands, r) + 1 // replicas with room for this request to start
	for _, b := range cands {
		v := viewOf(b)
		if !v.saturated(&r) {
			if need--; need == 0 {
				return false
			}
		}
	}
	return true
}

// keptFree is how many of cands with room the reserve rule keeps for the higher band: one in
// a pool of two or more while r.reserve and r.keep are on (poolQueue.keeps: the pool was
// saturated lately), none otherwise. vLLM runs a prompt's prefill chunks before it
// admits a request that arrives meanwhile, so a higher band's request that
// finds every replica working through a lower band's prompt waits for one of them inside the
// engine (a step carrying a full 8,192-token chunk takes 450 ms of the sims' model time);
// one replica kept drained lets it start at once.
func keptFree(cands []*backend.Backend, r satRule) int {
	if r.keep && r.reserve > 0 && len(cands) > 1 {
		return 1
	}
	return 0
}

// appendRoomy appends the replicas of cands that are not saturated to dst; none while the
// reserve rule keeps the only one for the higher band (keptFree).
func appendRoomy(dst, cands []*backend.Backend, r satRule) []*backend.Backend {
	n := len(dst)
	for _, b := range cands {
		v := viewOf(b)
		if !v.saturated(&r) {
			dst = append(dst, b)
		}
	}
	if len(dst)-n <= keptFree(cands, r) {
		clear(dst[n:])
		return dst[:n]
	}
	return dst
}

// Saturation rules (FlowControl.Saturation).
const (
	// SaturationPrefixLB is prefixlb's rule (replicaView.saturated): a replica at its
	// concurrency limit or with a full KV cache, judged with the requests counted since its
	// last scrape. "" means it.
	SaturationPrefixLB = "prefixlb"
	// SaturationGIE is the saturation detector of llm-d's router, the Gateway API Inference
	// Extension's endpoint picker (gieSaturated), with its defaults in GIESaturation. It
	// reads only the replicas' scraped metrics, so between two scrapes a replica it judges
	// not saturated takes every queued request the dispatcher has; it is there for the
	// bench's llm-d-style flow-control arm (bench/README.md, llm-d-fc), not for production.
	SaturationGIE = "gie"
)

// GIESaturation tunes SaturationGIE; zero fields take GIE's defaults, those of
// gateway-api-inference-extension pkg/epp/saturationdetector/config.go (release-1.2; the
// same values in release-1.3's framework/plugins/utilizationdetector/config.go).
type GIESaturation struct {
	// QueueDepth: a replica whose scraped waiting queue is above it is saturated
	// (DefaultQueueDepthThreshold 5: saturated at 6 waiting).
	QueueDepth int
	// KVCacheUtil: a replica whose scraped KV-cache usage (0..1) is above it is saturated
	// (DefaultKVCacheUtilThreshold 0.8).
	KVCacheUtil float64
	// MetricsStaleness: a replica whose last successful scrape finished longer ago is
	// saturated, as is one never scraped (DefaultMetricsStalenessThreshold 200 ms, for GIE's
	// 50 ms metrics refresh; the scrape interval must be well below it).
	MetricsStaleness time.Duration
}

// GIE's defaults (GIESaturation).
const (
	DefaultGIEQueueDepth       = 5
	DefaultGIEKVCacheUtil      = 0.8
	DefaultGIEMetricsStaleness = 200 * time.Millisecond
)

func (g GIESaturation) withDefaults() GIESaturation {
	if g.QueueDepth <= 0 {
		g.QueueDepth = DefaultGIEQueueDepth
	}
	if g.KVCacheUtil <= 0 || g.KVCacheUtil >= 1 {
		g.KVCacheUtil = DefaultGIEKVCacheUtil
	}
	if g.MetricsStaleness <= 0 {
		g.MetricsStaleness = DefaultGIEMetricsStaleness
	}
	return g
}

// gieSaturated is GIE's rule for one replica, from its last successful scrape l at now: it
// has no good capacity when the scrape is older than MetricsStaleness (or there is none),
// its waiting queue is above QueueDepth, or its KV-cache usage is above KVCacheUtil — all
// strict comparisons, as GIE's IsSaturated makes them. What this proxy has in flight there
// is not counted: GIE's detector reads only the metrics.
func gieSaturated(l health.Load, now time.Time, g GIESaturation) bool {
	if l.At.IsZero() || now.Sub(l.At) > g.MetricsStaleness {
		return true
	}
	return l.Waiting > float64(g.QueueDepth) || l.KVCacheUsage > g.KVCacheUtil
}

// poolSaturated reports whether every one of cands is saturated under cfg's rule (false for
// none: the request path then answers as without flow control).
func (s *Server) poolSaturated(cfg *FlowControl, cands []*backend.Backend) bool {
	if cfg.Saturation != SaturationGIE {
		return poolSaturated(cands, ruleOf(cfg))
	}
	now := time.Now()
	for _, b := range cands {
		if l, _ := s.hc.Load(b); !gieSaturated(l, now, cfg.GIE) {
			return false
		}
	}
	return len(cands) > 0
}

// appendRoomy appends to dst the replicas of cands the dispatcher may place on under cfg's
// rule: prefixlb's, those not saturated (below: for a lower band's request while a higher
// band was served lately, with the reserve rule, ReservePrefill); GIE's, a pool-wide gate,
// every one of them while any is not saturated (GIE's scheduler then picks among all the
// pool's replicas), none when all are.
func (s *Server) appendRoomy(cfg *FlowControl, dst, cands []*backend.Backend, below, keep bool) []*backend.Backend {
	if cfg.Saturation != SaturationGIE {
		r := ruleOf(cfg)
		if below {
			r.reserve, r.keep = cfg.ReservePrefill, keep
		}
		return appendRoomy(dst, cands, r)
	}
	if s.poolSaturated(cfg, cands) {
		return dst
	}
	return append(dst, cands...)
}
