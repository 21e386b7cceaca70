package proxy

// What the relay reads from a response, per API: where its first token is (TTFT), and its
// usage (prompt and cached tokens, for the cached-token metrics). Both read the relayed bytes
// in place, allocation-free, and never change them.

import (
	"bytes"

	"github.com/prefixlb/prefixlb/router/key"
)

// tokenEventMark is in the first event of a streamed Messages API response that carries a
// token: content_block_delta (text, tool input) or, for an empty reply, message_delta. The
// events before it (message_start, content_block_start, ping) carry none, and a server may send
// them before prefill ends, so they do not count as the first token.
var tokenEventMark = []byte("_delta")

// tokenAt reports whether p, the next piece of the response body, holds the first token: any
// byte for every API but a streamed /v1/messages, whose first token event is tokenEventMark. A
// mark split across two pieces is seen one piece late; a stream without one falls back to its
// first byte (finish).
func (f *flow) tokenAt(p []byte) bool {
	if f.k.API != key.APIMessages || !f.k.Stream {
		return true
	}
	return bytes.Contains(p, tokenEventMark)
}

// The usage fields sniffUsage reads: OpenAI's (chat, completions, Responses) and Anthropic's
// (the Messages API: input_tokens excludes the cache reads and writes, which
// cache_read_input_tokens and cache_creation_input_tokens count, as vLLM reports them).
var (
	usageKey         = []byte(`"usage"`)
	promptTokensKey  = []byte(`"prompt_tokens":`)
	cachedTokensKey  = []byte(`"cached_tokens":`)
	inputTokensKey   = []byte(`"input_tokens":`)
	cacheReadKey     = []byte(`"cache_read_input_tokens":`)
	cacheCreationKey = []byte(`"cache_creation_input_tokens":`)
	completionKey    = []byte(`"completion_tokens":`)
	outputTokensKey  = []byte(`"output_tokens":`)
)

// maxUsageScan bounds how many "usage" objects of one piece sniffUsage reads, last first: a
// piece may end with usage that has no prompt count (Anthropic's message_delta, OpenAI's
// "usage":null chunks) after the one that has it (message_start).
const maxUsageScan = 4

// sniffUsage reads the prompt and cached tokens of a usage object in a relayed piece of body:
// OpenAI's final SSE usage chunk or JSON response (prompt_tokens,
// prompt_tokens_details.cached_tokens), or the Messages API's message_start event or JSON
// response (input_tokens + cache_read_input_tokens + cache_creation_input_tokens prompt
// tokens, of which cache_read_input_tokens cached). A usage object split across two reads is
// missed; that costs one request's tokens in a metric, nothing else.
func (f *flow) sniffUsage(p []byte) {
	for end, n := len(p), 0; end > 0 && n < maxUsageScan; n++ {
		i := bytes.LastIndex(p[:end], usageKey)
		if i < 0 {
			return
		}
		if f.usageAt(p[i:]) {
			return
		}
		end = i
	}
}

// usageAt reads the usage object at the start of u and reports whether it had a prompt count.
// An Anthropic usage without cache_read_input_tokens (a server that reports the cache only in
// some events) does not replace a reading that had it.
func (f *flow) usageAt(u []byte) bool {
	if f.qit != nil || f.direct { // flow control charges its flow the tokens generated (settleQueued, chargeDirect)
		if v, ok := intAfter(u, completionKey); ok {
			f.usageOutput, f.usageOutputSeen = v, true
		} else if v, ok := intAfter(u, outputTokensKey); ok {
			f.usageOutput, f.usageOutputSeen = v, true
		}
	}
	if v, ok := intAfter(u, promptTokensKey); ok {
		f.usagePrompt = v
		f.usageCached, f.usageCacheSeen = 0, false
		if c, ok := intAfter(u, cachedTokensKey); ok {
			f.usageCached, f.usageCacheSeen = c, true
		}
		return true
	}
	in, ok := intAfter(u, inputTokensKey)
	if !ok {
		return false
	}
	read, hasRead := intAfter(u, cacheReadKey)
	if !hasRead && f.usagePrompt > 0 {
		return true
	}
	created, _ := intAfter(u, cacheCreationKey)
	f.usagePrompt = in + read + created
	f.usageCached, f.usageCacheSeen = read, hasRead
	return true
}
