package router

import (
	"fmt"
	"testing"

	"github.com/prefixlb/prefixlb/router/key"
)

// TestShortfall: the correction rule. At 64-token chunks the head chunks are 4 and 12 tokens
// and n ≥ 2 chunks end at 16 + 64(n−2): 10 chunks are 528 tokens, 4 chunks 144.
func TestShortfall(t *testing.T) {
	tests := []struct {
		name string
		r    CacheReport
		want int
	}{
		{"no match", CacheReport{MatchedChunks: 0, PromptTokens: 600, ReportedPrompt: 600}, 0},
		{"no usage reported", CacheReport{MatchedChunks: 10, PromptTokens: 600}, 0},
		{"all held", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 528}, 0},
		{"one block short (vLLM counts whole blocks)", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 512}, 0},
		{"within a quarter of the prediction", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 450}, 0},
		{"lost all", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 0}, 10},
		{"kept 4 chunks", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 144}, 6},
		{"kept 4 chunks, a block short of the boundary", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 136}, 6},
		{"kept 3 chunks, more than a block short of the 4th", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 126}, 7},
		{"just past the quarter", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 390}, 2},
		{"the backend's tokens are twice the key's", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 1200, ReportedCached: 1056}, 0},
		{"twice the tokens, kept 4 chunks", CacheReport{MatchedChunks: 10, PromptTokens: 600, ReportedPrompt: 1200, ReportedCached: 288}, 6},
		{"less than a chunk predicted", CacheReport{MatchedChunks: 1, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 0}, 0},
		{"three chunks (80 tokens) lost is more than one chunk", CacheReport{MatchedChunks: 3, PromptTokens: 600, ReportedPrompt: 600, ReportedCached: 0}, 3},
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

// TestPrefixCorrect: the policy applies the rule to what the backend reported and corrects
// only that backend; with NoIndexCorrection, or for a request it did not learn, nothing.
func TestPrefixCorrect(t *testing.T) {
	for _, off := range []bool{false, true} {
		bs := prefixBackends(t, 2)
		p := NewPrefix(PrefixOptions{NoIndexCorrection: off}, nil)
		p.SetBackends(bs)
		d := NewDecider(p)
		var ks []*key.Key
		for i := range 8 {
			k := routedKey(chunkChain(nil).extend(fmt.Sprint("prompt ", i), 8))
			ks = append(ks, k)
			for _, b := range bs {
				p.Learn(k, b, 0)
			}
		}
		k := ks[4]
		unparsed := *k
		unparsed.OK = false
		tu, unsent := d.Ticket(&unparsed), d.Ticket(k)
		tu.Send(bs[0], 8)
		if n := tu.Report(k.PromptTokens, 0) + unsent.Report(k.PromptTokens, 0); n != 0 {
			t.Fatalf("an unparsed or unlearned request corrected %d entries", n)
		}
		tk := d.Ticket(k)
		tk.Send(bs[0], 8)
		// The backend reports none of the 8 chunks cached.
		dropped := tk.Report(k.PromptTokens, 0)
		want := 4*8 + 8 // prompts 0..3 (used before prompt 4), then prompt 5 for the 8 lost chunks
		if off {
			want = 0
		}
		if dropped != want {
			t.Errorf("NoIndexCorrection %v: dropped %d, want %d", off, dropped, want)
		}
		out := make([]int, 2)
		for i, k := range ks {
			p.Index().Match(k.Chunks, bs, out)
			held := 8
			if !off && (i < 4 || i == 5) {
				held = 0
			}
			if out[0] != held || out[1] != 8 {
				t.Errorf("NoIndexCorrection %v: prompt %d held %v, want [%d 8]", off, i, out, held)
			}
		}
	}
}

// benchmarkPickLearnCorrect is benchmarkPickLearn with the correction call the proxy makes
// when each response completes, the backend reporting the prefix held: the common case, where
// the rule finds no shortfall and the index is not touched. (Corrections themselves:
// index.BenchmarkCorrect.)
func benchmarkPickLearnCorrect(b *testing.B, promptBytes, conversations int) {
	bs := prefixBackends(b, 8)
	p, _ := newTestPrefix(b, bs)
	n := promptBytes / 256
	sys := chunkChain(nil).extend("shared", n/2)
	keys := make([]*key.Key, conversations)
	for i := range keys {
		keys[i] = routedKey(sys.extend(fmt.Sprint("conversation ", i), n-n/2))
		p.Learn(keys[i], bs[i%len(bs)], 0)
	}
	for _, b := range bs {
		p.Learn(routedKey(sys), b, 0)
	}
	corrected := 0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := keys[i%len(keys)]
		d := p.Pick(k, bs)
		l := p.Learn(k, d.Backend, d.MatchedChunks)
		corrected += p.Correct(k, d.Backend, l, CacheReport{MatchedChunks: d.MatchedChunks, ReportedPrompt: k.PromptTokens,
			ReportedCached: key.PrefixTokens(d.MatchedChunks, key.DefaultChunkTokens)})
	}
	if corrected != 0 {
		b.Fatalf("%d entries corrected; the backend reported every prefix held", corrected)
	}
}

func BenchmarkPickLearnCorrect16KB(b *testing.B)  { benchmarkPickLearnCorrect(b, 16<<10, 128) }
func BenchmarkPickLearnCorrect128KB(b *testing.B) { benchmarkPickLearnCorrect(b, 128<<10, 128) }
