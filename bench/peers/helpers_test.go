package peers

import (
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// testChunkTokens is the chunk size of the test keys: the default.
const testChunkTokens = key.DefaultChunkTokens

// testBackends returns n registered-to-nothing backends named b0..b{n-1}.
func testBackends(t *testing.T, n int) []*backend.Backend {
	t.Helper()
	bs := make([]*backend.Backend, n)
	for i := range bs {
		b, err := backend.New(fmt.Sprintf("http://127.0.0.1:%d", 9000+i), 400_000, 1)
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
	}
	return bs
}

// chain returns n chunk hashes named by label: chain("a", 3) and chain("a", 5) share their
// first 3 (a prefix), chain("b", 3) shares none with either.
func chain(label string, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = xxhash.Sum64String(fmt.Sprintf("%s/%d", label, i))
	}
	return out
}

// keyOf is a parsed, routed key of chunks whose prompt is exactly those chunks long.
func keyOf(chunks []uint64) *key.Key {
	return &key.Key{Routed: true, OK: true, Chunks: chunks, PromptTokens: key.PrefixTokens(len(chunks), testChunkTokens)}
}

// loads sets each backend's in-flight count to in[i] with leases released at test end.
func loads(t *testing.T, bs []*backend.Backend, in ...int) {
	t.Helper()
	for i, n := range in {
		for range n {
			l := new(backend.Lease)
			l.Begin(bs[i], 0, 0, false)
			t.Cleanup(l.Release)
		}
	}
}
