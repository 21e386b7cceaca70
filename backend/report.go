// The health checker's report: its verdict on the replica and what the replica's metrics
// endpoint reported.

package backend

import (
	"math"
	"sync"
	"sync/atomic"
)

// HealthReport is what the health checker (package health) last found of the replica. Each
// write publishes a whole new value, so a HealthReport read once (Backend.HealthReport) holds
// the fields of one moment: the reported requests with their excess, say. Only package health
// writes it (writers_test.go), through SetHealthy, SetNeverPassed, SetScrapedLoad,
// SetScrapedRequests, SetScrapedKVUsage, SetScrapedKVCacheTokens and SetOtherSenders; the
// zero fields are "not known", and a new Backend is healthy.
type HealthReport struct {
	// Healthy: the backend may take new requests (active checks passing, not ejected).
	Healthy bool
	// NeverPassed: the backend waits for its first passing active check (see NeverPassed).
	NeverPassed bool
	// Requests is the running + waiting requests the replica reported at its last scrape
	// (vLLM num_requests_running + num_requests_waiting; 0: unknown, or the scrape failed).
	Requests int64
	// Running and Waiting split Requests when the scrape told them apart
	// (SetScrapedRequests: vllm:num_requests_running and vllm:num_requests_waiting); a
	// report set by SetScrapedLoad has the total in Running and Waiting 0.
	Running, Waiting int64
	// QueuedScrapes is how many successful scrapes in a row, up to MaxQueuedScrapes, showed
	// waiting requests (Waiting > 0), the last one included; 0 when the last showed none. A
	// queue seen once may be one engine step's (vLLM's token budget admits it at the next
	// step); one seen in consecutive scrapes persists (proxy/saturation.go).
	QueuedScrapes int64
	// LearnedLimit is the most requests the replica runs at once as its scrapes show it (0:
	// not known): what it ran while its queue persisted, grown while it runs all of it
	// with none waiting, forgotten when its load falls under half of it (nextLimit); kept
	// through a failed scrape (SetScrapedLoad).
	LearnedLimit int64
	// CountedAtScrape is what this proxy and its peers had in flight there around the last
	// successful scrape (the larger of before and after the fetch): the requests counted now
	// less it is how the replica's queue moved since (see Excess).
	CountedAtScrape int64
	// Excess is how many of Requests were beyond what this proxy and its peers had in flight
	// there around the scrape: other senders' work (ScrapedExcess).
	Excess int64
	// KVCacheTokens is the KV capacity in tokens the replica reported (vLLM
	// cache_config_info num_gpu_blocks × block_size, SGLang max_total_num_tokens; 0: unknown).
	KVCacheTokens int64
	// KVUsage is the fraction of the replica's KV cache in use, 0..1
	// (vllm:kv_cache_usage_perc, sglang:token_usage; 0: unknown, or the scrape failed).
	KVUsage float64
	// Senders is the verdict on who else sends requests to the replica (senders.go).
	Senders Senders
}

// MaxQueuedScrapes caps HealthReport.QueuedScrapes, so that a replica whose queue persists
// does not publish a new report at every scrape for the count alone.
const MaxQueuedScrapes = 8

// freshReport is a new Backend's report: healthy, nothing scraped.
var freshReport = HealthReport{Healthy: true}

// reportState publishes the HealthReport whole: writers copy the current value under mu
// and swap the copy in, readers load one pointer. Writes are rare (a scrape, a health
// transition) and allocate only when they change something.
type reportState struct {
	mu  sync.Mutex // serialises writers
	cur atomic.Pointer[HealthReport]
}

// load is the current report (never nil).
func (s *reportState) load() *HealthReport {
	if r := s.cur.Load(); r != nil {
		return r
	}
	return &freshReport
}

// update publishes f of the current report if it differs, and reports whether it did. f
// takes and returns values, so that nothing escapes to the heap but a changed report.
func (s *reportState) update(f func(HealthReport) HealthReport) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.load()
	next := f(*old)
	if next == *old {
		return false
	}
	published := new(HealthReport)
	*published = next
	s.cur.Store(published)
	return true
}

// HealthReport reads the health checker's report, one value for all its fields.
func (b *Backend) HealthReport() HealthReport { return *b.report.load() }

// Healthy reports whether the backend may take new requests.
func (b *Backend) Healthy() bool { return b.report.load().Healthy }

// SetHealthy marks the backend healthy or not and reports whether the state changed.
func (b *Backend) SetHealthy(ok bool) bool {
	return b.report.update(func(r HealthReport) HealthReport { r.Healthy = ok; return r })
}

// NeverPassed reports whether the backend is waiting for its first passing active check: a
// new replica, typically still loading its model weights. Such a backend takes no traffic,
// not even in panic mode, and does not count toward the panic threshold (Envoy's
// ignore_new_hosts_until_first_hc). A new Backend is not marked; the health checker marks
// the backends it tracks with active checks on and clears the mark on their first pass.
func (b *Backend) NeverPassed() bool { return b.report.load().NeverPassed }

// SetNeverPassed sets or clears the NeverPassed mark.
func (b *Backend) SetNeverPassed(v bool) {
	b.report.update(func(r HealthReport) HealthReport { r.NeverPassed = v; return r })
}

// SetScrapedLoad stores the running + waiting requests the replica reported (0 when the
// scrape failed or is stale, so that Load falls back to the local in-flight count), in a
// scrape that started when this proxy and its peers had before requests in flight there
// (Counted, read before the fetch; 0 for none known). It keeps how many of the reported
// requests were beyond the larger of before and the count now (ScrapedExcess): requests of
// this proxy's that were answered during the fetch, which the replica may still have listed,
// are not taken for other senders' work, nor requests sent during it. The larger count gives
// the smallest excess: another sender's requests that arrived while as many of this proxy's
// were answered within one fetch (a few milliseconds) wait for the next scrape. A total tells
// no queue (QueuedScrapes goes to 0), and 0, a failed scrape, tells nothing of the replica's
// limit: LearnedLimit is kept until a scrape shows the replica again (forgetting it would
// release every request flow control holds for the replica into its engine's queue).
func (b *Backend) SetScrapedLoad(requests, before int64) {
	b.setScraped(max(requests, 0), 0, before, requests > 0)
}

// SetScrapedRequests is SetScrapedLoad with the running and waiting requests told apart
// (vllm:num_requests_running, vllm:num_requests_waiting; negative counts as 0). A change wakes
// NotifyRoom's subscriber: a scrape may show room (a grown LearnedLimit too). One more scrape
// in a row with a queue (QueuedScrapes) shows none, so a scrape that repeats the last wakes
// nothing.
func (b *Backend) SetScrapedRequests(running, waiting, before int64) {
	if b.setScraped(max(running, 0), max(waiting, 0), before, true) {
		b.roomChanged()
	}
}

// setScraped publishes the scrape, with the limit it teaches (nextLimit) when known (a scrape
// that reported something), and reports whether it changed the report in more than
// QueuedScrapes.
func (b *Backend) setScraped(running, waiting, before int64, known bool) (moved bool) {
	b.report.update(func(r HealthReport) HealthReport {
		old := r
		counted := max(before, b.Counted())
		r.Requests = running + waiting
		r.Running, r.Waiting = running, waiting
		r.CountedAtScrape = counted
		r.Excess = max(r.Requests-counted, 0)
		moved = r != old
		if waiting > 0 {
			r.QueuedScrapes = min(r.QueuedScrapes+1, MaxQueuedScrapes)
		} else {
			r.QueuedScrapes = 0
		}
		if known {
			r.LearnedLimit = nextLimit(r.LearnedLimit, running, waiting, r.QueuedScrapes)
		}
		// A limit that grows or is forgotten may make room; one learned or lowered does not.
		moved = moved || old.LearnedLimit > 0 && (r.LearnedLimit > old.LearnedLimit || r.LearnedLimit == 0)
		return r
	})
	return moved
}

// ScrapedExcess is how many more requests the replica reported running and waiting at its
// last scrape than this proxy and its peers had in flight there around the scrape (the
// larger count of before and after the fetch; 0 when not more, or not scraped): other
// senders' work as of that scrape. Unlike Load less the in-flight count now, it does not
// count this proxy's own requests that answered since the scrape, which a scrape up to an
// interval old still lists.
func (b *Backend) ScrapedExcess() int64 { return b.report.load().Excess }

// SetScrapedKVCacheTokens stores the KV capacity the replica reported and reports whether it
// changed.
func (b *Backend) SetScrapedKVCacheTokens(tokens int64) bool {
	return b.report.update(func(r HealthReport) HealthReport { r.KVCacheTokens = tokens; return r })
}

// KVUsage is the fraction of the replica's KV cache in use as it last reported it
// (vllm:kv_cache_usage_perc, sglang:token_usage), 0 when unknown.
func (b *Backend) KVUsage() float64 { return b.report.load().KVUsage }

// SetScrapedKVUsage stores the KV-cache usage the replica reported (clamped to 0..1; 0 when the
// scrape failed).
func (b *Backend) SetScrapedKVUsage(u float64) {
	if !(u > 0) {
		u = 0
	}
	u = math.Min(u, 1)
	b.report.update(func(r HealthReport) HealthReport { r.KVUsage = u; return r })
}

// OtherSenders is the health checker's latest verdict on who else sends to b.
func (b *Backend) OtherSenders() Senders { return b.report.load().Senders }

// SetOtherSenders stores the verdict and reports whether it changed.
func (b *Backend) SetOtherSenders(s Senders) (changed bool) {
	return b.report.update(func(r HealthReport) HealthReport { r.Senders = s; return r })
}
