package key

import (
	"slices"
	"testing"

	"github.com/valyala/fastjson"
)

var fuzzPaths = []string{pathChat, pathCompl, pathResp, pathModels, pathMsgs, pathEmbed, pathRerank}

// FuzzBuild feeds arbitrary bodies to every endpoint. Seeds live in testdata/fuzz/FuzzBuild.
//
// Invariants:
//   - no panic; Routed == Routed(path); an unrouted path leaves the key zero but for API and,
//     on a model-only path (/v1/rerank), Model;
//   - !OK ⇒ no chunks and PromptTokens 0;
//   - OK ⇒ len(Chunks) == PromptTokens / ChunkTokens (only full chunks are hashed);
//   - the rendering at most doubles the body (canonical numbers are the worst case: "1," → '#',
//     1, '1'), so PromptTokens ≤ len(body)/2 + 1; for a completions string prompt (or list of
//     strings) the rendering is the prompt text itself, so 4·PromptTokens ≤ len(body);
//   - OK, PromptTokens and Model do not depend on the chunk size, and Build is deterministic;
//   - when the fast path (scan.go) takes a body, its key equals the fastjson path's.
func FuzzBuild(f *testing.F) {
	f.Add(uint8(0), []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	for _, x := range fastBodies {
		f.Add(uint8(slices.Index(fuzzPaths, x.path)), []byte(x.body))
	}
	for _, x := range slowBodies {
		f.Add(uint8(slices.Index(fuzzPaths, x.path)), []byte(x.body))
	}
	for _, x := range messagesBodies {
		f.Add(uint8(slices.Index(fuzzPaths, x.path)), []byte(x.body))
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := fuzzPaths[int(which)%len(fuzzPaths)]
		b1, b64 := NewBuilder(1), NewBuilder(64)
		k := build(b1, path, string(body))
		if k.Routed != Routed([]byte(path)) {
			t.Fatalf("Routed = %v, want %v", k.Routed, !k.Routed)
		}
		if k.API != APIOf([]byte(path)) {
			t.Fatalf("API = %v, want %v", k.API, APIOf([]byte(path)))
		}
		if !k.Routed && (k.OK || k.Stream || (len(k.Model) > 0 && k.API != APIModelOnly) || len(k.Chunks) > 0 || k.PromptTokens != 0) {
			t.Fatalf("unrouted path filled the key: %+v", k)
		}
		if !k.OK && (len(k.Chunks) != 0 || k.PromptTokens != 0 || k.ShortFirstTurn) {
			t.Fatalf("OK = false with %d chunks, %d tokens, ShortFirstTurn %v; want none", len(k.Chunks), k.PromptTokens, k.ShortFirstTurn)
		}
		if want := ChunkCount(k.PromptTokens*BytesPerToken, b1.ChunkTokens*BytesPerToken); len(k.Chunks) != want {
			t.Fatalf("len(Chunks) = %d, want ChunkCount = %d", len(k.Chunks), want)
		}
		if k.PromptTokens > len(body)/2+1 {
			t.Fatalf("PromptTokens = %d for a %d-byte body, want ≤ %d", k.PromptTokens, len(body), len(body)/2+1)
		}
		if k.OK && path == pathCompl && stringPrompt(body) && 4*k.PromptTokens > len(body) {
			t.Fatalf("text prompt: PromptTokens = %d for a %d-byte body, want ≤ %d", k.PromptTokens, len(body), len(body)/4)
		}
		k2 := build(b1, path, string(body))
		if k2.OK != k.OK || k2.PromptTokens != k.PromptTokens || !slices.Equal(k2.Chunks, k.Chunks) || string(k2.Model) != string(k.Model) {
			t.Fatalf("second Build differs: %+v vs %+v", k2, k)
		}
		k3 := build(b64, path, string(body))
		if k3.OK != k.OK || k3.PromptTokens != k.PromptTokens || string(k3.Model) != string(k.Model) || k3.Stream != k.Stream {
			t.Fatalf("chunk size changed the key: %+v vs %+v", k3, k)
		}
		if want := ChunkCount(k3.PromptTokens*BytesPerToken, 64*BytesPerToken); len(k3.Chunks) != want {
			t.Fatalf("ChunkTokens 64: len(Chunks) = %d, want %d", len(k3.Chunks), want)
		}
		checkFast(t, b1, path, body)
		checkFast(t, b64, path, body)
	})
}

// stringPrompt reports whether body's "prompt" is a string or a list whose first element is.
func stringPrompt(body []byte) bool {
	v, err := fastjson.ParseBytes(body)
	if err != nil {
		return false
	}
	var p *fastjson.Value
	o, err := v.Object()
	if err != nil {
		return false
	}
	o.Visit(func(key []byte, v *fastjson.Value) { // last duplicate wins, as in Build
		if string(key) == "prompt" {
			p = v
		}
	})
	if p != nil && p.Type() == fastjson.TypeArray {
		p = p.Get("0")
	}
	return p != nil && p.Type() == fastjson.TypeString
}
