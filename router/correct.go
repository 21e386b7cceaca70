package router

import (
	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// The shortfall rule's constants (see Shortfall).
const (
	// shortfallShare is the share of the predicted cached tokens a backend may report
	// missing before the index is corrected: below 3/4 of the prediction (and a chunk
	// short) the backend lost what the index lists, well beyond the few tokens the two
	// tokenizations disagree by.
	shortfallShare = 0.25
	// blockSlackTokens is what a backend's cached-token count may fall short of a chunk
	// boundary and still count that chunk as held: vLLM counts cached tokens in whole KV
	// blocks, 16 tokens by default (cache_config.block_size), and always recomputes at least
	// the prompt's last token.
	blockSlackTokens = 16
)

// CacheReport is what a backend answered about one request's prompt, beside what the policy
// predicted when it routed it there.
type CacheReport struct {
	// MatchedChunks is the leading chunks of the prompt the index listed the backend as
	// holding (Decision.MatchedChunks).
	MatchedChunks int
	// ChunkTokens is the chunk size in approximate tokens, as the key was built with.
	ChunkTokens int
	// PromptTokens is the key's approximate prompt length (key.Key.PromptTokens).
	PromptTokens int
	// ReportedPrompt and ReportedCached are the backend's usage.prompt_tokens and
	// usage.prompt_tokens_details.cached_tokens, in its own tokens.
	ReportedPrompt, ReportedCached int
}

// Shortfall applies the correction rule to r: it returns how many of the matched chunks the
// backend's report shows it had lost (0: none worth correcting). Tokens are compared in the
// key's approximate tokens: the reported cached tokens are scaled by the key's prompt
// length over the reported one (the two tokenizations differ; their ratio carries over), as
// prefixlb_backend_predicted_cached_tokens_total compares them. With P the matched chunks'
// tokens (at most the prompt) and C the reported cached tokens so scaled, the backend fell
// short when
//
//	C < P − max(chunk tokens, shortfallShare × P)
//
// and then it held the leading chunks that end within C + blockSlackTokens (none when C is
// 0): the shortfall is the matched chunks beyond them. A request without a prediction (no
// match) or without a report (ReportedPrompt 0: the backend gave no usage) has none. Pure.
func Shortfall(r CacheReport) int {
	if r.MatchedChunks <= 0 || r.ReportedPrompt <= 0 || r.PromptTokens <= 0 {
		return 0
	}
	chunkTokens := r.ChunkTokens
	if chunkTokens <= 0 {
		chunkTokens = key.DefaultChunkTokens
	}
	predicted := float64(min(key.PrefixTokens(r.MatchedChunks, chunkTokens), r.PromptTokens))
	cached := float64(min(max(r.ReportedCached, 0), r.ReportedPrompt)) * float64(r.PromptTokens) / float64(r.ReportedPrompt)
	if cached >= predicted-max(float64(chunkTokens), shortfallShare*predicted) {
		return 0
	}
	held := 0
	for cached > 0 && held < r.MatchedChunks && float64(key.PrefixTokens(held+1, chunkTokens)) <= cached+blockSlackTokens {
		held++
	}
	return r.MatchedChunks - held
}

// Correct applies Shortfall to what b reported for k's request, routed with r.MatchedChunks
// matched, and when b fell short corrects b's index entries (index.Index.Correct: the
// entries b evicted before the lost prefix go, and b's modelled capacity shrinks toward
// its own). r.ChunkTokens and r.PromptTokens are taken from the policy and k. It returns the
// entries dropped. It allocates nothing.
func (p *Prefix) Correct(k *key.Key, b *backend.Backend, l Learned, r CacheReport) int {
	if p.noCorrection || k == nil || b == nil || l == 0 {
		return 0
	}
	r.ChunkTokens, r.PromptTokens = int(p.chunkTokens), k.PromptTokens
	n := Shortfall(r)
	if n == 0 {
		return 0
	}
	// In the index's units: a coarse chunk counts key.CoarseFactor of its capacity.
	return p.idx.Correct(b, index.Stamp(l), key.ChunkUnits(r.MatchedChunks-n, r.MatchedChunks))
}
