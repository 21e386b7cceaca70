package proxy

import "github.com/prefixlb/prefixlb/backend"

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

// replicaView is what saturation reads of one replica, all of it read once.
type replicaView struct {
	// counted is this proxy's and its peers' in-flight requests there now (Counted).
	counted int64
	// report is the health checker's last report (running, waiting, KV usage, excess).
	report backend.HealthReport
	// maxConcurrency is the configured concurrency limit (0: not configured).
	maxConcurrency int64
}

// viewOf reads b's replicaView.
func viewOf(b *backend.Backend) replicaView {
	return replicaView{counted: b.Counted(), report: b.HealthReport(), maxConcurrency: b.MaxConcurrency()}
}

// concurrencyLimit is the most requests the replica starts at once as far as known: the
// least of the configured limit, the limit learned from its metrics (the most it ran while
// others waited), and, while its last scrape showed a queue, what it ran then. 0: unknown.
func (v *replicaView) concurrencyLimit() int64 {
	limit := v.maxConcurrency
	for _, l := range [...]int64{v.report.LearnedMaxRunning, v.runningAtQueue()} {
		if l > 0 && (limit == 0 || l < limit) {
			limit = l
		}
	}
	return limit
}

// runningAtQueue is what the replica ran when its last scrape showed waiting requests (0:
// the scrape showed none, or none known).
func (v *replicaView) runningAtQueue() int64 {
	if v.report.Waiting > 0 {
		return v.report.Running
	}
	return 0
}

// requestsNow is the requests the replica holds now as prefixlb judges them, as the cost
// model does: this proxy's and its peers' in flight, which react at once, plus the other
// senders' as of the scrape (Excess). A scrape up to an interval old still lists requests
// answered since; this does not.
func (v *replicaView) requestsNow() int64 { return v.counted + v.report.Excess }

// saturated reports whether starting one more request on the replica now would only queue
// it in the engine:
//   - it holds as many requests as it runs at once (concurrencyLimit; a scrape that showed a
//     queue makes its running count the limit, so the queue is judged with the requests
//     counted since: one of this proxy's or its peers' that ended since frees a place);
//   - its KV cache was at least kvFull used at the last scrape and no request counted since
//     has ended (CountedAtScrape): an ended request frees its blocks.
//
// kvFull ≤ 0 turns the KV rule off.
func (v *replicaView) saturated(kvFull float64) bool {
	now := v.requestsNow()
	if limit := v.concurrencyLimit(); limit > 0 && now >= limit {
		return true
	}
	return kvFull > 0 && v.report.KVUsage >= kvFull && v.counted >= v.report.CountedAtScrape && now > 0
}

// poolSaturated reports whether every one of cands (a pool's healthy replicas) is saturated;
// false for none (the request path then answers as without flow control). Allocation-free.
func poolSaturated(cands []*backend.Backend, kvFull float64) bool {
	if len(cands) == 0 {
		return false
	}
	for _, b := range cands {
		v := viewOf(b)
		if !v.saturated(kvFull) {
			return false
		}
	}
	return true
}

// appendRoomy appends the replicas of cands that are not saturated to dst.
func appendRoomy(dst, cands []*backend.Backend, kvFull float64) []*backend.Backend {
	for _, b := range cands {
		v := viewOf(b)
		if !v.saturated(kvFull) {
			dst = append(dst, b)
		}
	}
	return dst
}
