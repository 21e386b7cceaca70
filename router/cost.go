package router

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// Defaults of the prefix policy's cost model, for PrefixOptions left at zero.
const (
	// DefaultTieMargin is 0.5: candidates whose estimated TTFT is within 50% of the least
	// are near-ties, and the consistent-hash ring picks among them, so that independent
	// prefixlb replicas, which each see only their own queued prefill (and scraped loads a
	// scrape interval old), still agree where a new prefix lives. Wider keeps replicas more
	// coherent and balances load less; 0 (NoTieMargin) leaves the ring only exact ties. The
	// value is the bench suite's (prefix×3 arms against prefix alone; docs/bench.md).
	DefaultTieMargin = 0.5
	// NoTieMargin, as PrefixOptions.TieMargin, is a margin of 0 (any negative value is).
	NoTieMargin = -1
	// kvPressureStart is the KV-cache usage above which a held prefix counts less: vLLM
	// evicts free cached blocks, least recently used first, when running requests need room,
	// so on a full cache what the index lists may be gone when the request runs.
	kvPressureStart = 0.9
	// defaultWaitingShare is the share of other clients' requests taken to be waiting for
	// their first token when this proxy has none in flight to judge by.
	defaultWaitingShare = 0.5
	// thinMatchShare: among near-ties, a match that spares less than this share of the
	// prefill work the least held among them leaves counts as no match (thinBand). A
	// follow-up turn as long as the history it extends spares half; one chunk shared by
	// every conversation of a 4000-token document workload spares under 7%.
	thinMatchShare = 0.25
	// thinMatchLoad: a thin match counts as none only on a holder whose load per weight is
	// above this many times the near-ties' mean (thinBand), the max share the
	// predicted-TTFT targets allow.
	thinMatchLoad = 1.3
	// kvPressureKeep is the share of a held prefix that counts at 100% usage (linear from 1
	// at kvPressureStart).
	kvPressureKeep = 0.5
)

// AttentionTokens is the context length, in tokens, at which a prompt token's attention
// costs as much as the rest of its forward pass, so that prefilling n tokens after h cached
// ones costs n × (1 + (h + n/2) ÷ AttentionTokens) tokens' worth of work (PrefillWork): a
// token's MLP and projections cost ~2 × parameters FLOP, its causal attention ~4 × layers ×
// hidden FLOP per token before it, equal at 32k tokens for Llama-3-8B (2 × 8.03e9 vs 4 × 32
// × 4096 × 32k) and at ~53k for Llama-3-70B; bench/sim's per-context prefill cost puts it at
// 36k. Counted linearly, a replica busy with a 120k-token prompt would look nearly free.
const AttentionTokens = 32 << 10

// PrefillWork is the prefill work of a prompt of prompt tokens of which held are cached, in
// tokens' worth at the start of a context: (prompt − held) × (1 + (held + (prompt −
// held)/2) ÷ AttentionTokens), rounded, at least 1. The prefix policy queues and learns in these units
// (backend.Lease, backend.PrefillModel), so that a replica's learned rate is the same for short
// and long prompts.
func PrefillWork(prompt, held int64) int64 {
	n := max(prompt-max(held, 0), 1)
	ctx := float64(max(held, 0)) + float64(n)/2
	return int64(math.Round(float64(n) * (1 + ctx/AttentionTokens))) // ≥ n ≥ 1
}

// cand is one candidate as the selection sees it: a snapshot, so that one decision uses one
// consistent view of the loads.
type cand struct {
	id uint64
	// inFlight is this proxy's and its peers' in-flight requests there plus what the
	// replica's last scrape reported beyond theirs when it was read (backend.ScrapedExcess:
	// an unpeered prefixlb replica's traffic, other clients).
	inFlight int64
	weight   int
	matched  int // leading chunks of the prompt the backend holds

	queued  int64   // this proxy's and its peers' prefill work queued there, drained (backend.QueuedPrefill; tokens)
	own     int64   // this proxy's in-flight requests there
	pending int64   // of those, requests not yet answering (prefilling or queued)
	foreign int64   // requests the replica reported beyond this proxy's and its peers' (ScrapedExcess)
	kvUsage float64 // reported KV-cache usage, 0..1 (0: unknown)
	alone   bool    // every request the replica finished lately came through this proxy
	recent  float64 // prefill work (tokens) this policy routed there lately (Prefix.RecentWork, RecentHalfLife)
	rate    float64 // learned prefill tokens/s (0: not yet)
	base    float64 // learned seconds to first token with no prefill (0: not yet)
	decodes int64   // this proxy's streamed requests decoding there (backend.Decoding)
	context int64   // and the KV-cache tokens they hold

	// fleet is the pooled model of the backend's model pool (Prefix.fleets; nil: none), and
	// fleetRate (tokens/s) and fleetBase (s) what it learned, 0 until learned.
	fleet                *backend.PrefillModel
	fleetRate, fleetBase float64

	// Filled by the selection.
	held   float64 // prompt tokens counted as held, after the cache-pressure discount
	work   int64   // PrefillWork of the prompt after held
	decode int64   // backend.DecodeWork of the decodes over the queue and work
	est    float64 // estimated TTFT, seconds
}

// costInput is what the estimate needs beyond the candidates.
type costInput struct {
	promptTokens int64
	chunkTokens  int
	meanWork     float64 // mean prefill tokens of the requests this policy routed
}

// estimate fills each candidate's estimated time to first token:
//
//	est = base + (queued + foreign × waitingShare × meanWork + PrefillWork(prompt, held) + decode) ÷ rate
//
// where:
//   - queued: this proxy's (and its peers') prefill work not yet answering there, less what
//     the replica has likely worked off since (backend.QueuedPrefill).
//   - foreign: requests the replica's last scrape reported beyond this proxy's and its
//     peers' (unpeered prefixlb replicas, other clients); the share of them still waiting
//     is taken to be that of this proxy's own in-flight requests (defaultWaitingShare with
//     none), each at the mean work this policy routes.
//   - held: the prompt tokens the index says the replica holds, discounted when its KV
//     cache is nearly full (kvPressureStart).
//   - decode: what this proxy's decoding requests there add to the engine steps the queue
//     and the prompt take (backend.DecodeWork). The learned rate is taught with the same
//     decode work (backend.Lease), so it is the prefill speed without it; other senders'
//     decodes stay in what it measures.
//   - rate, base: the replica's learned prefill model (backend.PrefillModel); unlearned,
//     the median of its pool's learned candidates, else the pool's pooled model
//     (cand.fleetRate), else the defaults, so an unlearned replica is neither favoured nor
//     avoided. The pooled model learns from every replica's answers, so a fleet far from the
//     default speed is judged at its own after its first few answers, not each replica's.
func estimate(cs []cand, in costInput) {
	var own, pending int64
	for i := range cs {
		own += cs[i].own
		pending += cs[i].pending
	}
	share := defaultWaitingShare
	if own > 0 {
		share = float64(pending) / float64(own)
	}
	for i := range cs {
		c := &cs[i]
		held := float64(min(int64(key.PrefixTokens(c.matched, in.chunkTokens)), in.promptTokens))
		if c.kvUsage > kvPressureStart {
			held *= 1 - (1-kvPressureKeep)*math.Min((c.kvUsage-kvPressureStart)/(1-kvPressureStart), 1)
		}
		c.held = held
		rate, base := c.rate, c.base
		if rate <= 0 || base <= 0 {
			medRate, medBase := fleetModel(cs, c.fleet)
			if rate <= 0 {
				rate = fleetOr(medRate, c.fleetRate, backend.DefaultPrefillRate)
			}
			if base <= 0 {
				base = fleetOr(medBase, c.fleetBase, backend.DefaultPrefillBase.Seconds())
			}
		}
		c.work = PrefillWork(in.promptTokens, int64(held))
		c.decode = backend.DecodeWork(c.decodes, c.context, c.queued, c.work)
		work := float64(c.queued) + float64(c.foreign)*share*in.meanWork + float64(c.work) + float64(c.decode)
		c.est = base + work/rate
	}
}

// fleetModel is the median learned rate and base among the candidates of the pool whose
// pooled model is fleet that have one (0 when none has): an unlearned replica is judged like
// the learned replicas of its model pool, by its pool's pooled model (fleetOr) only where none
// has learned. A request's candidates are mostly one pool's, but not always: a request naming
// no model, or a replica whose models are unknown, meets several.
func fleetModel(cs []cand, fleet *backend.PrefillModel) (rate, base float64) {
	var rbuf, bbuf [maxStackCandidates]float64
	rs, bs := rbuf[:0], bbuf[:0]
	for i := range cs {
		if cs[i].fleet != fleet {
			continue
		}
		if cs[i].rate > 0 && len(rs) < maxStackCandidates {
			rs = append(rs, cs[i].rate)
		}
		if cs[i].base > 0 && len(bs) < maxStackCandidates {
			bs = append(bs, cs[i].base)
		}
	}
	if len(rs) > 0 {
		rate = median(rs)
	}
	if len(bs) > 0 {
		base = median(bs)
	}
	return rate, base
}

// fleetOr is the first of the candidates' median, the pool's pooled model and the default
// that is known (> 0).
func fleetOr(median, pooled, def float64) float64 {
	switch {
	case median > 0:
		return median
	case pooled > 0:
		return pooled
	}
	return def
}

// median sorts xs in place (insertion sort: at most maxStackCandidates) and returns its median.
func median(xs []float64) float64 {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && xs[j] < xs[j-1]; j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// estSeconds converts an estimate to a Duration.
func estSeconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// RunningMean is an exponential moving average (weight 1/32 per observation, about the last
// 32 count), safe for concurrent use; 0 until the first observation. The prefix policy keeps
// the mean prefill work it routes in one; the bench's peer policies use it for their running
// request sizes.
type RunningMean struct{ bits atomic.Uint64 } // float64 bits

// runningMeanAlpha weighs each new observation.
const runningMeanAlpha = 1.0 / 32

// Mean is the current mean (0 before any observation).
func (m *RunningMean) Mean() float64 { return math.Float64frombits(m.bits.Load()) }

// With returns the mean Observe(v) would return, without folding v in (for a policy's Preview).
func (m *RunningMean) With(v float64) float64 {
	old := m.bits.Load()
	if old == 0 {
		return v
	}
	mean := math.Float64frombits(old)
	return mean + runningMeanAlpha*(v-mean)
}

// Observe folds v in and returns the new mean.
func (m *RunningMean) Observe(v float64) float64 {
	for {
		old := m.bits.Load()
		mean := math.Float64frombits(old)
		if old == 0 {
			mean = v
		} else {
			mean += runningMeanAlpha * (v - mean)
		}
		if m.bits.CompareAndSwap(old, math.Float64bits(mean)) {
			return mean
		}
	}
}
