package oracle

import (
	"testing"
)

// BenchmarkOraclePickAgenticBody: the routing cost the oracle adds in the proxy's request path
// (counted in the oracle arm's own TTFT) for one agentic-sized request (60k-token prompt) on
// 4 idle replicas: ParsePrompt (the sim's tokenizer on the body), one NewPending (the prompt's
// block chain) and one locked walk per replica.
func BenchmarkOraclePickAgenticBody(b *testing.B) {
	t := &testing.T{}
	c := prepared(t, 4, nil)
	defer c.Close()
	bs := backendsOf(t, c)
	body := chatBody(t, words("ctx", 60000), 200)
	orc := New(c)
	k := keyOf(body)
	b.ResetTimer()
	for b.Loop() {
		_ = orc.Pick(k, bs)
	}
}
