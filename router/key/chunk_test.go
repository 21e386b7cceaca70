package key

import (
	"fmt"
	"strings"
	"testing"
)

// TestPrefixTokens: PrefixTokens(m, ct) is exactly where the m-th chunk of a real key ends. A
// completions text prompt of PrefixTokens(m, ct) tokens (4 bytes each) and a token-id prompt
// of as many ids both have m chunks, and one byte (one id) less has m-1; so the router's
// thin-match rule, which counts matched tokens with it, counts what the keys hold, for every
// chunk size the config allows (1..4096) and for the Builder's default (ct <= 0), and on
// both sides of FineChunks, where chunks become coarse (sizes up to 64 tokens: the others'
// prompts would be tens of MB).
func TestPrefixTokens(t *testing.T) {
	for _, ct := range []int{-1, 0, 1, 2, 3, 4, 5, 7, 16, 63, 64, 65, 1000, 4096} {
		b := NewBuilder(ct)
		ms := []int{1, 2, 3, 4, 5, 6}
		if ct <= 64 {
			ms = append(ms, FineChunks-1, FineChunks, FineChunks+1, FineChunks+2)
		}
		for _, m := range ms {
			n := PrefixTokens(m, ct)
			if n < m { // every chunk holds at least one token
				t.Errorf("PrefixTokens(%d, %d) = %d, want at least %d", m, ct, n, m)
				continue
			}
			for _, c := range []struct {
				name   string
				tokens int
				chunks int
			}{{"exact", n, m}, {"one short", n - 1, m - 1}} {
				text := build(b, pathCompl, `{"prompt":"`+strings.Repeat("abcd", c.tokens)+`"}`)
				if text.PromptTokens != c.tokens || len(text.Chunks) != c.chunks {
					t.Errorf("ct %d, m %d, %s: text prompt of %d tokens has %d tokens, %d chunks; want %d, %d",
						ct, m, c.name, c.tokens, text.PromptTokens, len(text.Chunks), c.tokens, c.chunks)
				}
				ids := make([]string, c.tokens)
				for i := range ids {
					ids[i] = fmt.Sprint(i)
				}
				idKey := build(b, pathCompl, `{"prompt":[`+strings.Join(ids, ",")+`]}`)
				if idKey.PromptTokens != c.tokens || len(idKey.Chunks) != c.chunks {
					t.Errorf("ct %d, m %d, %s: %d token ids give %d tokens, %d chunks; want %d, %d",
						ct, m, c.name, c.tokens, idKey.PromptTokens, len(idKey.Chunks), c.tokens, c.chunks)
				}
			}
		}
	}
	for _, m := range []int{0, -1} {
		if got := PrefixTokens(m, 64); got != 0 {
			t.Errorf("PrefixTokens(%d, 64) = %d, want 0", m, got)
		}
	}
}
