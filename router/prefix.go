package router

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/hashring"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// Defaults of the prefix policy's bounded-load cap, for PrefixOptions left at zero.
const (
	// DefaultLoadFactor is c = 1.25 in the cap ceil(c × (total in-flight + 1) / n): the
	// bounded-load factor of Mirrokni, Thorup and Zadimoghaddam, as HAProxy's
	// hash-balance-factor 125. 1 would be perfect balance and no affinity.
	DefaultLoadFactor = 1.25
	// DefaultLoadMargin is 2 requests added to the cap: an absolute margin, because a
	// relative factor alone misfires at low load, where it allows a request or two (smg PR
	// #2150).
	DefaultLoadMargin = 2
	// NoLoadMargin, as PrefixOptions.LoadMargin, is a cap without margin (any negative value
	// is): the zero value takes DefaultLoadMargin.
	NoLoadMargin = -1
	// DefaultHardLoadFactor is 2.5, the factor of the hard cap ceil(2.5 × (total + 1) / n) +
	// margin. A candidate over the cap (DefaultLoadFactor) but under this one still takes the
	// request when the cost model estimates it faster than every candidate under the cap:
	// the cap counts requests, most of them decoding, and a request spilled off the replica
	// that holds its prefix pays the whole prefill elsewhere. The bench suite's
	// shared-prefix cells (prefix against oracle arms; docs/bench.md) reproduce the gain
	// over the cap alone.
	DefaultHardLoadFactor = 2.5
)

// PrefixOptions tune the prefix policy. Zero fields take the defaults of the package that
// uses them: DefaultLoadFactor and DefaultLoadMargin here, key.DefaultChunkTokens, and
// index.Options' for the index.
type PrefixOptions struct {
	// ChunkTokens is the chunk size in approximate tokens, as the keys were built with.
	ChunkTokens int
	// LoadFactor is c in the bounded-load cap ceil(c × (total in-flight + 1) / n) + margin.
	LoadFactor float64
	// LoadMargin is the cap's absolute margin in requests (0: DefaultLoadMargin;
	// NoLoadMargin or any negative value: none).
	LoadMargin int
	// HardLoadFactor is the factor of the hard cap, up to which a candidate over the cap
	// still takes a request the cost model estimates it fastest for (0:
	// DefaultHardLoadFactor; below LoadFactor: LoadFactor, the cap alone).
	HardLoadFactor float64
	// MaxIndexEntries caps the prefix index's (chunk, backend) entries (index.Options.MaxEntries).
	MaxIndexEntries int
	// DefaultKVCacheTokens is a backend's KV capacity in tokens when its KVCacheTokens is 0
	// (index.Options.DefaultKVCacheTokens).
	DefaultKVCacheTokens int64
	// TieMargin is how close (a fraction of the least) a candidate's estimated TTFT must be
	// to the least to count as a near-tie, broken by the ring (0: DefaultTieMargin;
	// NoTieMargin or any negative value: exact ties only).
	TieMargin float64
	// TieBreak is how near-ties that hold the same prefix are broken: TieBreakRing (the
	// zero value) by the consistent-hash ring alone, TieBreakLoad by the least in-flight
	// requests per weight first and the ring among equals, TieBreakAuto by load while every
	// candidate is backend.SendersAlone and by the ring otherwise.
	TieBreak TieBreak
	// NoSpreadNewPrefixes turns off the spreading of new prefixes among near-ties. Spreading
	// (the default): where near-ties go by load (TieBreakLoad, or TieBreakAuto while every
	// candidate is alone) a thin match (one sparing under thinMatchShare of the prefill work,
	// such as a system prompt many conversations share) counts as none among them on a
	// holder above thinMatchLoad × their mean load, and a prefixlb replica alone
	// (TieBreakAuto) sends a new prefix to the near-tie it routed the least prefill work to
	// lately (RecentWork, RoutedWork, RecentHalfLife) before the in-flight count: between
	// turns a conversation has nothing in flight where it is served, and a 100k-token prompt
	// costs its replica what thousands of short ones do. Under the ring (and with
	// spreading off) a thin match still counts. Either way a match of the first chunk alone
	// counts as none (key.HeadChunks), but, with spreading, for a prompt whose own first turn
	// was that short (key.Key.ShortFirstTurn). A thin match still holds on a holder at its
	// share: siblings of a thread (OpenAssistant) share a prefix that is thin against their
	// own turns, and ignoring it costs them their cached tokens (bench suite, docs/bench.md).
	NoSpreadNewPrefixes bool
	// NoIndexCorrection turns off the index's correction from the backends' reported cached
	// tokens (Prefix.Correct), for comparison: the index then trusts its capacities alone.
	NoIndexCorrection bool
}

// TieBreak is how the prefix policy breaks near-ties among candidates holding the same prefix.
type TieBreak uint8

const (
	// TieBreakRing: the consistent-hash ring alone, so that independent (unpeered) prefixlb
	// replicas, which see only their own in-flight requests, place a new prefix alike.
	TieBreakRing TieBreak = iota
	// TieBreakLoad: the least in-flight requests per weight first, the ring among equals. For
	// replicas that share their loads (peering) or run alone: cold prompts then spread by
	// load instead of by hash, which with few conversations puts up to twice the mean on
	// one replica. Peered replicas (Prefix.CountPeerRoutes) rank by the fleet's recent share
	// of the prefill work first.
	TieBreakLoad
	// TieBreakAuto: TieBreakLoad while every candidate's requests come through this proxy
	// alone (backend.SendersAlone, judged by the health checker from the replicas' own
	// finished-request counts), TieBreakRing as soon as one has another sender or is not
	// judged yet: a prefixlb replica running alone spreads cold prompts by load, and one that
	// shares its backends with unpeered others keeps the ring's coherence with them.
	TieBreakAuto
)

// Prefix is the policy of mode prefix: send a request where it will see its first token
// soonest, trading what a replica's KV cache holds of the prompt against the prefill work
// queued there, within a bounded load. It is safe for concurrent use.
//
// For every candidate it estimates the time to first token (see estimate): the replica's
// learned base time plus the prefill work ahead of and in this request — this proxy's queued
// prefill tokens, other clients' requests the replica reports, the prompt tokens its prefix
// index says the replica does not hold — at the replica's learned prefill rate. The least
// estimate wins; near-ties (within TieMargin) go to the consistent-hash ring's choice, so
// independent prefixlb replicas agree where a new prefix lives. No candidate takes a request
// once its in-flight count reaches the cap ceil(c × (total + 1) × w / W) + margin (w its
// weight, W the candidates' sum) while another is under its cap, unless it is estimated
// faster than every candidate under the cap and is under the hard cap (c = HardLoadFactor).
type Prefix struct {
	chunkTokens int64 // chunk size in approximate tokens
	sel         selection
	// noCorrection: Correct does nothing (PrefixOptions.NoIndexCorrection).
	noCorrection bool
	meanWork     RunningMean
	// fleets are the pooled prefill models, one per model pool (poolKey), each learning
	// from every observation of its pool's backends (backend.SetFleetPrefill): the drain of
	// a replica that has not learned its own rate runs at its pool's, and the estimate
	// takes it where no candidate of that pool has learned (fleetOr). all is the backends they are
	// bound to (SetBackends). Guarded by fleetMu; the request path reads only the
	// backends' own pointers.
	fleetMu sync.Mutex
	fleets  map[string]*backend.PrefillModel
	all     []*backend.Backend

	clock func() time.Time
	idx   *index.Index
	ring  atomic.Pointer[placement]
	next  atomic.Uint64
	seq   atomic.Uint64 // decisions so far: the clock of the recent shares (policySlot.recent)
	// peerRoutes: the peers' decisions are counted too (CountPeerRoutes), so that the
	// recent share is the fleet's and TieBreakLoad ranks by it.
	peerRoutes atomic.Bool
	// slots is the policy's own state per backend (slots.go): the recent shares.
	slots slotTable
}

// RecentHalfLife is the half-life, in routing decisions, of a backend's sum of the prefill
// work routed to it (its recent share: RoutedWork, RecentWork), by which a prefixlb replica
// alone, or peered replicas counting one another's decisions (CountPeerRoutes), break
// near-ties for new prefixes: about the last 185 decisions (128 ÷ ln 2) count, more than a
// few rounds of turns of the conversations in flight, so that a conversation between turns
// still counts where it is served.
const RecentHalfLife = 128

// placement is an immutable ring over the configured backends.
type placement struct {
	ring    *hashring.Ring
	ids     []uint64          // ring member → backend ID
	members []hashring.Member // what the ring was built from
}

// NewPrefix returns a prefix policy; clock (nil: time.Now) stamps learned prefixes. Call
// SetBackends before use: backends not set are neither learned nor placed by the ring.
func NewPrefix(o PrefixOptions, clock func() time.Time) *Prefix {
	if !(o.LoadFactor > 0) || math.IsInf(o.LoadFactor, 0) { // NaN too
		o.LoadFactor = DefaultLoadFactor
	}
	if o.HardLoadFactor == 0 || math.IsNaN(o.HardLoadFactor) {
		o.HardLoadFactor = DefaultHardLoadFactor
	}
	o.HardLoadFactor = max(o.HardLoadFactor, o.LoadFactor)
	switch {
	case o.LoadMargin == 0:
		o.LoadMargin = DefaultLoadMargin
	case o.LoadMargin < 0:
		o.LoadMargin = 0
	}
	if clock == nil {
		clock = time.Now
	}
	switch {
	case o.TieMargin == 0:
		o.TieMargin = DefaultTieMargin
	case o.TieMargin < 0:
		o.TieMargin = 0
	}
	if o.ChunkTokens <= 0 {
		o.ChunkTokens = key.DefaultChunkTokens
	}
	return &Prefix{
		chunkTokens: int64(o.ChunkTokens),
		sel: selection{loadFactor: o.LoadFactor, hardFactor: o.HardLoadFactor, margin: int64(o.LoadMargin),
			tieMargin: o.TieMargin, loadFirst: o.TieBreak == TieBreakLoad, auto: o.TieBreak == TieBreakAuto,
			spread: !o.NoSpreadNewPrefixes},
		clock:        clock,
		noCorrection: o.NoIndexCorrection,
		idx: index.New(index.Options{
			ChunkTokens:          o.ChunkTokens,
			DefaultKVCacheTokens: o.DefaultKVCacheTokens,
			MaxEntries:           o.MaxIndexEntries,
			CoarseWeight:         key.CoarseFactor,
		}),
	}
}

// SetBackends installs all configured backends (healthy or not): it rebuilds the hash ring
// and swaps it in when the backends or their weights changed, reads their KV capacities
// again, and drops the index entries and recent shares of backends no longer listed. Call it
// at start, on every reload and when a capacity changed (a scrape's cache_config_info),
// which keeps the ring.
func (p *Prefix) SetBackends(all []*backend.Backend) {
	ms := make([]hashring.Member, len(all))
	ids := make([]uint64, len(all))
	for i, b := range all {
		ms[i] = hashring.Member{Name: b.Name, Weight: b.Weight()}
		ids[i] = b.ID
	}
	if old := p.ring.Load(); old == nil || !slices.Equal(old.members, ms) {
		p.ring.Store(&placement{ring: hashring.New(ms), ids: ids, members: ms})
	}
	p.idx.SetBackends(all)
	p.slots.set(all)
	p.bindFleets(slices.Clone(all))
}

// Index is the policy's prefix index, for metrics and debugging.
func (p *Prefix) Index() *index.Index { return p.idx }

// maxStackCandidates is how many candidates Pick handles without allocating.
const maxStackCandidates = 32

// Pick chooses among candidates (healthy, not yet tried). Passthrough and parse-fallback
// are the Decider's: a body that did not parse has no chunks and is placed as below.
func (p *Prefix) Pick(k *key.Key, candidates []*backend.Backend) Decision {
	return p.pick(k, candidates, true)
}

// Preview is the Decision Pick would return now, without counting it anywhere (the recent
// share, the mean prefill work, the rotation of short prompts): /debug/route asks it, so that
// looking does not move where the next requests go.
func (p *Prefix) Preview(k *key.Key, candidates []*backend.Backend) Decision {
	return p.pick(k, candidates, false)
}

// pick is Pick; commit false leaves every counter as it is (Preview).
func (p *Prefix) pick(k *key.Key, candidates []*backend.Backend, commit bool) Decision {
	n := len(candidates)
	switch {
	case n == 0:
		return Decision{}
	case short(k):
		// Shorter than the head chunks (16 tokens) or not parsed: nothing to match or place
		// by (the first chunk alone is framing most prompts share; key.HeadChunks); rotate
		// among the least loaded so that short prompts do not all land on one backend at low
		// load. What chunk it has is still learned where it goes, for its follow-up.
		if !commit {
			return Decision{Backend: LeastLoaded(candidates, p.next.Load()), Reason: ReasonLeastLoad}
		}
		b := LeastLoaded(candidates, p.next.Add(1)-1)
		p.noteRouted(b, p.RoutedWork(k, 0))
		return Decision{Backend: b, Reason: ReasonLeastLoad}
	}
	var mbuf [maxStackCandidates]int
	var cbuf [maxStackCandidates]cand
	cs := p.snapshot(k, candidates, mbuf[:0], cbuf[:0])
	estimate(cs, p.costInput(k))
	j, r := pickCost(k.Chunks, cs, p.selection(k), p.ring.Load())
	c := &cs[j]
	if commit {
		p.noteRouted(candidates[j], p.RoutedWork(k, c.matched))
		p.meanWork.Observe(float64(c.work))
	}
	return Decision{Backend: candidates[j], Reason: r, MatchedChunks: c.matched, PrefillTokens: max(int64(k.PromptTokens)-int64(c.held), 1),
		PrefillWork: c.work, PredictedTTFT: estSeconds(c.est)}
}

// costInput is what estimate needs of k and the policy beyond the candidates.
func (p *Prefix) costInput(k *key.Key) costInput {
	return costInput{promptTokens: int64(k.PromptTokens), chunkTokens: int(p.chunkTokens), meanWork: p.meanWork.Mean()}
}

// noteRouted counts a decision of prefill work work (RoutedWork) for b's recent share, which
// TieBreakAuto reads while spreading new prefixes and every candidate is alone, and
// TieBreakLoad once the peers' decisions are counted too (CountPeerRoutes).
func (p *Prefix) noteRouted(b *backend.Backend, work int64) {
	if p.sel.spread && (p.sel.auto || p.peerRoutes.Load()) {
		p.slots.of(b).recent.Add(p.seq.Add(1), RecentHalfLife, float64(work))
	}
}

// RoutedWork is what a decision sending k to a backend that holds its first matched chunks
// adds to that backend's recent share (RecentWork): PrefillWork of the prompt after
// those chunks, in tokens, at least 1; for a body that did not parse (k nil, not OK, or no
// prompt tokens) the mean prefill work this policy routes (1 before any). Peered replicas
// send it with each decision they learn (package peering; a body that did not parse is not
// learned, and counts on its own replica only) so that every replica counts a decision alike.
//
// Weighed by work, not counted per request, which takes a replica given three long prompts
// for lighter than one given five short ones; it helps most where prompt sizes vary widely
// (the Mooncake trace) and costs a little on agent sessions, whose steps are light against
// their cold first requests. Reproduce with `prefixlb bench suite --workloads
// mooncake,agentic --levels medium,near-saturation --repeat 5 --policies prefix`.
func (p *Prefix) RoutedWork(k *key.Key, matched int) int64 {
	if k == nil || !k.OK || k.PromptTokens <= 0 {
		return max(int64(math.Round(p.meanWork.Mean())), 1)
	}
	prompt := int64(k.PromptTokens)
	return PrefillWork(prompt, min(int64(key.PrefixTokens(matched, int(p.chunkTokens))), prompt))
}

// CountPeerRoutes makes the recent share by which near-ties for new prefixes are ranked
// (RecentWork, RecentHalfLife) the fleet's: from then on NotePeerRouted counts the
// decisions of the prefixlb replicas this one is peered with (package peering), with its
// own, on one clock, and TieBreakLoad ranks near-ties by that share before their in-flight
// requests, as a replica alone does under TieBreakAuto. It does nothing under another
// TieBreak or with NoSpreadNewPrefixes (nothing would read the share). In-flight requests
// alone miss the conversations a replica serves between their turns, and leave peered
// replicas' traffic uneven (bench suite, agentic, prefix-x3+peer).
func (p *Prefix) CountPeerRoutes() {
	if p.sel.loadFirst && p.sel.spread {
		p.peerRoutes.Store(true)
	}
}

// NotePeerRouted counts a decision a peer made for b, of prefill work work (the peer's
// RoutedWork; see CountPeerRoutes). It does nothing unless CountPeerRoutes took effect.
func (p *Prefix) NotePeerRouted(b *backend.Backend, work int64) {
	if p.peerRoutes.Load() {
		p.slots.of(b).recent.Add(p.seq.Add(1), RecentHalfLife, float64(work))
	}
}

// RecentWork is b's recent share: the prefill work (tokens, RoutedWork) this policy counted
// for decisions sending prompts there, its peers' too with CountPeerRoutes, decayed by
// RecentHalfLife to the last decision counted anywhere. 0 for a backend with none counted;
// nothing is counted unless a tie-break reads it (see PrefixOptions.NoSpreadNewPrefixes).
func (p *Prefix) RecentWork(b *backend.Backend) float64 {
	s := p.slots.peek(b)
	if s == nil {
		return 0
	}
	return s.recent.Value(p.seq.Load(), RecentHalfLife)
}

// selection is p.sel with what CountPeerRoutes turned on and what k says of its first turn.
func (p *Prefix) selection(k *key.Key) selection {
	sel := p.sel
	sel.fleetRecent = p.peerRoutes.Load()
	sel.shortFirstTurn = k.ShortFirstTurn
	return sel
}

// snapshot reads each candidate's match and load into cs (matched and cs are scratch of any
// capacity; n ≤ maxStackCandidates needs none beyond the caller's arrays).
func (p *Prefix) snapshot(k *key.Key, candidates []*backend.Backend, matched []int, cs []cand) []cand {
	n := len(candidates)
	if cap(matched) < n {
		matched, cs = make([]int, 0, n), make([]cand, 0, n)
	}
	now, seq := p.clock(), p.seq.Load()
	allAlone := true
	matched = matched[:n]
	p.idx.Match(k.Chunks, candidates, matched)
	for j, b := range candidates {
		// Each group of the backend's state read once: the health checker's report, the
		// peers' load, this proxy's counts and the settings (backend.Backend).
		rep, peers, own, set := b.HealthReport(), b.PeerLoad(), b.Counts(), b.Settings()
		// Peers' (peering) in-flight requests are known, and their queued prefill tokens:
		// they count as queued work, not as foreign requests of unknown size. Beyond them
		// and this proxy's own, what the replica's last scrape reported when it was read
		// (HealthReport.Excess), not beyond the in-flight count now, which would also take
		// this proxy's and its peers' requests answered since the scrape (up to an interval
		// old) for other senders' work and send bursts away from replicas that had just
		// answered. inFlight below is backend.Busy, from the same reads.
		c := cand{id: b.ID, inFlight: own.InFlight + peers.InFlight + rep.Excess, weight: set.Weight, matched: matched[j],
			queued: b.QueuedPrefill(now), own: own.InFlight, pending: own.PrefillRequests,
			foreign: rep.Excess, kvUsage: rep.KVUsage, alone: rep.Senders == backend.SendersAlone,
			decodes: own.Decoding, context: own.DecodingTokens}
		c.rate, _ = b.Prefill().Rate()
		if base, ok := b.Prefill().Base(); ok {
			c.base = base.Seconds()
		}
		c.fleet = b.FleetPrefill() // its pool (fleetModel), learned or not
		if f := c.fleet; f != nil && (c.rate <= 0 || c.base <= 0) {
			// What the pool learned stands in only for a replica that has not (estimate).
			c.fleetRate, _ = f.Rate()
			if base, ok := f.Base(); ok {
				c.fleetBase = base.Seconds()
			}
		}
		allAlone = allAlone && c.alone
		cs = append(cs, c)
	}
	if p.sel.spread && (p.sel.auto && allAlone || p.sel.loadFirst && p.peerRoutes.Load()) {
		// Only a replica alone, or peered ones counting the fleet's decisions, rank
		// near-ties by recent share (pickCost): a lock and an exp2 per candidate that every
		// other decision skips.
		for j, b := range candidates {
			if ps := p.slots.peek(b); ps != nil {
				cs[j].recent = ps.recent.Value(seq, RecentHalfLife)
			}
		}
	}
	return cs
}

// short reports whether Pick places k without estimates, by load alone: no key, or fewer
// chunks than key.HeadChunks (a prompt shorter than 16 tokens at the default chunk size).
func short(k *key.Key) bool { return k == nil || len(k.Chunks) < key.HeadChunks }

// Explain returns what Pick weighs for k, per candidate, in candidates' order (for
// /debug/route); nil for a key Pick places without estimates (short).
func (p *Prefix) Explain(k *key.Key, candidates []*backend.Backend) []CandidateEstimate {
	if short(k) || len(candidates) == 0 {
		return nil
	}
	cs := p.snapshot(k, candidates, nil, nil)
	estimate(cs, p.costInput(k))
	var total int64
	wsum := 0
	for _, c := range cs {
		total += c.inFlight
		wsum += max(c.weight, 1)
	}
	out := make([]CandidateEstimate, len(cs))
	for j, c := range cs {
		m := candidates[j].Prefill()
		rate, learned := m.Rate()
		base, _ := m.Base()
		out[j] = CandidateEstimate{Backend: candidates[j].Name, MatchedChunks: c.matched, HeldTokens: int64(c.held),
			QueuedTokens: c.queued, ForeignRequests: c.foreign, DecodingRequests: c.decodes, DecodingTokens: c.context,
			DecodeWork: c.decode, KVCacheUsage: c.kvUsage, PrefillRate: rate,
			RateLearned: learned, BaseMs: float64(base) / float64(time.Millisecond), PredictedTTFTMs: c.est * 1000,
			InFlight: c.inFlight, RecentWork: c.recent, OtherSenders: candidates[j].OtherSenders().String()}
		soft, hard := p.sel.caps(total, max(c.weight, 1), wsum)
		out[j].UnderCap, out[j].UnderHardCap = c.inFlight < soft, c.inFlight < hard
	}
	return out
}

// Learn records that b now holds every chunk of k's prompt; held is how many leading chunks
// b was found to hold when the request was routed (0 if unknown), see index.RecordHeld.
// Which requests are learned is the Decider's to say (Decider.Ticket: those whose key
// parsed); a key without chunks learns nothing.
func (p *Prefix) Learn(k *key.Key, b *backend.Backend, held int) Learned {
	if k == nil || b == nil {
		return 0
	}
	return Learned(p.idx.RecordHeld(k.Chunks, b, p.clock(), held))
}

// Unlearn withdraws what Learn(k, b) returning l added: b refused the request, so its KV
// cache did not gain the prompt. What b held before, or has been learned to hold since by
// another request, stays.
func (p *Prefix) Unlearn(k *key.Key, b *backend.Backend, l Learned) {
	if k == nil || l == 0 || b == nil {
		return
	}
	p.idx.Forget(k.Chunks, b, index.Stamp(l))
}

var (
	_ Policy    = (*Prefix)(nil)
	_ Fleet     = (*Prefix)(nil)
	_ Learner   = (*Prefix)(nil)
	_ Inspector = (*Prefix)(nil)
)
