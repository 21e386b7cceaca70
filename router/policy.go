// Package router decides which backend serves a request. A Policy picks; it never does I/O.
// Modes (modes.go): prefix (the default), round-robin and least-load. The Decider wraps a
// mode's policy with the rules every mode shares (passthrough, parse-fallback, retries).
package router

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// Reason says why a backend was chosen. It labels metrics and the x-prefixlb-route header.
type Reason uint8

const (
	// ReasonRoundRobin: mode round-robin, or the last resort of another mode.
	ReasonRoundRobin Reason = iota
	// ReasonLeastLoad: mode least-load, or a prefix-mode request too short to hold its head
	// chunks (key.HeadChunks: 16 tokens at the default chunk size).
	ReasonLeastLoad
	// ReasonMatch: the backend holds a useful prefix of the prompt.
	ReasonMatch
	// ReasonCold: no useful match (or only a thin one that spreading set aside on a replica
	// above its share of load); placed by load and the consistent hash of the first chunks.
	ReasonCold
	// ReasonOverload: the best match was over the bounded-load cap, or estimated slower than
	// another candidate; the next best was taken.
	ReasonOverload
	// ReasonParseFallback: a prefix-routed endpoint whose body did not parse.
	ReasonParseFallback
	// ReasonPassthrough: an endpoint that is not prefix-routed (/v1/models, /v1/rerank, ...).
	ReasonPassthrough
)

var reasonNames = [...]string{"round-robin", "least-load", "match", "cold", "overload-fallback", "parse-fallback", "passthrough"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", r)
}

// Decision is the outcome of a pick.
type Decision struct {
	// Backend is the chosen backend; nil only when there were no candidates.
	Backend *backend.Backend
	Reason  Reason
	// MatchedChunks is how many leading chunks of the prompt the chosen backend holds.
	MatchedChunks int
	// PrefillTokens is the prompt tokens the policy predicts the chosen backend must prefill
	// (0: no prediction; the proxy counts the whole prompt).
	PrefillTokens int64
	// PrefillWork is that prefill in tokens' worth of work, attention included (PrefillWork:
	// a token deep in a long context costs more), as the backend's queue counts it (0: no
	// prediction; the proxy counts PrefillWork(prompt, 0)).
	PrefillWork int64
	// PredictedTTFT is the policy's estimate of the time to first token there (0: none).
	PredictedTTFT time.Duration
}

// Policy picks a backend for one request among candidates (healthy, not yet tried).
// It must be safe for concurrent use and must not retain candidates. Beside Pick and Preview
// it may have abilities (abilities.go: Fleet, Learner, Settler, Repicker, Inspector).
type Policy interface {
	// Pick decides a request and records the decision where the policy counts its decisions
	// (a round-robin turn, the recent share of each backend, the mean prefill work).
	Pick(k *key.Key, candidates []*backend.Backend) Decision
	// Preview returns the Decision Pick would return now and records nothing: /debug/route
	// asks it, so that looking does not move where the next requests go. It is part of every
	// policy, so that no wrapper can lose it.
	Preview(k *key.Key, candidates []*backend.Backend) Decision
}

// CandidateEstimate is one candidate as the prefix policy's cost model sees it.
type CandidateEstimate struct {
	Backend       string `json:"backend"`
	MatchedChunks int    `json:"matched_chunks"`
	// HeldTokens is the prompt tokens counted as held, after the KV-pressure discount.
	HeldTokens int64 `json:"held_tokens"`
	// QueuedTokens is this proxy's prefill work queued there, less what the replica has
	// likely worked off since its queue last moved (backend.QueuedPrefill), plus its peers';
	// ForeignRequests the requests the replica's last scrape reported beyond this proxy's and
	// its peers' in flight when it was read (backend.ScrapedExcess).
	QueuedTokens    int64 `json:"queued_prefill_tokens"`
	ForeignRequests int64 `json:"foreign_requests"`
	// DecodingRequests and DecodingTokens are this proxy's streamed requests decoding there
	// and their prompt tokens (backend.Decoding); DecodeWork the prefill work they add to
	// this request's estimate (backend.DecodeWork).
	DecodingRequests int64   `json:"decoding_requests"`
	DecodingTokens   int64   `json:"decoding_context_tokens"`
	DecodeWork       int64   `json:"decode_work_tokens"`
	KVCacheUsage     float64 `json:"kv_cache_usage"`
	// PrefillRate (tokens/s) and BaseMs are the replica's learned prefill model (0 and
	// RateLearned false until learned: the median of its model pool's learned replicas, the
	// pool's pooled model or the defaults stand in).
	PrefillRate     float64 `json:"prefill_tokens_per_s"`
	RateLearned     bool    `json:"rate_learned"`
	BaseMs          float64 `json:"base_ms"`
	PredictedTTFTMs float64 `json:"predicted_ttft_ms"`
	// InFlight is the load the caps count: this proxy's and its peers' in-flight requests
	// there plus ForeignRequests.
	InFlight int64 `json:"in_flight"`
	// RecentWork is the decaying sum of the prefill work (tokens, Prefix.RoutedWork) routed
	// there lately (Prefix.RecentWork, RecentHalfLife; the peers' too when peered) by which
	// near-ties for a new prefix are ranked first; 0 where it is not read (near-ties by the
	// ring, or in-flight alone).
	RecentWork float64 `json:"recent_work_tokens"`
	// UnderCap: under the bounded-load cap; UnderHardCap: under the hard cap, up to which a
	// candidate over the cap still wins when its estimate beats every one under it.
	UnderCap     bool `json:"under_load_cap"`
	UnderHardCap bool `json:"under_hard_load_cap"`
	// OtherSenders is the health checker's verdict on who else sends to the replica (alone,
	// shared or unknown): tie_break auto breaks near-ties by load only while all are alone
	// (or peering is on, which makes auto load).
	OtherSenders string `json:"other_senders"`
}

// RoundRobin cycles through the candidates, with one turn counter per model (a slot chosen
// by a hash of the request's model): the proxy hands it each model's pool, and one shared
// counter would let one model's requests skip backends of another's pool (two models
// alternating on a pool of two would send every request of each to the same backend).
type RoundRobin struct{ next [rrSlots]atomic.Uint64 }

// rrSlots is the number of round-robin turn counters: models whose hashes share a slot share
// a counter, which only makes their turns interleave.
const rrSlots = 16

// rrSlot is the counter of k's model: slot 0 for no model.
func rrSlot(k *key.Key) int {
	if k == nil || len(k.Model) == 0 {
		return 0
	}
	return 1 + int(xxhash.Sum64(k.Model)%(rrSlots-1))
}

// Pick returns the next candidate in turn.
func (p *RoundRobin) Pick(k *key.Key, cs []*backend.Backend) Decision {
	if len(cs) == 0 {
		return Decision{}
	}
	i := p.next[rrSlot(k)].Add(1) - 1
	return Decision{Backend: cs[i%uint64(len(cs))], Reason: ReasonRoundRobin}
}

// Preview is the candidate whose turn it is, without taking the turn.
func (p *RoundRobin) Preview(k *key.Key, cs []*backend.Backend) Decision {
	if len(cs) == 0 {
		return Decision{}
	}
	i := p.next[rrSlot(k)].Load()
	return Decision{Backend: cs[i%uint64(len(cs))], Reason: ReasonRoundRobin}
}

// Repick takes the candidate at seq in turn, keeping failed's reason. It leaves the shared
// counter alone: a retry that advanced it a second time would shift the first attempts of
// the requests after it, and with two backends send every first attempt to the same one.
func (p *RoundRobin) Repick(_ *key.Key, failed Decision, cs []*backend.Backend, seq uint64) Decision {
	if len(cs) == 0 {
		return Decision{}
	}
	failed.Backend = cs[seq%uint64(len(cs))]
	return failed
}

// LeastLoad picks the candidate with the lowest backend.Busy (this proxy's and its peers'
// in-flight requests, plus the other senders' the replica's last scrape reported). Among
// equals it takes the first found from a rotating start position, so ties do not favour the
// first backend.
type LeastLoad struct{ next atomic.Uint64 }

// Pick returns a least-loaded candidate.
func (p *LeastLoad) Pick(_ *key.Key, cs []*backend.Backend) Decision {
	b := LeastLoaded(cs, p.next.Add(1)-1)
	return Decision{Backend: b, Reason: ReasonLeastLoad}
}

// Preview is Pick without moving the start position of the scan.
func (p *LeastLoad) Preview(_ *key.Key, cs []*backend.Backend) Decision {
	return Decision{Backend: LeastLoaded(cs, p.next.Load()), Reason: ReasonLeastLoad}
}

// LeastLoaded returns the candidate with the lowest backend.Busy; the scan starts at
// start mod len(cs), so ties resolve to the first minimum after that position. Nil if empty.
func LeastLoaded(cs []*backend.Backend, start uint64) *backend.Backend {
	n := len(cs)
	if n == 0 {
		return nil
	}
	s := int(start % uint64(n))
	best := cs[s]
	bl := best.Busy()
	for j := 1; j < n; j++ {
		c := cs[(s+j)%n]
		if l := c.Busy(); l < bl {
			best, bl = c, l
		}
	}
	return best
}

var (
	_ Policy   = (*RoundRobin)(nil)
	_ Repicker = (*RoundRobin)(nil)
	_ Policy   = (*LeastLoad)(nil)
)
