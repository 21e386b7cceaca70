// Decode interference: what the sequences a replica is decoding add to a new request's time
// to first token.

package backend

// The decode model's constants (Llama-3.1-8B in bf16 on one H100 under vLLM V1's defaults,
// the model bench/sim simulates; see DecodeWork).
const (
	// StepTokens is the token budget of one engine step, shared by prefill chunks and one
	// token per decoding sequence: vLLM V1's --max-num-batched-tokens default for the OpenAI
	// server on GPUs with at least 70 GiB (2048 on smaller ones), chunked prefill always on.
	StepTokens = 8192
	// DecodeContextPerToken is how many tokens of decoding context one step reads in the time
	// it computes one prompt token: a decode step reads each sequence's KV cache, 128 KiB a
	// token (2 × 32 layers × 8 KV heads × 128 dims × 2 bytes) at 3.35 TB/s, 39 ns; a prompt
	// token costs 2 × 8.03e9 FLOP at ~30% of 989 TFLOPS, 54 µs: 1385 to 1. A 70B model on the
	// same GPUs computes ~8.7× more per token and stores ~2.5× more KV, about 4800 to 1.
	DecodeContextPerToken = 1385
)

// DecodeWork is the prefill work (tokens' worth, as router.PrefillWork counts it) that
// decodes sequences holding contextTokens tokens of KV cache add to a prefill of work tokens
// queued behind ahead tokens of prefill on the same replica:
//
//	(1 + (ahead + work) ÷ StepTokens) × (decodes + contextTokens ÷ DecodeContextPerToken)
//
// The prefill ends after about (ahead + work) ÷ StepTokens engine steps (at least one), and
// every step also carries one token of each decoding sequence, as compute, and reads its
// whole context, as memory traffic. Both grow a step's duration whatever the prefill does:
// with 32 sequences of 4k tokens decoding, a step carries 126 tokens' worth more, about twice
// the prefill of a 128-token follow-up turn, and 1.8% more for a 16k-token prompt (20,480
// tokens' worth of work, 3 steps). ahead and work are router.PrefillWork's attention-weighted
// tokens, not the step budget's plain ones: for long contexts the steps are overcounted by up
// to that weight, in the estimate and in what the prefill model learns alike. 0 when nothing
// decodes.
func DecodeWork(decodes, contextTokens, ahead, work int64) int64 {
	if decodes <= 0 && contextTokens <= 0 {
		return 0
	}
	steps := 1 + max(ahead+work, 0)/StepTokens
	return steps * (max(decodes, 0) + max(contextTokens, 0)/DecodeContextPerToken)
}

// Decoding is this proxy's streamed requests on the replica that are answering (the first
// token came, the lease is not released) and the KV-cache tokens they hold: their prompts'
// tokens, as Lease.Begin was given them (generated tokens are not counted). A request counts
// until its response has reached the client, so a slow reader's counts a little past the
// engine's last token; non-streamed requests never count (their first byte is their last),
// nor do other senders' requests: what they cost is in the prefill rate learned.
func (b *Backend) Decoding() (sequences, contextTokens int64) {
	return max(b.counts.decodeSeqs.Load(), 0), max(b.counts.decodeCtx.Load(), 0)
}
