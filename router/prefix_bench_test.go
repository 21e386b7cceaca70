package router

import (
	"fmt"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// benchmarkPickLearn picks and learns conversations whose first half is a prefix shared by
// all 8 backends. With 128 conversations every backend's entries fit its capacity (6,250
// chunks); with 256 of 128 KB they do not, and every Learn evicts.
func benchmarkPickLearn(b *testing.B, promptBytes, conversations int) {
	bs := prefixBackends(b, 8)
	p, _ := newTestPrefix(b, bs)
	n := promptBytes / 256
	sys := chunkChain(nil).extend("shared", n/2)
	keys := make([]*key.Key, conversations)
	for i := range keys {
		keys[i] = routedKey(sys.extend(fmt.Sprint("conversation ", i), n-n/2))
		p.Learn(keys[i], bs[i%len(bs)], 0)
	}
	for _, b := range bs {
		p.Learn(routedKey(sys), b, 0)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := keys[i%len(keys)]
		d := p.Pick(k, bs)
		p.Learn(k, d.Backend, d.MatchedChunks)
	}
}

func BenchmarkPickLearn1KB(b *testing.B)        { benchmarkPickLearn(b, 1<<10, 128) }
func BenchmarkPickLearn16KB(b *testing.B)       { benchmarkPickLearn(b, 16<<10, 128) }
func BenchmarkPickLearn128KB(b *testing.B)      { benchmarkPickLearn(b, 128<<10, 128) }
func BenchmarkPickLearn128KBEvict(b *testing.B) { benchmarkPickLearn(b, 128<<10, 256) }

// BenchmarkPickCold measures the ring path: prompts nobody holds (tie_break auto, the
// backends' other senders unknown).
func BenchmarkPickCold(b *testing.B) { benchmarkPickCold(b, backend.SendersUnknown) }

// BenchmarkPickColdAlone is BenchmarkPickCold for a prefixlb replica alone (every backend
// SendersAlone), which also reads each backend's recent routed share.
func BenchmarkPickColdAlone(b *testing.B) { benchmarkPickCold(b, backend.SendersAlone) }

func benchmarkPickCold(b *testing.B, senders backend.Senders) {
	bs := prefixBackends(b, 8)
	for _, be := range bs {
		be.SetOtherSenders(senders)
	}
	p := NewPrefix(PrefixOptions{TieBreak: TieBreakAuto}, nil)
	p.SetBackends(bs)
	keys := make([]*key.Key, 256)
	for i := range keys {
		keys[i] = routedKey(chunkChain(nil).extend(fmt.Sprint("cold ", i), 16))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p.Pick(keys[i%len(keys)], bs)
	}
}
