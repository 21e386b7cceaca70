// Package sim simulates vLLM replicas for prefixlb's bench: `prefixlb sim` runs N of them in
// one process, each an OpenAI-compatible server (/v1/chat/completions, /v1/completions with
// streaming SSE or JSON, /v1/models, /health, /metrics with vLLM's metric names) in front of a
// model of one vLLM V1 engine on one GPU.
//
// # What is modelled
//
//   - Continuous batching (Engine): one step at a time, running requests first, then waiting
//     ones in FCFS order; a token budget per step (max_num_batched_tokens) shared by prefill
//     chunks and decode tokens, so long prompts prefill over several steps (chunked prefill);
//     at most max_num_seqs running requests. A step's duration is linear in its prefill tokens,
//     their context, its decoding sequences and their contexts (see Config for the constants
//     and their sources). The first token comes out of the step that finishes the prefill, then
//     one per step; the sim always generates exactly max_tokens (default 16) tokens, as with
//     ignore_eos, and reports finish_reason "length".
//   - A finite paged KV cache with prefix caching: 16-token blocks, chained block hashes
//     (hash(parent, 16 token ids), seeded by model name and cache_salt), LRU eviction of
//     unpinned blocks, blocks pinned while their request runs. A request's cached prefix is the
//     longest run of its full prompt blocks found in the cache (at least the last prompt token
//     is always recomputed, as in vLLM); those tokens skip prefill and are reported in
//     usage.prompt_tokens_details.cached_tokens. Generated tokens are cached as well, so the
//     next turn of a conversation that echoes the answer hits it.
//   - Admission and preemption as vLLM V1 does them (Engine has the rules and their sources):
//     a waiting request is admitted when its whole sequence fits in the free KV blocks now,
//     nothing is reserved for the tokens it will generate, and blocks are allocated step by
//     step; when a running request cannot get a block, the most recently admitted running
//     request is preempted by recompute (blocks released, back to the front of the queue),
//     counted in vllm:num_preemptions_total. A request that does not fit waits and holds back
//     those behind it.
//   - The sim's own tokenizer (Tokenize): words, digit groups, symbol pairs, newlines, about 4
//     bytes per token on English prose; not the router's bytes÷4 chunks. Chat messages go
//     through a simple chat template (request.go) so that multi-turn chats share prefixes.
//   - A client that disconnects aborts its request: its slot and blocks are freed at once.
//
// # Time
//
// Engine has no clock: Schedule returns the next step's model duration and Complete applies it
// at a model time the caller gives, so tests drive it step by step. A Replica drives it in real
// time divided by Config.Speedup, sleeping between steps and idling (no polling) when there is
// nothing to do; latencies in /metrics are model seconds.
//
// # Cost
//
// The sim must leave the CPU to the proxy and the load generator: an engine step costs ≈0.3 µs
// per generated token, and a streamed token ≈6 µs of CPU including a Go client reading it
// (bench_test.go). Chunks are assembled from per-request byte templates, never marshalled.
package sim
