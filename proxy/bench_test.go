package proxy

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/overhead/agentbody"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// benchBodies makes chat bodies of about size bytes that share one of four system prompts
// (three quarters of the body) and differ from the user turn on: body(i) writes i at the
// start of the user turn, so every request brings new chunks, as in steady-state traffic.
type benchBodies struct {
	head [4][]byte // {"model":...,"messages":[{system},{"role":"user","content":"
	tail []byte    // user text after the request number, and the closing JSON
}

func newBenchBodies(size int, stream bool) *benchBodies {
	words := strings.Fields("the model server keeps a cache of attention keys and values for every prompt prefix it has seen so a request whose prefix is cached skips most of its prefill")
	text := func(n, seed int) string {
		var sb strings.Builder
		for i := seed; sb.Len() < n; i++ {
			sb.WriteString(words[(i*7+seed)%len(words)])
			sb.WriteByte(' ')
		}
		return sb.String()[:n]
	}
	content := max(size-200, 64)
	sys := content * 3 / 4
	bb := &benchBodies{}
	for i := range bb.head {
		bb.head[i] = []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","max_tokens":16,"stream":` + strconv.FormatBool(stream) +
			`,"messages":[{"role":"system","content":"You are assistant ` + strconv.Itoa(i) + `. ` + text(sys, i+1) +
			`"},{"role":"user","content":"Request `)
	}
	bb.tail = []byte(": " + text(content-sys, 99) + `"}]}`)
	return bb
}

func (bb *benchBodies) body(dst []byte, i uint64) []byte {
	dst = append(dst[:0], bb.head[i%uint64(len(bb.head))]...)
	dst = strconv.AppendUint(dst, i, 10)
	return append(dst, bb.tail...)
}

// zeroBackends are the URLs of n zero-latency backends on loopback, until the benchmark ends.
func zeroBackends(b *testing.B, n int) []string {
	b.Helper()
	z, err := sim.StartZero(n, "127.0.0.1", 0, sim.ZeroOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = z.Close() })
	return z.URLs()
}

// BenchmarkProxy sends chat completions through the proxy (fasthttp client → proxy →
// zero-latency backend, all on loopback in this process) from 4×GOMAXPROCS goroutines.
// ns/op is the inverse of throughput; B/op and allocs/op cover client, proxy and backend
// together, so what matters is that they do not grow with the body.
func BenchmarkProxy(b *testing.B) {
	for _, mode := range []string{"round-robin", "prefix"} {
		for _, stream := range []bool{false, true} {
			for _, size := range []int{1 << 10, 16 << 10, 128 << 10} {
				name := fmt.Sprintf("mode=%s/stream=%v/body=%dKB", mode, stream, size>>10)
				b.Run(name, func(b *testing.B) { benchProxyRequests(b, mode, stream, size) })
			}
		}
	}
}

func benchProxyRequests(b *testing.B, mode string, stream bool, size int) {
	s, base := startProxy(b, mode, zeroBackends(b, 2), checksOn)
	if _, ok := s.Policy().(*router.Prefix); mode == "prefix" && !ok {
		b.Fatalf("mode prefix runs %T, want *router.Prefix", s.Policy())
	}
	addr := strings.TrimPrefix(base, "http://")
	bb := newBenchBodies(size, stream)
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 256, ReadTimeout: 30 * time.Second, NoDefaultUserAgentHeader: true}
	defer hc.CloseIdleConnections()
	uri := "http://" + addr + "/v1/chat/completions"
	var seq atomic.Uint64
	var failed atomic.Value
	b.SetBytes(int64(len(bb.body(nil, 0))))
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var req fasthttp.Request
		var resp fasthttp.Response
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/json")
		req.SetRequestURI(uri)
		buf := make([]byte, 0, size+1024)
		for pb.Next() {
			buf = bb.body(buf, seq.Add(1))
			req.SetBodyRaw(buf)
			resp.Reset()
			if err := hc.Do(&req, &resp); err != nil {
				failed.Store(err.Error())
				return
			}
			if resp.StatusCode() != fasthttp.StatusOK || len(resp.Body()) == 0 {
				failed.Store(fmt.Sprintf("status %d, %d body bytes", resp.StatusCode(), len(resp.Body())))
				return
			}
		}
	})
	b.StopTimer()
	if msg := failed.Load(); msg != nil {
		b.Fatal(msg)
	}
}

// BenchmarkRoutingDecision is the whole routing decision of mode prefix for one request,
// without I/O: key.Build (parse, render, chained chunk hashes) + Pick + Learn, with an index
// that holds the shared system prompts and keeps learning every new user turn. The 1 MB case
// is a coding agent's body (bench/overhead/agentbody: tools, system prompt, a history of
// tool calls and results), each request of a session its previous request plus one step, as
// bench overhead sends at 1 MB: key.NewBuilder resumes its key from the previous request's
// (key/memo.go), except at a session's first request (1 in agentbody.DefaultSteps); the
// 1MB-agent-full case keys every body in full. benchInFlight requests stay dispatched, each
// released benchInFlight decisions later as bench overhead's closed loop does, so that the
// load caps spread the sessions over the backends as they do under load (with nothing in
// flight every request would go where the shared prompt is held, and that one backend's
// capacity would churn through every session's history).
func BenchmarkRoutingDecision(b *testing.B) {
	const benchInFlight = 32 // bench overhead's closed-loop connections
	type bodies func(dst []byte, i uint64) []byte
	chat := func(size int) bodies { return newBenchBodies(size, true).body }
	agent, err := agentbody.New(agentbody.Options{Size: 1 << 20, StreamFraction: 1})
	if err != nil {
		b.Fatal(err)
	}
	agentBody := func(dst []byte, i uint64) []byte { dst, _ = agent.Body(dst, i); return dst }
	for _, c := range []struct {
		name string
		body bodies
		warm uint64 // bodies learned before the timer starts
		full bool   // key every body in full: a Builder without the memo (key/memo.go)
	}{
		{"body=1KB", chat(1 << 10), 64, false},
		{"body=16KB", chat(16 << 10), 64, false},
		{"body=128KB", chat(128 << 10), 64, false},
		{"body=1MB-agent", agentBody, 2 * agentbody.DefaultSessions, false},
		{"body=1MB-agent-full", agentBody, 2 * agentbody.DefaultSessions, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			// The defaults, as mode prefix runs, but for the KV capacity bench overhead gives its
			// prefixlb (overhead.BenchKVCacheTokens), which holds the agent sessions' working set:
			// at the default 400k tokens 64 sessions of ~220k tokens churn through every
			// backend's capacity, and the case would measure evictions.
			pol := router.NewPrefix(router.PrefixOptions{DefaultKVCacheTokens: 8 << 20}, nil)
			bs := make([]*backend.Backend, 4)
			for i := range bs {
				var err error
				if bs[i], err = backend.New(fmt.Sprintf("http://10.0.0.%d:8000", i+1), 0, 1); err != nil {
					b.Fatal(err)
				}
			}
			pol.SetBackends(bs)
			kb := key.NewBuilder(0) // key.DefaultChunkTokens, the policy's
			if c.full {
				kb = &key.Builder{ChunkTokens: key.DefaultChunkTokens}
			}
			path := []byte("/v1/chat/completions")
			var k key.Key
			var buf []byte
			var leases [benchInFlight]backend.Lease
			dispatch := func(i uint64, d router.Decision) {
				l := &leases[i%benchInFlight]
				l.Release()
				l.Begin(d.Backend, d.PrefillTokens, 0, false)
			}
			for i := range c.warm {
				buf = c.body(buf, 1<<40+i)
				kb.Build(path, buf, &k)
				d := pol.Pick(&k, bs)
				pol.Learn(&k, d.Backend, 0)
				dispatch(i, d)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := uint64(0); b.Loop(); i++ {
				// Making the body is timed too (a copy: about 40 µs of a 1 MB agent body,
				// agentbody's BenchmarkBody); the agent's sessions go on where the warm-up left them.
				buf = c.body(buf, 1<<40+c.warm+i)
				kb.Build(path, buf, &k)
				d := pol.Pick(&k, bs)
				pol.Learn(&k, d.Backend, d.MatchedChunks)
				dispatch(c.warm+i, d)
			}
			b.StopTimer()
			if !k.OK || len(k.Chunks) == 0 {
				b.Fatal("body did not produce a routing key")
			}
		})
	}
}
