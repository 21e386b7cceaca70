package router

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// stepClock is an injected clock that moves only when told.
type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { return c.t }

func prefixBackends(t testing.TB, n int) []*backend.Backend {
	t.Helper()
	bs := make([]*backend.Backend, n)
	for i := range bs {
		b, err := backend.New(fmt.Sprintf("http://10.0.0.%d:8000", i+1), 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
	}
	return bs
}

func newTestPrefix(t testing.TB, bs []*backend.Backend) (*Prefix, *stepClock) {
	t.Helper()
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	p := NewPrefix(PrefixOptions{}, clk.now)
	p.SetBackends(bs)
	return p, clk
}

// chunkChain is a chain of chunk hashes built like the real key: each chunk's hash covers the
// previous hash, so prompts that extend one another share their leading chunks.
type chunkChain []uint64

// extend returns a new chain: p followed by n chunks of text named by label.
func (p chunkChain) extend(label string, n int) chunkChain {
	out := slices.Clone(p)
	var buf []byte
	for i := range n {
		var prev uint64
		if len(out) > 0 {
			prev = out[len(out)-1]
		}
		buf = binary.LittleEndian.AppendUint64(buf[:0], prev)
		buf = fmt.Appendf(buf, "%s/%d", label, i)
		h := xxhash.Sum64(buf) &^ 1 // marked as the key marks it: fine, then coarse (key.IsCoarse)
		if len(out) >= key.FineChunks {
			h |= 1
		}
		out = append(out, h)
	}
	return out
}

func routedKey(p chunkChain) *key.Key {
	return &key.Key{Routed: true, OK: true, Chunks: p, PromptTokens: 64 * len(p)}
}

// inflight holds leases in flight, as the proxy would between dispatch and the end of the
// response.
type inflight []*backend.Lease

func (rs *inflight) begin(b *backend.Backend, tokens int) {
	l := new(backend.Lease)
	l.Begin(b, int64(tokens), 0, false)
	*rs = append(*rs, l)
}

func (rs *inflight) releaseAll() {
	for _, l := range *rs {
		l.Release()
	}
	*rs = (*rs)[:0]
}

// releaseOldest ends the oldest request.
func (rs *inflight) releaseOldest() {
	(*rs)[0].Release()
	*rs = (*rs)[1:]
}

// capNow is the hard cap over candidates before the next request: no pick goes past it.
func capNow(p *Prefix, cs []*backend.Backend) int64 {
	var total int64
	for _, b := range cs {
		total += b.InFlight()
	}
	return loadCap(total, 1, len(cs), p.sel.hardFactor, p.sel.margin)
}

// pickAndLearn picks, checks the hard cap, learns and begins the request, as the proxy does.
func pickAndLearn(t *testing.T, p *Prefix, k *key.Key, cs []*backend.Backend, rs *inflight) Decision {
	t.Helper()
	limit := capNow(p, cs)
	d := p.Pick(k, cs)
	if d.Backend == nil {
		t.Fatal("no backend picked")
	}
	if in := d.Backend.InFlight(); in >= limit {
		t.Fatalf("picked %s with %d in flight, at or over the hard cap %d", d.Backend.Name, in, limit)
	}
	p.Learn(k, d.Backend, d.MatchedChunks)
	rs.begin(d.Backend, int(d.PrefillTokens))
	return d
}
