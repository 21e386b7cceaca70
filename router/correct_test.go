package router

import "testing"

// TestShortfall: the correction rule. At 64-token chunks the first chunk is 16 tokens and n
// chunks end at 16 + 64(n−1): 10 chunks are 592 tokens.
func TestShortfall(t *testing.T) {
	tests := []struct {
		name string
		r    CacheReport
		want int
	}{
		{"no match", CacheReport{MatchedChunks: 0, PromptTokens: 600, ReportedPrompt: 600}, 0},
		{"no usage reported", CacheReport{MatchedChunks: 10, PromptTokens: 600}, 0},
		{"all held", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 592}, 0},
		{"one block short (vLLM counts whole blocks)", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 576}, 0},
		{"within a quarter of the prediction", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 450}, 0},
		{"lost all", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 0}, 10},
		{"kept 4 chunks", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 208}, 6},
		{"kept 4 chunks, a block short of the boundary", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 200}, 6},
		{"kept 3 chunks, more than a block short of the 4th", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 190}, 7},
		{"just past the quarter", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 400}, 3},
		{"the backend's tokens are twice the key's", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 1200, ReportedCached: 1184}, 0},
		{"twice the tokens, kept 4 chunks", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 1200, ReportedCached: 416}, 6},
		{"less than a chunk predicted", CacheReport{MatchedChunks: 1, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 0}, 0},
		{"two chunks lost is more than one chunk", CacheReport{MatchedChunks: 2, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 0}, 2},
		{"prediction capped at the prompt", CacheReport{MatchedChunks: 10, PromptTokens: 400, ReportedPrompt: 400, ReportedCached: 390}, 0},
		{"cached over the prompt is the prompt", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 1 << 20}, 0},
		{"negative cached is none", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: -5}, 10},
		{"chunk size 0 takes the default", CacheReport{MatchedChunks: 10, ChunkTokens: 0, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 0}, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			if r.ChunkTokens == 0 && tc.name != "chunk size 0 takes the default" {
				r.ChunkTokens = 64
			}
			if got := Shortfall(r); got != tc.want {
				t.Errorf("Shortfall(%+v) = %d, want %d", r, got, tc.want)
			}
		})
	}
}
