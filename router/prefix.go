package router

import (
	"math"
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
	// MaxIndexEntries caps the prefix index's (chunk, backend) entries (index.Options.MaxEntries).
	MaxIndexEntries int
	// DefaultKVCacheTokens is a backend's KV capacity in tokens when its KVCacheTokens is 0
	// (index.Options.DefaultKVCacheTokens).
	DefaultKVCacheTokens int64
}

// Prefix is the policy of mode prefix: send a request to the candidate that holds the
// longest useful prefix of its prompt, within a bounded load; place prompts nobody usefully
// holds by consistent hashing with bounded loads. It is safe for concurrent use.
//
// A prefix held by every candidate (a hot shared system prompt) does not decide: candidates
// are ranked by what they hold beyond it, then by load, then by a hash of (first chunk,
// backend ID), never by list order. No candidate takes a request once its in-flight count
// reaches ceil(c × (total + 1) × w / W) + margin (w its weight, W the candidates' sum).
type Prefix struct {
	chunkTokens int64   // chunk size in approximate tokens
	loadFactor  float64 // c in the bounded-load cap
	margin      int64   // the cap's absolute margin in requests
	clock       func() time.Time
	idx         *index.Index
	ring        atomic.Pointer[placement]
	next        atomic.Uint64
}

// placement is an immutable ring over the configured backends.
type placement struct {
	ring *hashring.Ring
	ids  []uint64 // ring member → backend ID
}

// NewPrefix returns a prefix policy; clock (nil: time.Now) stamps learned prefixes. Call
// SetBackends before use: backends not set are neither learned nor placed by the ring.
func NewPrefix(o PrefixOptions, clock func() time.Time) *Prefix {
	if o.LoadFactor <= 0 {
		o.LoadFactor = DefaultLoadFactor
	}
	switch {
	case o.LoadMargin == 0:
		o.LoadMargin = DefaultLoadMargin
	case o.LoadMargin < 0:
		o.LoadMargin = 0
	}
	if clock == nil {
		clock = time.Now
	}
	if o.ChunkTokens <= 0 {
		o.ChunkTokens = key.DefaultChunkTokens
	}
	return &Prefix{
		chunkTokens: int64(o.ChunkTokens),
		loadFactor:  o.LoadFactor,
		margin:      int64(o.LoadMargin),
		clock:       clock,
		idx: index.New(index.Options{
			ChunkTokens:          o.ChunkTokens,
			DefaultKVCacheTokens: o.DefaultKVCacheTokens,
			MaxEntries:           o.MaxIndexEntries,
		}),
	}
}

// SetBackends installs all configured backends (healthy or not): it rebuilds the hash ring
// and swaps it in, and drops the index entries of backends no longer listed. Call it at
// start and on every reload.
func (p *Prefix) SetBackends(all []*backend.Backend) {
	ms := make([]hashring.Member, len(all))
	ids := make([]uint64, len(all))
	for i, b := range all {
		ms[i] = hashring.Member{Name: b.Name, Weight: b.Weight}
		ids[i] = b.ID
	}
	p.ring.Store(&placement{ring: hashring.New(ms), ids: ids})
	p.idx.SetBackends(all)
}

// Index is the policy's prefix index, for metrics and debugging.
func (p *Prefix) Index() *index.Index { return p.idx }

// maxStackCandidates is how many candidates Pick handles without allocating.
const maxStackCandidates = 32

// Pick chooses among candidates (healthy, not yet tried). Passthrough and parse-fallback
// are the Decider's: a body that did not parse has no chunks and is placed as below.
func (p *Prefix) Pick(k *key.Key, candidates []*backend.Backend) Decision {
	n := len(candidates)
	switch {
	case n == 0:
		return Decision{}
	case k == nil || len(k.Chunks) == 0:
		// Shorter than one chunk (or not parsed): nothing to match or place; rotate among
		// the least loaded so that short prompts do not all land on one backend at low load.
		return Decision{Backend: LeastLoaded(candidates, p.next.Add(1)-1), Reason: ReasonLeastLoad}
	}
	var mbuf [maxStackCandidates]int
	var cbuf [maxStackCandidates]cand
	matched, cs := mbuf[:0], cbuf[:0]
	if n > maxStackCandidates {
		matched, cs = make([]int, 0, n), make([]cand, 0, n)
	}
	matched = matched[:n]
	p.idx.Match(k.Chunks, candidates, matched)
	for j, b := range candidates {
		cs = append(cs, cand{id: b.ID, inFlight: b.Load(), prefill: b.PrefillTokens(), weight: b.Weight, matched: matched[j]})
	}
	j, r := pickPrefix(k.Chunks, cs, p.loadFactor, p.margin, p.ring.Load(), thin{chunkTokens: p.chunkTokens, promptTokens: int64(k.PromptTokens)})
	return Decision{Backend: candidates[j], Reason: r, MatchedChunks: matched[j]}
}

// Learn records that b now holds every chunk of k's prompt; held is how many leading chunks
// b was found to hold when the request was routed (0 if unknown), see index.RecordHeld.
func (p *Prefix) Learn(k *key.Key, b *backend.Backend, held int) Learned {
	if k == nil || !k.Routed || !k.OK || b == nil {
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

// cand is one candidate as the selection sees it: a snapshot, so one decision uses one
// consistent view of the loads.
type cand struct {
	id uint64
	// inFlight is the backend's Load: its in-flight count, or the running + waiting requests
	// the replica reported when higher (another prefixlb replica's traffic, other clients).
	inFlight int64
	prefill  int64 // pending prefill tokens
	weight   int
	matched  int // leading chunks of the prompt the backend holds
}

// loadCap is the bounded-load cap of a backend of weight w: ceil(c·(total+1)·w/W) + margin.
// The +1 counts the request being placed; the margin keeps low load from flapping, where
// the relative bound alone is a request or two.
func loadCap(total int64, w, wsum int, loadFactor float64, margin int64) int64 {
	return int64(math.Ceil(loadFactor*float64(total+1)*float64(w)/float64(wsum))) + margin
}

// pickPrefix is the selection of mode prefix over a snapshot of the candidates; it returns
// the chosen index into cs and why. place may be nil (no ring).
//
//  1. The useful match of a candidate is what it holds beyond the prefix every candidate
//     holds. Among candidates under the cap, the best useful match wins (ReasonMatch);
//     if the best overall is over the cap, the best under it (ReasonOverload).
//  2. Nobody usefully under the cap: the ring places the prompt by the first chunk beyond
//     the common prefix, walking past candidates at the cap (ReasonCold, or
//     ReasonOverload when a useful holder was full). Hashing the chunk after the common
//     part spreads requests that share only a hot system prompt, while a conversation's
//     later turns, which keep that chunk, hash where its first turn did.
//  3. No chunk or no candidate on the ring: the least loaded (ReasonLeastLoad).
//
// A thin match (rule): when the best holder's useful match is under a quarter of the prompt
// and the holder already carries more than its fair share of the load, the match is not
// worth concentrating load for: the ring places the request by the first chunk nobody
// holds, and its new backend learns the shared part. This keeps a prefix that one replica
// learned first (Mooncake's block shared by every request, a hot system prompt before every
// backend has it) from pulling all requests to that replica until the cap binds, while a
// conversation's turns (match ≈ the whole prompt) and shared-prefix groups (long system
// prompt, short question) stay sticky.
func pickPrefix(chunks []uint64, cs []cand, loadFactor float64, margin int64, place *placement, rule thin) (int, Reason) {
	var total int64
	wsum, common := 0, math.MaxInt
	for i := range cs {
		cs[i].weight = max(cs[i].weight, 1)
		total += cs[i].inFlight
		wsum += cs[i].weight
		common = min(common, cs[i].matched)
	}
	var first uint64
	if len(chunks) > 0 {
		first = chunks[0]
	}
	under := func(j int) bool {
		return cs[j].inFlight < loadCap(total, cs[j].weight, wsum, loadFactor, margin)
	}
	best, bestUnder := -1, -1
	for j := range cs {
		if cs[j].matched == common {
			continue
		}
		if best < 0 || better(&cs[j], &cs[best], first) {
			best = j
		}
		if under(j) && (bestUnder < 0 || better(&cs[j], &cs[bestUnder], first)) {
			bestUnder = j
		}
	}
	ringAt := common
	if bestUnder >= 0 && rule.chunkTokens > 0 && rule.promptTokens > 0 {
		holder := &cs[bestUnder]
		useful := int64(key.PrefixTokens(holder.matched, int(rule.chunkTokens)) - key.PrefixTokens(common, int(rule.chunkTokens)))
		if useful*thinShare < rule.promptTokens && holder.inFlight*int64(wsum) > total*int64(holder.weight) {
			ringAt, bestUnder = holder.matched, -1
		}
	}
	switch {
	case bestUnder >= 0 && bestUnder == best:
		return best, ReasonMatch
	case bestUnder >= 0:
		return bestUnder, ReasonOverload
	}
	reason := ReasonCold
	if best >= 0 {
		reason = ReasonOverload
	}
	if len(chunks) > 0 && place != nil {
		chosen := -1
		place.ring.Lookup(chunks[min(ringAt, len(chunks)-1)], func(m int) bool {
			for j := range cs {
				if cs[j].id == place.ids[m] && under(j) {
					chosen = j
					return true
				}
			}
			return false
		})
		if chosen >= 0 {
			return chosen, reason
		}
	}
	least := 0
	for j := 1; j < len(cs); j++ {
		if lighter(&cs[j], &cs[least], first) {
			least = j
		}
	}
	if reason == ReasonCold {
		reason = ReasonLeastLoad
	}
	return least, reason
}

// thin carries what the thin-match rule needs: chunk size and prompt length, in approximate
// tokens (zero values turn the rule off).
type thin struct{ chunkTokens, promptTokens int64 }

// thinShare: a useful match under 1/thinShare of the prompt is thin.
const thinShare = 4

// better ranks a before b by match, then load, then the tie hash.
func better(a, b *cand, first uint64) bool {
	if a.matched != b.matched {
		return a.matched > b.matched
	}
	return lighter(a, b, first)
}

// lighter ranks a before b by in-flight requests per weight, then pending prefill tokens
// per weight, then a hash of (first chunk, backend ID): deterministic, the same in every
// prefixlb replica, and different per prompt so that ties do not all go one way.
func lighter(a, b *cand, first uint64) bool {
	if l, r := a.inFlight*int64(b.weight), b.inFlight*int64(a.weight); l != r {
		return l < r
	}
	if l, r := a.prefill*int64(b.weight), b.prefill*int64(a.weight); l != r {
		return l < r
	}
	return mix(first^a.id) < mix(first^b.id)
}

// mix is the splitmix64 finaliser: a cheap bijection that spreads nearby inputs.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

var (
	_ Policy        = (*Prefix)(nil)
	_ BackendSetter = (*Prefix)(nil)
	_ Learner       = (*Prefix)(nil)
	_ IndexHolder   = (*Prefix)(nil)
)
