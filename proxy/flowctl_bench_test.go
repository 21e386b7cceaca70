package proxy

import (
	"fmt"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/router/key"
)

// BenchmarkHoldNotSaturated is the decision cost flow control adds to a request whose pool
// is not saturated (the light-load path): the saturation test over the pool's replicas,
// none saturated but the last, and the held-requests check. Target ≤ 2 µs, allocation-free
// (docs/flow-control.md, "Cost").
func BenchmarkHoldNotSaturated(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run("replicas="+itoa(n), func(b *testing.B) {
			s := benchFCServer(b, n)
			f := &flow{s: s, k: key.Key{Routed: true, OK: true}}
			f.cands = s.pool.Snapshot()
			ctx := &fasthttp.RequestCtx{}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := s.hold(ctx, f); err != nil || f.placed {
					b.Fatal("held")
				}
			}
		})
	}
}

// TestHoldNotSaturatedAllocationFree: the light-load path allocates nothing.
func TestHoldNotSaturatedAllocationFree(t *testing.T) {
	s := benchFCServer(t, 8)
	f := &flow{s: s, k: key.Key{Routed: true, OK: true}}
	f.cands = s.pool.Snapshot()
	ctx := &fasthttp.RequestCtx{}
	if a := testing.AllocsPerRun(1000, func() { _ = s.hold(ctx, f) }); a != 0 {
		t.Errorf("hold allocates %.1f times per request on the light-load path", a)
	}
}

// benchFCServer is a Server with flow control on over n replicas, each with a configured
// limit of 8, a scrape showing requests and KV use, and all full but the last: the
// saturation test reads every one.
func benchFCServer(tb testing.TB, n int) *Server {
	urls := make([]string, n)
	for i := range urls {
		urls[i] = "http://127.0.0.1:" + itoa(20000+i)
	}
	o := testOptions(tb, "least-load", urls...)
	noHealthChecks(&o)
	o.FlowControl = FlowControl{Enabled: true}
	s, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.fc.close(); s.wd.close() })
	for i, be := range s.pool.Snapshot() {
		be.SetMaxConcurrency(8)
		leases := 8
		if i == n-1 {
			leases = 7
		}
		for range leases {
			var l backend.Lease
			l.Begin(be, 10, 10, false)
			tb.Cleanup(l.Release)
		}
	}
	return s
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// BenchmarkChargeDirect is what the end of a request that went straight through costs flow
// control (chargeDirect): idle, its pool's queue holds nothing (an atomic load); active,
// the queue has a backlog, so the request is classified (the flow_control section's
// classifier, a bearer key, 8 rules none of which match) and charged to its flow under the
// queue's lock.
func BenchmarkChargeDirect(b *testing.B) {
	var rules []flowcontrol.Rule
	for i := range 8 {
		rules = append(rules, flowcontrol.Rule{APIKeySHA256: flowcontrol.HashKey(fmt.Sprint("other-key-", i)), Flow: fmt.Sprint("r", i)})
	}
	cl, err := flowcontrol.NewClassifier(flowcontrol.ClassifierConfig{Rules: rules})
	if err != nil {
		b.Fatal(err)
	}
	for _, active := range []bool{false, true} {
		name := "idle"
		if active {
			name = "active"
		}
		b.Run(name, func(b *testing.B) {
			s := benchFCServer(b, 8)
			s.SetFlowControl(FlowControl{Enabled: true, Classifier: configClassifier{cl}})
			pq, err := s.fc.queueFor(poolAll)
			if err != nil {
				b.Fatal(err)
			}
			if active {
				s.fc.close() // no dispatcher: the item stays queued
				it := &flowcontrol.Item{Flow: "waiting", Cost: flowcontrol.Cost{UncachedPrefillTokens: 100}}
				if err := pq.q.Push(it, true); err != nil {
					b.Fatal(err)
				}
			}
			var h fasthttp.RequestHeader
			h.Set("Authorization", "Bearer sk-tenant-key-0123456789")
			f := &flow{s: s, path: []byte("/v1/chat/completions")}
			f.k.Routed, f.k.OK, f.k.PromptTokens = true, true, 1000
			f.k.Body = []byte(`{"model":"m","max_tokens":64}`)
			f.resp.SetStatusCode(200)
			f.usagePrompt, f.usageOutput, f.usageOutputSeen = 1000, 64, true
			b.ReportAllocs()
			for b.Loop() {
				f.direct, f.reqHeader = true, &h
				s.chargeDirect(f)
			}
		})
	}
}
