// Package key turns an OpenAI-compatible request body into a routing key: a canonical,
// prefix-stable rendering of the prompt, cut into fixed-size chunks of approximate tokens,
// each named by a chained xxhash of everything before it.
package key

// Key is the routing key of one request. A Key is reused across requests (pooled); its
// slices keep their capacity so that steady state allocates nothing proportional to the prompt.
type Key struct {
	// Routed is true when the endpoint is prefix-routed (/v1/chat/completions,
	// /v1/completions, /v1/responses).
	Routed bool
	// OK is true when the body parsed and a prompt was found. When Routed && !OK the request
	// is forwarded unchanged with fallback routing (reason parse-fallback).
	OK bool
	// Stream is the body's "stream" flag.
	Stream bool
	// Model is the body's "model" field (a copy; valid until the Key is reused).
	Model []byte
	// PromptTokens is the approximate prompt length in tokens (rendered bytes / 4, or the
	// exact count for token-id prompts).
	PromptTokens int
	// Chunks holds one chained hash per full chunk: the first chunk is ChunkTokens/4
	// approximate tokens, every later one ChunkTokens (see ChunkCount). Chunks[i] names the
	// whole prefix up to and including chunk i, seeded with model and cache_salt. A trailing
	// partial chunk is not included.
	Chunks []uint64
	// Body is the request body the key was built from, for routed requests (not a copy: valid
	// while the request is served). prefixlb's policies route on the fields above; only a
	// policy that must read the request as a replica does (the bench's oracle, which tokenizes
	// it with the simulated replica's tokenizer) reads it.
	Body []byte
}

// Reset clears k for reuse, keeping capacity.
func (k *Key) Reset() {
	k.Routed, k.OK, k.Stream = false, false, false
	k.Model = k.Model[:0]
	k.PromptTokens = 0
	k.Chunks = k.Chunks[:0]
	k.Body = nil
}
