package key

import (
	"slices"
	"strings"
	"testing"
)

// panicBuilds is how many builds each case makes panic before it looks into the pool.
const panicBuilds = 8

// poolProbe is how many states the test takes out of the pool to look for one a panic left.
const poolProbe = 64

// A panic in a build (a bug; testPanic raises one once the body is rendered and hashed, as a
// bug in the scanner or the chunker would) reaches the caller, and the scratch state it left
// half-way never goes back to the pool: the next builds start from clean states and give the
// same keys as a Builder that never panicked. Before, Build's deferred cleanup ran during the
// panic and pooled the state (after running fallbackModel on it).
func TestBuildPanicDropsState(t *testing.T) {
	big := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("agent tool output ", memoMinBody/16) +
		`"},{"role":"user","content":"go on"}]}`
	cases := []struct{ name, path, body string }{
		{"chat fast path", pathChat, `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("hello world ", 200) + `"}]}`},
		{"completions", pathCompl, `{"model":"m","prompt":"` + strings.Repeat("once upon a time ", 200) + `"}`},
		{"messages (parse path)", pathMsgs, `{"model":"m","system":"be brief","messages":[{"role":"user","content":"` + strings.Repeat("hi ", 400) + `"}]}`},
		{"chat over the memo's minimum", pathChat, big},
	}
	const marker = "test panic in key build"
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := NewBuilder(0)
			var panicked []*state
			b.testPanic = func(s *state) {
				panicked = append(panicked, s)
				panic(marker)
			}
			var k Key
			for i := range panicBuilds {
				if got := buildRecovering(b, c.path, c.body, &k); got != marker {
					t.Fatalf("build %d: recovered %v, want the panic %q to reach the caller", i, got, marker)
				}
			}
			if len(panicked) != panicBuilds {
				t.Fatalf("the hook ran %d times, want %d", len(panicked), panicBuilds)
			}
			taken := make([]*state, 0, poolProbe)
			for range poolProbe {
				s := statePool.Get().(*state)
				if slices.Contains(panicked, s) {
					t.Fatalf("a state left by a panicking build came back from the pool")
				}
				taken = append(taken, s)
			}
			for _, s := range taken {
				statePool.Put(s)
			}
			b.testPanic = nil
			k.Reset()
			want := build(&Builder{ChunkTokens: DefaultChunkTokens}, c.path, c.body)
			for i := range 2 { // the second of a large chat body resumes from the memo
				got := build(b, c.path, c.body)
				if !got.OK || len(got.Chunks) == 0 {
					t.Fatalf("build %d after the panics: OK %v, %d chunks", i, got.OK, len(got.Chunks))
				}
				if !slices.Equal(got.Chunks, want.Chunks) || got.PromptTokens != want.PromptTokens || string(got.Model) != string(want.Model) {
					t.Fatalf("build %d after the panics differs from a clean Builder's: %d chunks, %d tokens; want %d, %d",
						i, len(got.Chunks), got.PromptTokens, len(want.Chunks), want.PromptTokens)
				}
			}
		})
	}
}

// buildRecovering runs b.Build and returns what it panicked with (nil: it returned).
func buildRecovering(b *Builder, path, body string, k *Key) (recovered any) {
	defer func() { recovered = recover() }()
	b.Build([]byte(path), []byte(body), k)
	return nil
}

// Fallback gives the key Build gives a body it cannot read, whatever k held before (a key
// that a panicking build left half-filled, or a complete one): Routed for a routed API and
// never OK, no chunks, the model from the lenient scan.
func TestFallback(t *testing.T) {
	cases := []struct {
		name, path, body string
		api              API
		model            string
	}{
		{"chat body that parses", pathChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, APIChat, "m"},
		{"the fuzzer's body", pathChat, `{"model":,`, APIChat, ""},
		{"completions, model after the prompt", pathCompl, `{"prompt":"` + strings.Repeat("x", 2048) + `","model":"n"}`, APICompletions, "n"},
		{"not JSON", pathMsgs, `model=m`, APIMessages, ""},
		{"model-only passthrough", pathRerank, `{"model":"r","query":"q"}`, APIModelOnly, "r"},
		{"passthrough", pathModels, `{"model":"m"}`, APINone, ""},
	}
	b := NewBuilder(0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var k Key
			b.Build([]byte(pathChat), []byte(`{"model":"old","messages":[{"role":"user","content":"`+strings.Repeat("a", 4096)+`"}]}`), &k)
			if !k.OK || len(k.Chunks) == 0 {
				t.Fatal("the key before Fallback did not build")
			}
			Fallback([]byte(c.path), []byte(c.body), &k)
			routed := c.api.Routed()
			if k.API != c.api || k.Routed != routed || k.OK || k.Stream || len(k.Chunks) != 0 || k.PromptTokens != 0 {
				t.Fatalf("API %v routed %v OK %v stream %v, %d chunks, %d tokens; want API %v routed %v, not OK, nothing keyed",
					k.API, k.Routed, k.OK, k.Stream, len(k.Chunks), k.PromptTokens, c.api, routed)
			}
			if string(k.Model) != c.model {
				t.Errorf("model %q, want %q", k.Model, c.model)
			}
			if got := string(k.Body); routed && got != c.body || !routed && k.Body != nil {
				t.Errorf("Body %q, want the body for a routed API only", got)
			}
		})
	}
}
