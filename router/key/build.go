package key

import (
	"sync"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// DefaultChunkTokens is the chunk size, in approximate tokens, used when a Builder is given
// zero or a negative size. 64 approximate tokens = 256 rendered bytes: smaller chunks blew up
// the index memory of peer routers (llm-d-router #1158 raised its floor to 64 tokens).
const DefaultChunkTokens = 64

// BytesPerToken is the approximation used everywhere in this package: one token per 4 bytes of
// rendered UTF-8. Measured at 0.91–1.30x of a real BPE (o200k) count on mixed and plain English
// text (shared/research/go-ecosystem.md §4); a real BPE costs 0.2–0.4 ms per KiB, this costs
// nothing. Token-id prompts are counted exactly instead.
const BytesPerToken = 4

// maxChunkTokens bounds ChunkTokens so that ChunkTokens*BytesPerToken cannot overflow.
const maxChunkTokens = 1 << 24

// maxPooledBody is the largest body, in bytes, whose scratch state goes back to the pool. The
// fast path's arena holds the unescaped text of the body, and the fastjson parser a copy of
// the body and one Value per JSON value; keeping those for a rare huge body would pin that
// memory for every later request. Larger bodies still work, with state that is dropped after
// the request (so they allocate).
const maxPooledBody = 1 << 20

// Builder turns request bodies into routing keys. It is immutable configuration and safe for
// concurrent use; per-request scratch memory comes from an internal pool.
type Builder struct {
	// ChunkTokens is the chunk size in approximate tokens (chunk bytes = ChunkTokens × 4, or
	// ChunkTokens token ids for token-id prompts). Zero or negative means DefaultChunkTokens.
	// It must not change once the Builder is in use.
	ChunkTokens int
	memo        *memo // nil: every body is built in full (a Builder literal)
	// testPanic, set by tests only (nil otherwise), runs with the state of a routed build
	// once it is rendered and hashed, before the memo files it: a panic there is one that a
	// bug in the build would raise.
	testPanic func(*state)
}

// NewBuilder returns a Builder cutting prompts into chunks of chunkTokens approximate tokens
// (chunkTokens × 4 rendered bytes). chunkTokens <= 0 selects DefaultChunkTokens (64). It
// remembers where its large chat bodies ended (memo.go), so that a body that extends one of
// them, as a coding agent's next request does, is keyed from there.
func NewBuilder(chunkTokens int) *Builder {
	return &Builder{ChunkTokens: normChunkTokens(chunkTokens), memo: newMemo()}
}

func (b *Builder) chunkTokens() int { return normChunkTokens(b.ChunkTokens) }

// normChunkTokens is the chunk size that a configured size n selects: DefaultChunkTokens for
// n <= 0, at most maxChunkTokens.
func normChunkTokens(n int) int {
	if n <= 0 {
		return DefaultChunkTokens
	}
	return min(n, maxChunkTokens)
}

// classify names the API of a request path (no query string), percent-decoded first as the
// backend decodes it (path.go): one trailing slash is allowed. It does not allocate.
func classify(path []byte) API {
	var buf [3 * maxClassifiedPath]byte
	if hasEscape(path) {
		if len(path) > len(buf) { // decodes to more than maxClassifiedPath bytes: no API's
			return APINone
		}
		path = DecodePath(buf[:0], path)
	}
	if n := len(path); n > 1 && path[n-1] == '/' {
		path = path[:n-1]
	}
	switch string(path) {
	case "/v1/chat/completions":
		return APIChat
	case "/v1/completions":
		return APICompletions
	case "/v1/responses":
		return APIResponses
	case "/v1/messages":
		return APIMessages
	case "/v1/embeddings":
		return APIEmbeddings
	case "/v1/rerank", "/v2/rerank", "/rerank", "/v1/score", "/score", "/tokenize", "/detokenize":
		return APIModelOnly
	}
	return APINone
}

// Routed reports whether a request path (without query string) is routed by prefix:
// exactly /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages or
// /v1/embeddings, each also with one trailing slash. Everything else (/v1/models, /health,
// /v1/rerank, /tokenize, /v1/responses/{id}, ...) is passthrough.
func Routed(path []byte) bool { return classify(path).Routed() }

// APIOf names the API of a request path (no query string); APINone for a path the key does
// not read.
func APIOf(path []byte) API { return classify(path) }

// state is the per-request scratch memory: fast-path scanner, parser, chunk hasher, side
// digest and buffers.
type state struct {
	scanner  scanner
	parser   fastjson.Parser
	chunker  chunker
	renderer renderer
	fast     bool    // the last build was the fast path's
	resumed  bool    // … and resumed from the memo's checkpoint
	top      scanTop // the fast path's top-level fields of the last build
	// The memo's (memo.go): prefix hashes of the body, and the checkpoint it resumes from.
	sums    []uint64
	digests []xxhash.Digest
	hit     checkpoint
}

func (s *state) reset() {
	s.scanner.reset()
	s.renderer.reset()
	s.chunker.reset()
	s.hit.end = 0
	s.top = scanTop{}
	if cap(s.hit.chunks) > maxPooledChunks {
		s.hit.chunks = nil
	}
}

var statePool = sync.Pool{New: func() any { return new(state) }}

// Keys whose slices grew past these capacities drop them on Recycle, so that one huge prompt
// does not pin its memory in a pooled key: 4096 chunks cover a 1 MiB prompt at the default
// chunk size.
const (
	maxPooledChunks = 4096
	maxPooledModel  = 256
)

// Recycle resets k for the next request, keeping its buffers unless they grew unusually large.
func (k *Key) Recycle() {
	k.Reset()
	if cap(k.Chunks) > maxPooledChunks {
		k.Chunks = nil
	}
	if cap(k.Model) > maxPooledModel {
		k.Model = nil
	}
}

// MaxBuildAlloc is the most memory, in bytes, that Build allocates to key a body of n bytes,
// whatever its shape and endpoint, at the default chunk size: 2.5n + 2 MiB. What grows with
// the body: the fast path's arena, n bytes, allocated once for a body with escapes (its
// strings with escapes, unescaped, and object keys with escapes); the memo's prefix hashes
// (88 bytes per 4 KiB of a chat body over 256 KiB); the key's chunk hashes (8 bytes per 256
// rendered bytes, per 2 KiB past the first 128 chunks); and, for a body the fast path hands
// back, fastjson's copy of it and a tree of at most treeValuesFloor values and one per KiB
// of the body without escapes (treecost.go). The message index is bounded (maxIndexedMsgs).
// After Build returns it holds the pooled scratch of a body of at most 1 MiB, or nothing.
// TestKeyingMemoryBound checks the bound on the worst shapes of every API, which allocate 0
// to 2.1 times their size.
func MaxBuildAlloc(n int) int64 { return int64(n)*5/2 + maxBuildSlack }

// maxBuildSlack is MaxBuildAlloc's constant: the floor of an affordable parse tree (1 MiB
// at most), the message index (360 KiB) and small slices.
const maxBuildSlack = 2 << 20

// Build fills k (after k.Reset()) from the body of a request to path (no query string).
//
// It never fails: a path that is not routed leaves k.Routed false and sets only k.API, and for
// the model-only passthrough paths (APIModelOnly: rerank, score, tokenize) k.Model. For a
// routed path k.Routed is true, and k.OK is true only when the body is valid UTF-8, parses as
// a JSON object, and holds a well-typed prompt (chat: "messages"; completions: "prompt";
// responses: "input" and/or "instructions"; messages: "messages", with "system" and "tools";
// embeddings: "input" as a completions prompt, or chat's "messages"). When !k.OK, k.Chunks is empty and
// k.PromptTokens is 0; k.Model and k.Stream are still set when the body parsed.
//
// The prompt is rendered canonically (see render.go for the byte format), and the rendered
// byte stream is cut into chunks of ChunkTokens×4 bytes (the first two a sixteenth and three sixteenths of that);
// Chunks[i] = xxhash64(seed ‖ prev ‖ xxhash64(chunk i)) with prev = Chunks[i-1] (0 for i = 0),
// little-endian uint64s (see chunker in chunk.go). The seed is a hash of
// the prompt kind (chat-like, text, token ids), "model" and "cache_salt", so requests that
// differ in model (LoRA adapters are model names) or salt share no chunk hash. A trailing
// partial chunk is not hashed. PromptTokens = rendered bytes / 4, or the exact id count for
// token-id prompts.
//
// Fields are read by name, so key order in the top-level object and in messages does not
// change the key; a duplicated key counts by its last occurrence, as in Python's json (vLLM,
// SGLang). Values hashed verbatim (tools, functions, response_format, non-string tool-call
// arguments, unknown parts) keep their own key order; whitespace and string escapes are
// normalised because parsed values are hashed, not raw bytes.
//
// Bodies of every API, in every well-typed shape, are rendered straight from the body by a
// fast path (scan.go); the few it hands back (NaN or Inf, nesting past 64 levels, a field of
// the wrong type, JSON that does not parse) are parsed with fastjson and rendered from the tree
// (render_tree.go, render_messages.go) when the tree is affordable (treecost.go), else keyed
// as a body that does not parse (not OK; model and stream by a lenient scan). Both paths read
// the same tables (grammar.go) and give the same key for the same body. Memory: at most
// MaxBuildAlloc(len(body)) bytes, whatever the body.
//
// Steady state allocates nothing: the scanner's arena, the parser, the hasher and k's slices
// are reused. Bodies over 1 MiB use scratch memory that is not pooled.
//
// A panic in Build (a bug: no input is meant to raise one) is not recovered here: it reaches
// the caller, which decides what it costs (the proxy contains it and routes the request by
// parse-fallback; the fuzz targets must see it). The scratch state the build used is then
// dropped, never returned to the pool, and k is left partly filled: Reset it before reuse.
func (b *Builder) Build(path []byte, body []byte, k *Key) {
	k.Reset()
	ep := classify(path)
	k.API = ep
	switch ep {
	case APINone:
		return
	case APIModelOnly:
		if utf8.Valid(body) {
			s := statePool.Get().(*state)
			s.modelOnly(body, k)
			if len(body) <= maxPooledBody {
				s.reset()
				statePool.Put(s)
			}
		}
		return
	}
	k.Routed = true
	s := statePool.Get().(*state)
	b.buildRouted(s, ep, body, k)
	k.Body = body
	if !k.OK && len(k.Model) == 0 {
		s.fallbackModel(body, k) // keep the request in its model's pool
	}
	// Reached only when nothing above panicked: a state that a panic left half-way (its
	// scanner, arena, parser or chunker in the middle of a body) is dropped with the panic,
	// never pooled, so that no later build starts from it.
	if len(body) <= maxPooledBody {
		s.reset()
		statePool.Put(s)
	}
}

// buildRouted fills k, Routed already, from the body of a request to a routed API, with s.
func (b *Builder) buildRouted(s *state, ep API, body []byte, k *Key) {
	m := b.memo
	if ep != APIChat || len(body) < memoMinBody {
		m = nil
	}
	valid := 0 // body[:valid] is known to be valid UTF-8 (a prefix of a body keyed before)
	if m != nil {
		valid = s.recall(m, body)
	}
	if !utf8.Valid(body[valid:]) {
		return
	}
	s.build(ep, b.chunkTokens(), body, k)
	if b.testPanic != nil {
		b.testPanic(s)
	}
	if m != nil && s.fast {
		if s.resumed {
			m.hits.Add(1)
		}
		s.remember(m, body, k)
	}
}

// build fills k by the fast path (scan.go) when it handles the body, else by the fastjson path
// when its parse tree is affordable (treeAffordable); else k is left not OK, as for a body
// that does not parse, with the "stream" flag of the lenient scan (Build then reads the model
// the same way).
func (s *state) build(ep API, chunkTokens int, body []byte, k *Key) {
	if s.fast = s.fastBuild(ep, chunkTokens, body, k); s.fast {
		return
	}
	k.Reset()
	k.API, k.Routed = ep, true
	if !treeAffordable(body) {
		k.Stream = string(topLevelMember(body, "stream")) == litTrue
		return
	}
	s.parseBuild(ep, chunkTokens, body, k)
}

// parseBuild fills k from the fastjson parse tree of body: the reference for every body, and
// the only path for those the fast path hands back.
func (s *state) parseBuild(ep API, chunkTokens int, body []byte, k *Key) {
	v, err := s.parser.ParseBytes(body)
	if err != nil {
		return
	}
	if v.Type() != fastjson.TypeObject {
		return
	}
	o, _ := v.Object()
	var top topValues
	o.Visit(func(name []byte, v *fastjson.Value) {
		top[topFieldOf(name)] = v
	})
	if stream := top[topStream]; stream != nil && stream.Type() == fastjson.TypeTrue {
		k.Stream = true
	}
	model, ok := optString(top[topModel])
	if !ok {
		return
	}
	k.Model = append(k.Model[:0], model...)
	salt, ok := optString(top[topCacheSalt])
	if !ok {
		return
	}

	var kind byte = kindChat
	var prompt *fastjson.Value
	switch {
	case ep == APICompletions:
		kind, prompt, ok = completionsPrompt(top[topPrompt])
	case ep == APIEmbeddings && top[topMessages] == nil:
		kind, prompt, ok = completionsPrompt(top[topInput])
	}
	if !ok {
		return
	}
	s.begin(kind, model, salt, chunkTokens, k)
	r := &s.renderer
	switch ep {
	case APIChat:
		ok = r.header(&top) && r.chatMessages(top[topMessages])
	case APIResponses:
		ok = r.header(&top) && r.responsesInput(top[topInstructions], top[topInput])
	case APIMessages:
		ok = r.messagesTools(top[topTools]) && r.messagesSystem(top[topSystem]) && r.messagesList(top[topMessages])
	case APIEmbeddings:
		if kind == kindChat { // vLLM's chat-style embeddings request: "messages"
			ok = r.header(&top) && r.chatMessages(top[topMessages])
		} else {
			ok = r.completionsPrompt(kind, prompt)
		}
	default:
		ok = r.completionsPrompt(kind, prompt)
	}
	if !ok {
		k.Chunks, k.ShortFirstTurn = k.Chunks[:0], false
		return
	}
	s.finish(kind, k)
}

// modelOnly fills k.Model from a body whose only field the key reads is "model" (the
// passthrough endpoints of APIModelOnly); a body that does not parse, or whose model is not a
// string, leaves it empty. The body is validated and its model read by the fast path's
// scanner, without a parse tree; one that the scanner hands back (NaN, deep nesting, invalid
// JSON) is parsed by fastjson when that is affordable, else its model is read by the lenient
// scan of a body that does not key (fallbackModel).
func (s *state) modelOnly(body []byte, k *Key) {
	sc := &s.scanner
	sc.body = body
	sc.arena = sc.arena[:0]
	var top scanTop
	if sc.top(APIModelOnly, &top) {
		if model, ok := sc.optStr(top.at[topModel]); ok {
			k.Model = append(k.Model[:0], model...)
		}
		return
	}
	if !treeAffordable(body) {
		s.fallbackModel(body, k)
		return
	}
	v, err := s.parser.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		return
	}
	var model *fastjson.Value
	o, _ := v.Object()
	o.Visit(func(name []byte, v *fastjson.Value) {
		if topFieldOf(name) == topModel {
			model = v
		}
	})
	if b, ok := optString(model); ok {
		k.Model = append(k.Model[:0], b...)
	}
}

// optString returns the bytes of an optional string field: absent or null is "", a string is
// its (unescaped) bytes, anything else is a type error (ok false).
func optString(v *fastjson.Value) (b []byte, ok bool) {
	b, _, ok = stringField(v)
	return b, ok
}
