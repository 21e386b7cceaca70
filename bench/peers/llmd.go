package peers

import (
	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// Defaults of llm-d's optimized baseline, the profile llm-d's guides deploy: llm-d/llm-d
// guides/optimized-baseline/router/optimized-baseline.values.yaml lists the plugins with no
// parameters, so each runs with its built-in defaults in llm-d/llm-d-router.
const (
	// DefaultLLMDAffinityThreshold is prefix-cache-affinity-filter's affinityThreshold, 0.80
	// (pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go).
	DefaultLLMDAffinityThreshold = 0.80
	// DefaultLLMDMaxTTFTPenaltySeconds is the filter's maxTTFTPenaltyMs, 18,000 ms.
	DefaultLLMDMaxTTFTPenaltySeconds = 18.0
	// DefaultLLMDPeakPrefillThroughput is the filter's peakPrefillThroughput, 15,928
	// tokens/s (calibrated there for Qwen3-32B on 2 × H100, TP 2, vLLM 0.19).
	DefaultLLMDPeakPrefillThroughput = 15928.0
	// DefaultLLMDQueueThresholdTokens is token-load-scorer's queueThresholdTokens, 4,194,304
	// (pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load.go).
	DefaultLLMDQueueThresholdTokens = 4194304
)

// LLMDOptions tune the llm-d peer; zero fields take the defaults above.
type LLMDOptions struct {
	// Prefix sizes the approximate index (chunk size, capacity), as prefix mode's.
	Prefix router.PrefixOptions
	// AffinityThreshold is the prefix score (matched ÷ prompt blocks) from which a
	// candidate is sticky.
	AffinityThreshold float64
	// MaxTTFTPenaltySeconds and PeakPrefillThroughput (tokens/s) are the filter's load gate.
	MaxTTFTPenaltySeconds, PeakPrefillThroughput float64
	// QueueThresholdTokens is where token-load-scorer's score reaches 0.
	QueueThresholdTokens int64
}

// LLMD is llm-d's optimized baseline, the scheduling profile llm-d's guides deploy and
// report about 2× the throughput of the older default profile (guides/optimized-baseline/
// README.md and benchmark-results): prefix-cache-affinity-filter, then token-load-scorer,
// max-score picker, fed by approx-prefix-cache-producer and inflight-load-producer. Sources:
// llm-d/llm-d guides/optimized-baseline/router/optimized-baseline.values.yaml; llm-d/llm-d-router
// pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/{plugin.go,README.md},
// scheduling/scorer/tokenload/token_load.go, requestcontrol/dataproducer/inflightload/
// producer.go (uncachedInputTokens, the release at the first streamed chunk) and
// dataproducer/approximateprefix (matched ÷ total blocks). Summarised in
// ../shared/research/peer-audit-2026-12.md.
//
//   - prefix score: matched ÷ the prompt's blocks from prefixlb's approximate index (which,
//     like the producer, records each request's blocks for the backend it was sent to), a
//     block being a prefixlb chunk counted by the tokens it spans (key.PrefixTokens).
//   - in-flight tokens of a candidate: the uncached prompt tokens (prompt − held) of this
//     router's requests there that have not produced a first byte. The policy hands that
//     count to the proxy as the decision's PrefillWork (at least 1), which the proxy's lease
//     holds in backend.PrefillTokens until the first response byte, as inflight-load-producer
//     holds a streamed request's tokens until its first chunk (output tokens not added, its
//     default). It is this router's own count (one EPP process).
//   - filter: the candidates scoring ≥ AffinityThreshold are sticky. None sticky: all stay.
//     Else, when some are not sticky and (least in-flight tokens of a sticky one − least of a
//     non-sticky one) ÷ PeakPrefillThroughput exceeds MaxTTFTPenaltySeconds (a gap of
//     286,704 tokens at the defaults; a token count, so no speedup applies), all stay; else
//     only the sticky ones. Exploration is 0, its default.
//   - token-load-scorer: 1 − min(1, (in-flight tokens + this request's uncached tokens
//     there) ÷ QueueThresholdTokens), weight 1; the highest score wins, ties at random (here:
//     a rotating start).
//
// The reason is router.ReasonOverload when the load gate opened a sticky set and the pick is
// not sticky, else router.ReasonMatch when the chosen candidate holds part of the prompt,
// else router.ReasonLeastLoad.
type LLMD struct {
	tree
	o   LLMDOptions
	rot rotor
}

// NewLLMD returns an llm-d optimized-baseline policy; call SetBackends before use.
func NewLLMD(o LLMDOptions) *LLMD {
	if o.AffinityThreshold <= 0 {
		o.AffinityThreshold = DefaultLLMDAffinityThreshold
	}
	if o.MaxTTFTPenaltySeconds <= 0 {
		o.MaxTTFTPenaltySeconds = DefaultLLMDMaxTTFTPenaltySeconds
	}
	if o.PeakPrefillThroughput <= 0 {
		o.PeakPrefillThroughput = DefaultLLMDPeakPrefillThroughput
	}
	if o.QueueThresholdTokens <= 0 {
		o.QueueThresholdTokens = DefaultLLMDQueueThresholdTokens
	}
	t := newTree(o.Prefix)
	o.Prefix.ChunkTokens = t.chunkTokens
	return &LLMD{tree: t, o: o}
}

// Pick returns the candidate of the least token load among those the affinity filter keeps.
func (p *LLMD) Pick(k *key.Key, cs []*backend.Backend) router.Decision { return p.pick(k, cs, true) }

// Preview is Pick without turning the rotation.
func (p *LLMD) Preview(k *key.Key, cs []*backend.Backend) router.Decision {
	return p.pick(k, cs, false)
}

func (p *LLMD) pick(k *key.Key, cs []*backend.Backend, commit bool) router.Decision {
	n := len(cs)
	if n == 0 {
		return router.Decision{}
	}
	prompt, chunked := 0, 0
	if k != nil {
		prompt, chunked = k.PromptTokens, key.PrefixTokens(len(k.Chunks), p.chunkTokens)
	}
	matched := p.match(k, cs)
	sticky := make([]bool, n)
	uncached := make([]int64, n)
	inflight := make([]int64, n)
	nSticky := 0
	var bestSticky, bestOther int64 = -1, -1
	for j, b := range cs {
		held := 0
		if k != nil {
			held = p.heldTokens(k, matched[j])
		}
		uncached[j] = int64(max(prompt-held, 0))
		inflight[j] = b.PrefillTokens()
		if chunked > 0 && float64(key.PrefixTokens(matched[j], p.chunkTokens))/float64(chunked) >= p.o.AffinityThreshold {
			sticky[j] = true
			nSticky++
			if bestSticky < 0 || inflight[j] < bestSticky {
				bestSticky = inflight[j]
			}
		} else if bestOther < 0 || inflight[j] < bestOther {
			bestOther = inflight[j]
		}
	}
	filtered, gateOpened := nSticky > 0 && n > 1, false
	if filtered && bestOther >= 0 && float64(bestSticky-bestOther)/p.o.PeakPrefillThroughput > p.o.MaxTTFTPenaltySeconds {
		filtered, gateOpened = false, true
	}
	limit := float64(p.o.QueueThresholdTokens)
	j := argmin(n, p.rot.startAt(commit), func(j int) float64 {
		if filtered && !sticky[j] {
			return 2 * limit // filtered out: above every kept candidate's capped load
		}
		return min(float64(inflight[j]+uncached[j]), limit)
	})
	r := router.ReasonLeastLoad
	switch {
	case gateOpened && !sticky[j]:
		r = router.ReasonOverload
	case matched[j] > 0:
		r = router.ReasonMatch
	}
	return router.Decision{Backend: cs[j], Reason: r, MatchedChunks: matched[j],
		PrefillTokens: uncached[j], PrefillWork: max(uncached[j], 1)}
}

var (
	_ router.Policy    = (*LLMD)(nil)
	_ router.Fleet     = (*LLMD)(nil)
	_ router.Learner   = (*LLMD)(nil)
	_ router.Inspector = (*LLMD)(nil)
)
