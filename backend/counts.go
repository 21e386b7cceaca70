// What this proxy counts of its own requests on the replica.

package backend

import "sync/atomic"

// Counts is what this proxy counts of its own requests on the replica. A Lease per request
// writes it (Begin, FirstByte, Refused, Complete, Release; lease.go), so only the package
// that holds Leases, the proxy, writes it (writers_test.go); peers' requests are PeerLoad,
// other senders' HealthReport.Excess. Backend.Counts reads each field once; the fields are
// separate atomics, so a request that begins or answers during the read may be counted in
// one field and not yet in another.
type Counts struct {
	// InFlight is the requests dispatched to the backend whose response has not finished,
	// failed or been cancelled.
	InFlight int64
	// PrefillTokens is the prefill work given to Lease.Begin of the in-flight requests that
	// have not yet produced a first response byte (see Backend.PrefillTokens).
	PrefillTokens int64
	// PrefillRequests is the in-flight requests that have not yet produced a first response
	// byte; InFlight less it are answering.
	PrefillRequests int64
	// Decoding is the streamed requests answering (the first token came, the lease is not
	// released), and DecodingTokens the KV-cache tokens they hold (see Backend.Decoding).
	Decoding, DecodingTokens int64
	// Served is the requests ever dispatched to the backend; Completed those it answered in
	// full with a success status (Lease.Complete).
	Served, Completed uint64
}

// countState is Counts as atomics, with the cached-token flag the proxy sets. prefillTokens
// and prefillReqs change under the drain's lock (drain.go).
type countState struct {
	inFlight      atomic.Int64
	prefillTokens atomic.Int64
	prefillReqs   atomic.Int64
	decodeSeqs    atomic.Int64
	decodeCtx     atomic.Int64
	served        atomic.Uint64
	completed     atomic.Uint64
	reportsCached atomic.Bool // a response's usage carried a cached-token count
}

// Counts reads this proxy's counts, each field once.
func (b *Backend) Counts() Counts {
	c := &b.counts
	return Counts{InFlight: c.inFlight.Load(), PrefillTokens: c.prefillTokens.Load(), PrefillRequests: c.prefillReqs.Load(),
		Decoding: max(c.decodeSeqs.Load(), 0), DecodingTokens: max(c.decodeCtx.Load(), 0),
		Served: c.served.Load(), Completed: c.completed.Load()}
}

// InFlight is the number of requests dispatched to the backend whose response has not
// finished, failed or been cancelled (Counts.InFlight).
func (b *Backend) InFlight() int64 { return b.counts.inFlight.Load() }

// PrefillTokens is the prefill work this proxy has queued on the replica: the work given to
// Lease.Begin of in-flight requests that have not yet produced a first response byte. The
// prefix policy gives the prompt tokens it predicted uncached, weighted by their attention
// (router.PrefillWork: a token deep in a long context counts more); others the prompt tokens.
func (b *Backend) PrefillTokens() int64 { return b.counts.prefillTokens.Load() }

// PrefillRequests is the number of this proxy's in-flight requests on the replica that have
// not yet produced a first response byte; InFlight less it are decoding.
func (b *Backend) PrefillRequests() int64 { return b.counts.prefillReqs.Load() }

// Served is the number of requests ever dispatched to the backend.
func (b *Backend) Served() uint64 { return b.counts.served.Load() }

// Completed is the number of this proxy's requests the backend answered in full with a
// success status (Lease.Complete).
func (b *Backend) Completed() uint64 { return b.counts.completed.Load() }

// ReportsCachedTokens reports whether a response from this backend has carried a cached-token
// count in its usage (prompt_tokens_details.cached_tokens or cache_read_input_tokens): from
// then on a usage without one means nothing was cached (vLLM omits a zero count).
func (b *Backend) ReportsCachedTokens() bool { return b.counts.reportsCached.Load() }

// SetReportsCachedTokens records that the backend reports cached tokens.
func (b *Backend) SetReportsCachedTokens() {
	if !b.counts.reportsCached.Load() {
		b.counts.reportsCached.Store(true)
	}
}

// Load is the number of requests the replica is working on or queueing as a router that
// reads the replica's metrics and its own count sees it: the larger of this prefixlb's own
// in-flight count (with peering, plus its peers', PeerInFlight) and the running + waiting
// requests the replica last reported (vLLM num_requests_running + num_requests_waiting). The
// scraped count is up to a scrape interval old, so it still lists requests answered since.
// bench's peer policies that read a replica's queue (llm-d, dynamo) see this; prefixlb's own
// policies rank by Busy.
func (b *Backend) Load() int64 {
	l := b.Counted()
	if s := b.report.load().Requests; s > l {
		return s
	}
	return l
}

// Busy is the number of requests the replica is working on or queueing as prefixlb counts
// them: this proxy's in-flight requests and its peers' (Counted), which react at once to a
// dispatch or an answer, plus the other senders' as of the last scrape (ScrapedExcess).
// Unlike Load, requests this proxy or its peers sent that were answered since the scrape
// are not counted. Least-load mode ranks by it, and prefix mode's cost model sums the same
// three terms.
func (b *Backend) Busy() int64 { return b.Counted() + b.report.load().Excess }

// Counted is the requests this proxy and its peers (PeerInFlight) have in flight on the
// backend.
func (b *Backend) Counted() int64 { return b.counts.inFlight.Load() + b.peers.inFlight.Load() }
