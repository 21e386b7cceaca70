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

// ShortFirstTurn is set exactly when an assistant message begins within the head chunks,
// after the first (between 4 and 16 tokens of rendering at the default size): the follow-ups
// of a first turn that was routed as short, whose first chunk alone its replica learned.
func TestShortFirstTurn(t *testing.T) {
	firstTurn := func(n int) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", n) + `"},{"role":"assistant","content":"ok"},{"role":"user","content":"More, please."}]}`
	}
	long := strings.Repeat("a long system prompt that runs well past the head chunks ", 4)
	for _, tt := range []struct {
		name, path, body string
		want             bool
	}{
		{"short question, reply, follow-up", pathChat,
			`{"model":"m","messages":[{"role":"user","content":"What is Rust?"},{"role":"assistant","content":"A language."},{"role":"user","content":"Tell me more."}]}`, true},
		{"short question alone", pathChat, `{"model":"m","messages":[{"role":"user","content":"What is Rust?"}]}`, false},
		{"long first turn, reply, follow-up", pathChat,
			`{"model":"m","messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"More."}]}`, false},
		{"long question alone", pathChat, `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`, false},
		// A user message renders as 'M' str("user") 'T' text 0x00: 8 bytes and its text. The
		// head chunks end at 16 and 64 bytes.
		{"first turn of 63 bytes of rendering", pathChat, firstTurn(55), true},
		{"first turn of 64 bytes: two chunks, not short", pathChat, firstTurn(56), false},
		{"first turn of 16 bytes: the first chunk", pathChat, firstTurn(8), true},
		{"first turn of 15 bytes: no chunk, nothing learned", pathChat, firstTurn(7), false},
		{"Hi", pathChat, `{"model":"m","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello! How can I help?"},{"role":"user","content":"Tell me a story."}]}`, false},
		{"assistant first", pathChat, `{"model":"m","messages":[{"role":"assistant","content":"Hello! How can I help you today?"},{"role":"user","content":"Tell me a story."}]}`, false},
		{"Anthropic messages", pathMsgs,
			`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"What is Go?"},{"role":"assistant","content":"A language."},{"role":"user","content":"More."}]}`, true},
		{"Responses API input items", pathResp,
			`{"model":"m","input":[{"role":"user","content":"What is Go?"},{"role":"assistant","content":"A language."},{"role":"user","content":"More."}]}`, true},
		{"completions prompt", pathCompl, `{"model":"m","prompt":"assistant"}`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := build(NewBuilder(0), tt.path, tt.body)
			if !k.OK {
				t.Fatalf("body did not parse")
			}
			if k.ShortFirstTurn != tt.want {
				t.Fatalf("ShortFirstTurn = %v, want %v (%d chunks)", k.ShortFirstTurn, tt.want, len(k.Chunks))
			}
			checkFast(t, NewBuilder(0), tt.path, []byte(tt.body))
		})
	}
}
