// Package key turns an OpenAI-compatible request body into a routing key: a canonical,
// prefix-stable rendering of the prompt, cut into fixed-size chunks of approximate tokens,
// each named by a chained xxhash of everything before it.
package key

// Key is the routing key of one request. A Key is reused across requests (pooled); its
// slices keep their capacity so that steady state allocates nothing proportional to the prompt.
type Key struct {
	// API is the endpoint of the request path (APINone: one the key does not read).
	API API
	// Routed is true when the endpoint is prefix-routed (/v1/chat/completions,
	// /v1/completions, /v1/responses, /v1/messages, /v1/embeddings).
	Routed bool
	// OK is true when the body parsed and a prompt was found. When Routed && !OK the request
	// is forwarded unchanged with fallback routing (reason parse-fallback): so is a body the
	// fast path cannot read whose parse tree would cost too much (see MaxBuildAlloc).
	OK bool
	// Stream is the body's "stream" flag.
	Stream bool
	// Model is the body's "model" field (a copy; valid until the Key is reused). It is also
	// set for the passthrough endpoints of APIModelOnly, whose bodies name a model.
	Model []byte
	// PromptTokens is the approximate prompt length in tokens (rendered bytes / 4, or the
	// exact count for token-id prompts).
	PromptTokens int
	// Chunks holds one chained hash per full chunk: the HeadChunks first are ChunkTokens/16
	// and 3 × ChunkTokens/16 approximate tokens (whole tokens, at least one each), every
	// later one ChunkTokens, CoarseFactor × that past FineChunks (see ChunkCount). Chunks[i]
	// names the whole prefix up to and including chunk i, seeded with model and cache_salt.
	// A trailing partial chunk is not included.
	Chunks []uint64
	// ShortFirstTurn is true when an assistant message begins within the HeadChunks first
	// chunks, after the first: a later turn of a conversation whose first turn was shorter
	// than PrefixTokens(HeadChunks) tokens (16 at the default size) but not than the first
	// chunk, so that the replica that served that turn learned its first chunk alone (it was
	// routed as short) and holds the reply after it as well. A match of the first chunk alone
	// is then likely this conversation's own history; otherwise it is framing that unrelated
	// prompts share. (A first turn shorter than the first chunk, such as "Hi", left nothing
	// in the index: its follow-up's first chunk ends in the reply's framing, which every
	// conversation that opens so shares.)
	ShortFirstTurn bool
	// Body is the request body the key was built from, for routed requests (not a copy: valid
	// while the request is served). prefixlb's policies route on the fields above; only a
	// policy that must read the request as a replica does (the bench's oracle, which tokenizes
	// it with the simulated replica's tokenizer) reads it.
	Body []byte
}

// Reset clears k for reuse, keeping capacity.
func (k *Key) Reset() {
	k.API = APINone
	k.Routed, k.OK, k.Stream = false, false, false
	k.Model = k.Model[:0]
	k.PromptTokens = 0
	k.Chunks = k.Chunks[:0]
	k.ShortFirstTurn = false
	k.Body = nil
}

// API is the endpoint a request path names, as far as the key is concerned.
type API uint8

const (
	// APINone is every path the key does not read (/v1/models, /health, ...): passthrough.
	APINone API = iota
	// APIChat is /v1/chat/completions.
	APIChat
	// APICompletions is /v1/completions.
	APICompletions
	// APIResponses is /v1/responses (OpenAI Responses API).
	APIResponses
	// APIMessages is /v1/messages (the Anthropic Messages API, as vLLM and SGLang serve it).
	APIMessages
	// APIEmbeddings is /v1/embeddings: "input" keyed like a completions prompt, or
	// "messages" like chat.
	APIEmbeddings
	// APIModelOnly is a passthrough endpoint whose body names a model (/v1/rerank,
	// /v2/rerank, /rerank, /v1/score, /score, /tokenize, /detokenize): Routed is false and
	// only Model is read.
	APIModelOnly
)

var apiNames = [...]string{"none", "chat", "completions", "responses", "messages", "embeddings", "model-only"}

// String is the API's short name ("chat", "messages", ...).
func (a API) String() string {
	if int(a) < len(apiNames) {
		return apiNames[a]
	}
	return "unknown"
}

// Routed reports whether requests to the API are prefix-routed.
func (a API) Routed() bool { return a != APINone && a != APIModelOnly }
