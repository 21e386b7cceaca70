package peering

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// The routed-request benchmarks' workload: chat bodies of about benchBodyBytes (bench
// overhead measures peering's cost at 16 KB bodies), benchPrompts distinct conversations
// sharing a system prompt of benchSystemBytes, each request a fresh key build, a Pick and a
// Learn.
const (
	benchBodyBytes   = 16 << 10
	benchSystemBytes = 4 << 10
	benchPrompts     = 256
)

// benchBodies returns the benchmark's request bodies.
func benchBodies() [][]byte {
	system := strings.Repeat("You are a careful assistant; answer briefly. ", benchSystemBytes/45)
	out := make([][]byte, benchPrompts)
	for i := range out {
		line := fmt.Sprintf("Conversation %d asks about item %d in detail. ", i, i)
		user := strings.Repeat(line, (benchBodyBytes-benchSystemBytes)/len(line))
		out[i], _ = json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": user}}})
	}
	return out
}

// routedRequests runs b.N requests' routing work (key build, Pick, Learn) through pol on bs,
// in parallel on every core: what the flusher and a peer's receiver cost in the same process
// comes out of the same cores.
func routedRequests(b *testing.B, pick func(*key.Key, []*backend.Backend) router.Decision,
	learn func(*key.Key, *backend.Backend, int) router.Learned, bs []*backend.Backend) {
	bodies := benchBodies()
	path := []byte("/v1/chat/completions")
	var next atomic.Uint64
	b.SetBytes(int64(len(bodies[0])))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		kb := key.NewBuilder(0)
		var k key.Key
		for pb.Next() {
			kb.Build(path, bodies[next.Add(1)%benchPrompts], &k)
			d := pick(&k, bs)
			learn(&k, d.Backend, d.MatchedChunks)
		}
	})
}

// BenchmarkRoutedRequestUnpeered is one request's routing work on a prefix policy alone.
func BenchmarkRoutedRequestUnpeered(b *testing.B) {
	var bs []*backend.Backend
	for _, u := range backendURLs {
		be, err := backend.New(u, 0, 1)
		if err != nil {
			b.Fatal(err)
		}
		bs = append(bs, be)
	}
	p := router.NewPrefix(router.PrefixOptions{}, nil)
	p.SetBackends(bs)
	routedRequests(b, p.Pick, p.Learn, bs)
}

// BenchmarkRoutedRequestPeered is the same through a peered replica's Policy, with its
// flusher sending every Learn to a real peer over 127.0.0.1 (encrypted UDP) and that peer
// recording them, all in this process; peer-B/req is the update bytes sent per request.
func BenchmarkRoutedRequestPeered(b *testing.B) {
	a := startReplica(b, "a", replicaOpts{})
	peer := startReplica(b, "b", replicaOpts{join: []*replica{a}})
	testutil.Eventually(b, wait, "joined", func() bool { return a.node.Alive() == 1 && peer.node.Alive() == 1 })
	before := a.node.Stats().BytesSent
	pol := a.node.Policy()
	routedRequests(b, pol.Pick, pol.Learn, a.bs)
	b.StopTimer()
	b.ReportMetric(float64(a.node.Stats().BytesSent-before)/float64(b.N), "peer-B/req")
}
