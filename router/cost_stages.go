package router

import (
	"math"

	"github.com/prefixlb/prefixlb/internal/splitmix"
	"github.com/prefixlb/prefixlb/router/key"
)

// The prefix policy's selection, in stages (pickCost). Every stage reads the candidates'
// estimated TTFT (estimate, seconds) and what the stages before it decided, and none weighs
// anything in another unit: a stage filters candidates, reads their matches or breaks ties.
// A stage takes the candidates and its predecessors' per-candidate output (bool or int
// slices, on pickCost's stack) and appends or narrows its own; its table test is in
// cost_stages_test.go, and the replay test (replay_test.go) shows which recorded decisions
// a change of stage moves.

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
	// history (effectiveMatches).
	shortFirstTurn bool
}

// caps are the bounded-load cap and the hard cap of a backend of weight w among candidates
// of weight wsum with total requests in flight.
func (sel selection) caps(total int64, w, wsum int) (soft, hard int64) {
	return loadCap(total, w, wsum, sel.loadFactor, sel.margin), loadCap(total, w, wsum, sel.hardFactor, sel.margin)
}

// rule is what selection's tie-break and spread options mean for one decision, resolved
// once from the options and the candidates (selection.rule).
type rule struct {
	// byLoad: among the near-ties that hold the most, only the least loaded stay, and the
	// ring decides among equals (TieBreakLoad; TieBreakAuto while every candidate is alone:
	// a replica alone sees all of its backends' traffic).
	byLoad bool
	// byRecent: load ranks by the recent routed work per weight first, then by in-flight
	// requests (lessLoaded, loadOf). With spread on, a replica alone (TieBreakAuto) ranks so
	// by the prefill work it routed to each lately (Prefix.RoutedWork), so that share
	// follows the conversations each serves between their turns, when their in-flight count
	// is 0; peered replicas (TieBreakLoad) rank so by the fleet's recent share
	// (selection.fleetRecent); TieBreakLoad without it by in-flight requests alone.
	byRecent bool
	// spread: a near-tie's thin match counts as the near-ties' least (thinBand); only where
	// near-ties go by load: under the ring a thin match ignored hands the conversation to
	// the hash of its own first chunk, which piles up as readily as the shared chunk's
	// holder does.
	spread bool
	// firstChunk: a match of the first chunk alone counts as what it is, not as none
	// (opening): the prompt's first turn was that short (selection.shortFirstTurn) and
	// near-ties spread by load.
	firstChunk bool
}

// rule resolves sel's tie-break and spread options for the candidates cs.
func (sel selection) rule(cs []cand) rule {
	byLoad := sel.loadFirst || sel.auto
	for i := range cs {
		byLoad = byLoad && (!sel.auto || cs[i].alone)
	}
	spread := sel.spread && byLoad
	return rule{
		byLoad:     byLoad,
		byRecent:   sel.spread && (!sel.loadFirst || sel.fleetRecent),
		spread:     spread,
		firstChunk: spread && sel.shortFirstTurn,
	}
}

// pickCost is the selection of mode prefix over a snapshot of the candidates: it returns
// the chosen index into cs and why; place may be nil (no ring). The caller has run stage 0,
// estimate (cost.go): each candidate's predicted TTFT in seconds, the one score every stage
// below reads. The caps filter, the estimate scores, the rest picks; each stage is a function
// below with its own table test (cost_stages_test.go):
//
//  1. caps (underCaps): candidates at the bounded-load cap are out, unless all are or one
//     under the hard cap is estimated faster than every candidate under the cap.
//  2. least estimate (leastEstimate): the least estimated TTFT among those left, exact ties
//     to the lighter (lighter, salted by tieSalt).
//  3. near-tie band (nearTies): the candidates left within sel.tieMargin of the least.
//  4. effective match (effectiveMatches): each candidate's match as the choice and the
//     reason count it: a match of the first chunk alone is none (opening), and with spread
//     a near-tie's thin match on a loaded holder is the near-ties' least (thinBand).
//  5. tie-break (breakTie): among the near-ties that hold the most, the least estimate, or
//     with rule.byLoad the least loaded (lightest); then the ring, walked from the first
//     chunk they do not hold (ringKey), picks among those left (onRing).
//  6. reason (reasonOf): cold, match or overload, from the effective matches.
//
// selection.rule resolves once what the options mean for these candidates. pickCost sets
// each candidate's weight to at least 1. Up to maxStackCandidates candidates it allocates
// nothing.
func pickCost(chunks []uint64, cs []cand, sel selection, place *placement) (int, Reason) {
	var okBuf, tieBuf [maxStackCandidates]bool
	var effBuf [maxStackCandidates]int
	r := sel.rule(cs)
	ok := underCaps(cs, sel, scratch(okBuf[:], len(cs)))
	best := leastEstimate(cs, ok, tieSalt(chunks))
	tie := nearTies(cs, ok, best, sel.tieMargin, scratch(tieBuf[:], len(cs)))
	eff := effectiveMatches(cs, tie, r, scratch(effBuf[:], len(cs)))
	chosen := breakTie(chunks, cs, tie, eff, best, r, place)
	return chosen, reasonOf(eff, chosen)
}

// scratch is buf[:0] when n elements fit it, else a new empty slice of capacity n: a stage's
// per-candidate output, on the caller's stack up to maxStackCandidates.
func scratch[T any](buf []T, n int) []T {
	if n > len(buf) {
		return make([]T, 0, n)
	}
	return buf[:0]
}

// underCaps is the caps stage: it appends to ok whether each candidate may be chosen.
// Candidates at the bounded-load cap (sel.loadFactor) are out, unless all are, or unless one
// is under the hard cap (sel.hardFactor) and estimated faster than every candidate under the
// cap: the cap counts requests, not what they cost, and spilling a request off the replica
// that holds its prefix costs its whole prefill. The hard cap is the guard against pile-ups
// that the estimate misses. It sets each candidate's weight to at least 1, as the caps and
// the later stages read it.
func underCaps(cs []cand, sel selection, ok []bool) []bool {
	var total int64
	wsum := 0
	for i := range cs {
		cs[i].weight = max(cs[i].weight, 1)
		total += cs[i].inFlight
		wsum += cs[i].weight
	}
	// The caps depend on the weight only, so each candidate's are computed once: under the
	// cap into ok, under the hard cap into hard.
	var hbuf [maxStackCandidates]bool
	hard := scratch(hbuf[:], len(cs))
	anyUnder, bestUnder := false, math.Inf(1)
	for j := range cs {
		soft, h := sel.caps(total, cs[j].weight, wsum)
		under := cs[j].inFlight < soft
		ok, hard = append(ok, under), append(hard, cs[j].inFlight < h)
		if under {
			anyUnder = true
			bestUnder = math.Min(bestUnder, cs[j].est)
		}
	}
	for j := range ok {
		ok[j] = !anyUnder || ok[j] || cs[j].est < bestUnder && hard[j]
	}
	return ok
}

// tieSalt is the salt of exact ties (lighter): the last head chunk, the first 16 tokens
// (the first chunk alone is framing most prompts share); 0 without chunks.
func tieSalt(chunks []uint64) uint64 {
	if len(chunks) == 0 {
		return 0
	}
	return chunks[min(key.HeadChunks, len(chunks))-1]
}

// leastEstimate is the estimate stage's choice: the candidate of least estimated TTFT among
// those ok, exact ties to the lighter (lighter, salted with salt; the same in every prefixlb
// replica); -1 when none is ok (underCaps leaves at least one).
func leastEstimate(cs []cand, ok []bool, salt uint64) int {
	best := -1
	for j := range cs {
		if ok[j] && (best < 0 || cs[j].est < cs[best].est || cs[j].est == cs[best].est && lighter(&cs[j], &cs[best], salt)) {
			best = j
		}
	}
	return best
}

// nearTies is the near-tie band: it appends to tie whether each candidate is ok and
// estimated within margin (a fraction; negative counts as 0) of the least, cs[best]. Among
// near-ties what a cache holds decides before the estimate (effectiveMatches, breakTie), so
// that independent prefixlb replicas, which each see only their own queued prefill, still
// agree where a new prefix lives (DefaultTieMargin).
func nearTies(cs []cand, ok []bool, best int, margin float64, tie []bool) []bool {
	limit := cs[best].est * (1 + max(margin, 0))
	for j := range cs {
		tie = append(tie, ok[j] && cs[j].est <= limit)
	}
	return tie
}

// effectiveMatches is the effective-match stage: it appends to eff each candidate's match,
// in chunks, as the tie-break and the reason count it.
//
// A match of the first chunk alone counts as none (opening): it is a sixteenth of a chunk
// (key.PrefixTokens(1, ·), 4 tokens at the default size), about a role and a word of
// framing, which most chats share ("system", "You are"), and the longest match would pull
// every one of them onto whichever replica learned it first
// (TestPrefixModeRoutesConversationsByPrefix, TestSharedOpeningSpreads). Except with
// r.firstChunk: its holder served the prompt's short first turn, routed as short, and
// learned nothing more of it, but its KV cache holds the reply after it too (many
// OpenAssistant threads open so; TestShortFirstTurnFollowUp).
//
// With r.spread a near-tie's thin match counts as the near-ties' least (thinBand), so that
// a system prompt or document chunk that several conversations share, learned by whichever
// replica saw it first, does not pull every conversation that starts with it onto one
// replica.
func effectiveMatches(cs []cand, tie []bool, r rule, eff []int) []int {
	var band thinBand
	if r.spread {
		band = thinBandOf(cs, tie, r.byRecent)
	}
	for j := range cs {
		m := cs[j].matched
		if r.spread && tie[j] && band.thin(&cs[j], r.byRecent) {
			m = band.lo
		}
		if !r.firstChunk {
			m = opening(m)
		}
		eff = append(eff, m)
	}
	return eff
}

// thinBand is what tells a thin match among the near-ties (thin).
type thinBand struct {
	lo     int     // the least match among the near-ties, chunks
	loWork int64   // the most prefill work among them (the least held's), tokens
	load   float64 // their load (loadOf), summed
	weight int     // their weight, summed
}

// thinBandOf sums up the near-ties (tie) of cs, load by loadOf(·, byRecent).
func thinBandOf(cs []cand, tie []bool, byRecent bool) thinBand {
	b := thinBand{lo: math.MaxInt}
	for j := range cs {
		if tie[j] {
			b.lo, b.loWork = min(b.lo, cs[j].matched), max(b.loWork, cs[j].work)
			b.load += loadOf(&cs[j], byRecent)
			b.weight += cs[j].weight
		}
	}
	return b
}

// thin reports whether near-tie c's match is thin: longer than the least among the
// near-ties but sparing less than thinMatchShare of the prefill work the least held leaves,
// on a holder whose load per weight is above thinMatchLoad × the near-ties' mean (recent
// routed work under byRecent, else in-flight requests). A thread's own history is often thin
// against its next branch (OpenAssistant siblings), and moving it costs the whole history's
// prefill, while a pile-up is a holder taking more than its share.
func (b thinBand) thin(c *cand, byRecent bool) bool {
	return c.matched > b.lo && float64(b.loWork-c.work) < thinMatchShare*float64(b.loWork) &&
		loadOf(c, byRecent)*float64(b.weight) > thinMatchLoad*b.load*float64(c.weight)
}

// opening is a match of n chunks with a match of the first chunk alone read as none (see
// effectiveMatches and key.HeadChunks).
func opening(n int) int {
	if n == 1 {
		return 0
	}
	return n
}

// breakTie is the tie-break stage; it returns the chosen index into cs. Among the near-ties
// (tie) the longest effective match wins (what a cache holds is not computed twice): the
// finalists. Of them best if it is one, else the least estimate; with r.byLoad only the
// least loaded finalists stay (lightest). Then the ring decides among those left: the first
// met walking from the first chunk they do not hold (ringKey, onRing). Without a ring the
// choice before it stands. It narrows tie, in place, to the finalists the ring may choose.
func breakTie(chunks []uint64, cs []cand, tie []bool, eff []int, best int, r rule, place *placement) int {
	at := mostHeld(eff, tie)
	fin := finalists(tie, eff, at)
	chosen := best
	if eff[best] != at {
		chosen = fastest(cs, fin)
	}
	keyAt := ringKey(cs, fin, at)
	if r.byLoad {
		chosen = lightest(cs, fin, r.byRecent, chosen)
	}
	return onRing(chunks, keyAt, place, cs, fin, chosen)
}

// mostHeld is the longest effective match among the near-ties (-1: no near-tie).
func mostHeld(eff []int, tie []bool) int {
	at := -1
	for j, m := range eff {
		if tie[j] {
			at = max(at, m)
		}
	}
	return at
}

// finalists narrows tie, in place, to the near-ties whose effective match is at, and
// returns it.
func finalists(tie []bool, eff []int, at int) []bool {
	for j := range tie {
		tie[j] = tie[j] && eff[j] == at
	}
	return tie
}

// fastest is the first candidate of least estimate among those in (-1: none).
func fastest(cs []cand, in []bool) int {
	chosen := -1
	for j := range cs {
		if in[j] && (chosen < 0 || cs[j].est < cs[chosen].est) {
			chosen = j
		}
	}
	return chosen
}

// ringKey is the index of the chunk the ring walks from: the first chunk the finalists do
// not hold, a cold conversation's first own chunk, which its later turns keep; prompts that
// share only a prefix some replica learned first spread by what follows it. Never a chunk
// before the last head chunk: the first alone is framing most prompts share
// (key.HeadChunks), and keyed on it a cold index would send every conversation that opens
// alike to one replica. It may be past the prompt's last chunk (onRing clamps it).
func ringKey(cs []cand, fin []bool, at int) int {
	keyAt := max(at, key.HeadChunks-1)
	for j := range cs {
		if fin[j] {
			keyAt = max(keyAt, cs[j].matched)
		}
	}
	return keyAt
}

// lightest is the load-first tie-break: it narrows fin, in place, to the least loaded of
// the finalists (per weight; lessLoaded, byRecent), and returns chosen if it is one of
// them, else the first of them.
func lightest(cs []cand, fin []bool, byRecent bool, chosen int) int {
	light := -1
	for j := range cs {
		if fin[j] && (light < 0 || lessLoaded(&cs[j], &cs[light], byRecent) < 0) {
			light = j
		}
	}
	for j := range cs {
		fin[j] = fin[j] && lessLoaded(&cs[j], &cs[light], byRecent) == 0
	}
	if !fin[chosen] {
		return light
	}
	return chosen
}

// onRing walks place's ring from chunks[keyAt] (the last chunk, if keyAt is past it) and
// returns the first candidate in fin that it meets; chosen without a ring or chunks, or
// when the ring meets none of fin (never: every candidate is on the ring).
func onRing(chunks []uint64, keyAt int, place *placement, cs []cand, fin []bool, chosen int) int {
	if place == nil || len(chunks) == 0 {
		return chosen
	}
	place.ring.Lookup(chunks[min(keyAt, len(chunks)-1)], func(m int) bool {
		for j := range cs {
			if cs[j].id == place.ids[m] && fin[j] {
				chosen = j
				return true
			}
		}
		return false
	})
	return chosen
}

// reasonOf is the reason stage: why cs[chosen] was chosen, from the effective matches
// (effectiveMatches), so that a holder passed over for its share of load reads cold or match,
// not overload-fallback, which is kept for a holder over the cap or estimated slower.
// ReasonCold when every candidate holds as much; ReasonMatch when the chosen holds the most;
// ReasonOverload when another holds more.
func reasonOf(eff []int, chosen int) Reason {
	common, most := math.MaxInt, 0
	for _, m := range eff {
		common, most = min(common, m), max(most, m)
	}
	switch {
	case most == common:
		return ReasonCold
	case eff[chosen] == most:
		return ReasonMatch
	}
	return ReasonOverload
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

// loadCap is the bounded-load cap of a backend of weight w: ceil(c·(total+1)·w/W) + margin.
// The +1 counts the request being placed; the margin keeps low load from flapping, where
// the relative bound alone is a request or two.
func loadCap(total int64, w, wsum int, loadFactor float64, margin int64) int64 {
	c := math.Ceil(loadFactor * float64(total+1) * float64(w) / float64(wsum))
	if !(c < math.MaxInt32) { // an infinite or huge factor: no cap (int64(+Inf) is MinInt64)
		return math.MaxInt64
	}
	return int64(c) + margin
}

// lighter ranks a before b by in-flight requests per weight, then pending prefill tokens
// per weight, then a hash of (salt, backend ID), salt a chunk of the prompt's (pickCost's:
// the last of its head chunks): deterministic, the same in every prefixlb replica, and
// different per prompt so that ties do not all go one way.
func lighter(a, b *cand, first uint64) bool {
	if c := lessLoaded(a, b, false); c != 0 {
		return c < 0
	}
	if l, r := a.queued*int64(b.weight), b.queued*int64(a.weight); l != r {
		return l < r
	}
	return splitmix.Mix(first^a.id) < splitmix.Mix(first^b.id)
}
