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
	// prefill work the least held among them leaves counts as no match (see pickCost). A
	// follow-up turn as long as the history it extends spares half; one chunk shared by
	// every conversation of a 4000-token document workload spares under 7%.
	thinMatchShare = 0.25
	// thinMatchLoad: a thin match counts as none only on a holder whose load per weight is
	// above this many times the near-ties' mean (see pickCost), the max share the
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

// selection is what pickCost weighs besides the candidates: the caps and the near-tie rule.
type selection struct {
	loadFactor float64 // c of the bounded-load cap
	hardFactor float64 // the hard cap's factor (≥ loadFactor)
	margin     int64   // both caps' absolute margin in requests
	tieMargin  float64 // near-tie margin of estimated TTFTs, as a fraction of the least
	loadFirst  bool    // TieBreakLoad
	auto       bool    // TieBreakAuto: loadFirst while every candidate is alone
	spread     bool    // PrefixOptions.NoSpreadNewPrefixes off
	// fleetRecent: the recent routed work is the fleet's (Prefix.CountPeerRoutes), and
	// TieBreakLoad ranks by them as TieBreakAuto does alone.
	fleetRecent bool
	// shortFirstTurn: the prompt's first turn was shorter than the head chunks
	// (key.Key.ShortFirstTurn), so that a match of the first chunk alone may be its own
	// history (see pickCost).
	shortFirstTurn bool
}

// caps are the bounded-load cap and the hard cap of a backend of weight w among candidates
// of weight wsum with total requests in flight.
func (sel selection) caps(total int64, w, wsum int) (soft, hard int64) {
	return loadCap(total, w, wsum, sel.loadFactor, sel.margin), loadCap(total, w, wsum, sel.hardFactor, sel.margin)
}

// pickCost is the selection of mode prefix over a snapshot of the candidates (estimate
// filled); it returns the chosen index into cs and why. place may be nil (no ring).
//
//  1. Candidates at the bounded-load cap are out, unless all are, or unless one is under
//     the hard cap (sel.hardFactor) and estimated faster than every candidate under the
//     cap: the cap counts requests, not what they cost, and spilling a request off the
//     replica that holds its prefix costs its whole prefill. The hard cap is the guard
//     against pile-ups that the estimate misses.
//  2. The least estimated TTFT wins; candidates within tieMargin of it are near-ties. Among
//     them the longest match wins (what a cache holds is not computed twice), and among
//     those the ring decides: the first met walking from the first chunk they do not hold (a
//     cold conversation's first own chunk, which its later turns keep; prompts that share
//     only a prefix some replica learned first spread by what follows it). With loadFirst
//     (TieBreakLoad, or TieBreakAuto while every candidate is alone) the least loaded of
//     those go to the ring, the others are out. Without a ring, the least estimate among
//     them.
//     A match of the first chunk alone counts as none (opening, key.HeadChunks) unless the
//     prompt's first turn was that short (sel.shortFirstTurn) and near-ties spread by load.
//  3. The reason: ReasonMatch when the chosen candidate holds more than every candidate
//     holds; ReasonOverload when another held more (it was over the cap or would have been
//     slower); ReasonCold when nobody held more than the common prefix; matches counted as
//     in step 2 (a near-tie's thin match the spread rule set aside as the match it was read
//     as).
func pickCost(chunks []uint64, cs []cand, sel selection, place *placement) (int, Reason) {
	var total int64
	wsum := 0
	loadFirst := sel.loadFirst || sel.auto
	for i := range cs {
		loadFirst = loadFirst && (!sel.auto || cs[i].alone)
		cs[i].weight = max(cs[i].weight, 1)
		total += cs[i].inFlight
		wsum += cs[i].weight
	}
	// Under the cap, or under the hard cap; the caps depend on the weight only, so each
	// candidate's are computed once.
	var ubuf, hbuf [maxStackCandidates]bool
	under, underHard := ubuf[:0], hbuf[:0]
	if len(cs) > maxStackCandidates {
		under, underHard = make([]bool, 0, len(cs)), make([]bool, 0, len(cs))
	}
	anyUnder, bestUnder := false, math.Inf(1)
	for j := range cs {
		soft, hard := sel.caps(total, cs[j].weight, wsum)
		under, underHard = append(under, cs[j].inFlight < soft), append(underHard, cs[j].inFlight < hard)
		if under[j] {
			anyUnder = true
			bestUnder = math.Min(bestUnder, cs[j].est)
		}
	}
	ok := func(j int) bool {
		return !anyUnder || under[j] || cs[j].est < bestUnder && underHard[j]
	}
	// The salt of exact ties: the last head chunk, the first 16 tokens (the first chunk
	// alone is framing most prompts share).
	var first uint64
	if len(chunks) > 0 {
		first = chunks[min(key.HeadChunks, len(chunks))-1]
	}
	best := -1
	for j := range cs {
		if ok(j) && (best < 0 || cs[j].est < cs[best].est || cs[j].est == cs[best].est && lighter(&cs[j], &cs[best], first)) {
			best = j
		}
	}
	// Near-ties: within tieMargin of the least estimate. Among them the longest match (what
	// the cache already holds is not computed again), and among those the ring. With
	// sel.spread (PrefixOptions.NoSpreadNewPrefixes off) a thin match counts as none: one that
	// spares less than thinMatchShare of the prefill work the least held among the near-ties
	// leaves (a system prompt or document chunk that several conversations share, learned by
	// whichever replica saw it first), so that it does not pull every conversation that
	// starts with it onto one replica.
	limit := cs[best].est * (1 + max(sel.tieMargin, 0))
	tie := func(j int) bool { return ok(j) && cs[j].est <= limit }
	// Only where near-ties go by load: under the ring a thin match ignored hands the
	// conversation to the hash of its own first chunk, which piles up as readily as the
	// shared chunk's holder does.
	// And only for a holder already above thinMatchLoad × the near-ties' mean load (recent
	// routed work under byRecent, else in-flight requests, per weight): a thread's own history is
	// often thin against its next branch (OpenAssistant siblings), and moving it costs the
	// whole history's prefill, while a pile-up is a holder taking more than its share.
	spread := sel.spread && loadFirst
	byRecent := sel.spread && (!sel.loadFirst || sel.fleetRecent)
	lo, loWork := math.MaxInt, int64(0)
	var tieLoad float64
	tieWeight := 0
	for j := range cs {
		if spread && tie(j) {
			lo, loWork = min(lo, cs[j].matched), max(loWork, cs[j].work)
			tieLoad += loadOf(&cs[j], byRecent)
			tieWeight += cs[j].weight
		}
	}
	thin := thinMatchShare * float64(loWork)
	// A match of the first chunk alone counts as none: it is a sixteenth of a chunk
	// (key.PrefixTokens(1, ·), 4 tokens at the default size), about a role and a word of
	// framing, which most chats share ("system", "You are"), and the longest match would pull
	// every one of them onto whichever replica learned it first
	// (TestPrefixModeRoutesConversationsByPrefix, TestSharedOpeningSpreads). Except where
	// the prompt's first turn was itself that short (sel.shortFirstTurn) and near-ties
	// spread by load: its holder served that turn, routed as short, and learned nothing more
	// of it, but its KV cache holds the reply after it too (many OpenAssistant threads open
	// so; TestShortFirstTurnFollowUp). The ring keys on the prompt's second chunk, its first
	// 16 tokens (key.HeadChunks).
	counted := func(n int) int {
		if spread && sel.shortFirstTurn {
			return n
		}
		return opening(n)
	}
	// eff is each candidate's match as the choice and the reason count it: counted, and a
	// near-tie's thin match set aside by the spread rule as the near-ties' common one.
	var ebuf [maxStackCandidates]int
	eff := ebuf[:0]
	if len(cs) > maxStackCandidates {
		eff = make([]int, 0, len(cs))
	}
	for j := range cs {
		m := cs[j].matched
		if spread && tie(j) && m > lo && float64(loWork-cs[j].work) < thin &&
			loadOf(&cs[j], byRecent)*float64(tieWeight) > thinMatchLoad*tieLoad*float64(cs[j].weight) {
			m = lo
		}
		eff = append(eff, counted(m))
	}
	at := -1
	for j := range cs {
		if tie(j) {
			at = max(at, eff[j])
		}
	}
	chosen := best
	if eff[best] != at {
		chosen = -1
		for j := range cs {
			if tie(j) && eff[j] == at && (chosen < 0 || cs[j].est < cs[chosen].est) {
				chosen = j
			}
		}
	}
	// The ring key is the first chunk the near-ties left do not hold: a cold conversation's
	// first own chunk, which its later turns keep; prompts that share only a prefix some
	// replica learned first spread by what follows it. Never a chunk before the last head
	// chunk: the first alone is framing most prompts share (key.HeadChunks), and keyed on it
	// a cold index would send every conversation that opens alike to one replica.
	keyAt := max(at, key.HeadChunks-1)
	for j := range cs {
		if tie(j) && eff[j] == at {
			keyAt = max(keyAt, cs[j].matched)
		}
	}
	if loadFirst {
		// Among the near-ties that hold the most, only the least loaded stay, and the ring
		// decides among equals. With sel.spread, a replica alone (TieBreakAuto) ranks by the
		// prefill work it routed to each lately (per weight; Prefix.RoutedWork), then by
		// in-flight requests: it sees all of its backends' traffic, so that share follows the
		// conversations each serves between their turns, when their in-flight count is 0.
		// Peered replicas (TieBreakLoad) rank the same way by the fleet's recent share
		// (Prefix.CountPeerRoutes: each counts its peers' decisions too, so they agree
		// within milliseconds); TieBreakLoad without it by in-flight requests alone.
		light := -1
		for j := range cs {
			if tie(j) && eff[j] == at && (light < 0 || lessLoaded(&cs[j], &cs[light], byRecent) < 0) {
				light = j
			}
		}
		tie0 := tie
		tie = func(j int) bool {
			return tie0(j) && eff[j] == at && lessLoaded(&cs[j], &cs[light], byRecent) == 0
		}
		if !tie(chosen) {
			chosen = light
		}
	}
	if place != nil && len(chunks) > 0 {
		place.ring.Lookup(chunks[min(keyAt, len(chunks)-1)], func(m int) bool {
			for j := range cs {
				if cs[j].id == place.ids[m] && tie(j) && eff[j] == at {
					chosen = j
					return true
				}
			}
			return false
		})
	}
	// The reason counts matches as the choice did (eff), so that a holder passed over for
	// its share of load reads cold or match, not overload-fallback, which is kept for a
	// holder over the cap or estimated slower.
	common, most := math.MaxInt, 0
	for _, m := range eff {
		common, most = min(common, m), max(most, m)
	}
	switch {
	case most == common:
		return chosen, ReasonCold
	case eff[chosen] == most:
		return chosen, ReasonMatch
	}
	return chosen, ReasonOverload
}

// opening is a match of n chunks with a match of the first chunk alone read as none (see
// pickCost and key.HeadChunks).
func opening(n int) int {
	if n == 1 {
		return 0
	}
	return n
}

// loadOf is what lessLoaded ranks first: recent routed work under byRecent, else in-flight
// requests.
func loadOf(c *cand, byRecent bool) float64 {
	if byRecent {
		return c.recent
	}
	return float64(c.inFlight)
}

// lessLoaded compares a's load with b's, per weight: −1 lighter, 0 equal, 1 heavier. byRecent
// ranks by recent routed work first, then in-flight requests.
func lessLoaded(a, b *cand, byRecent bool) int {
	if byRecent {
		if l, r := a.recent*float64(b.weight), b.recent*float64(a.weight); l != r {
			if l < r {
				return -1
			}
			return 1
		}
	}
	l, r := a.inFlight*int64(b.weight), b.inFlight*int64(a.weight)
	switch {
	case l < r:
		return -1
	case l > r:
		return 1
	}
	return 0
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
