package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/router"
)

// TestFlowControlChargesStraightThrough: the work of requests that went straight through
// (their pool had room) is charged to their flow, so a flow whose long requests filled the
// replica is served after a quiet flow once both wait. Uncharged, the flooding flow's
// request, queued first, would go first: both flows start level.
func TestFlowControlChargesStraightThrough(t *testing.T) {
	e := newEngine(t, 2)
	e.outTokens = 2000 // each straight-through request generated 2,000 tokens: 4,020 of work
	s, base := startFC(t, 2, nil, e)
	ctx := context.Background()
	flood, quiet := map[string]string{"x-test-flow": "flood"}, map[string]string{"x-test-flow": "quiet"}
	var res []<-chan fcResult
	for i := range 2 {
		res = append(res, sendChat(ctx, base, fmt.Sprint("req-f", i), flood))
		e.waitArrival(t)
	}
	if n := s.fc.m.queued.Get(); n != 0 {
		t.Fatalf("%d requests queued while the replica had room", n)
	}
	res = append(res, sendChat(ctx, base, "req-f2", flood))
	waitHeld(t, s, 1)
	res = append(res, sendChat(ctx, base, "req-q0", quiet))
	waitHeld(t, s, 2)
	e.finish() // one of flood's straight-through requests ends: its flow is charged
	if id := e.waitArrival(t); id != "req-q0" {
		t.Fatalf("the freed slot went to %s, want req-q0: the flood's straight-through work was not charged to its flow", id)
	}
	for range 3 {
		e.finish()
	}
	for _, ch := range res {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d", r.id, r.status)
		}
	}
}

// TestChargeDirectIdleQueueAllocationFree: with flow control on and nothing of the pool
// queued, in flight from its queue or remembered, the end of a request that went straight
// through costs no classification, no lock and no allocation.
func TestChargeDirectIdleQueueAllocationFree(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	s := benchFCServer(t, 8)
	calls := &countingClassifier{}
	s.SetFlowControl(FlowControl{Enabled: true, Classifier: calls})
	if _, err := s.fc.queueFor(poolAll); err != nil { // a pool that was saturated once
		t.Fatal(err)
	}
	f := &flow{s: s}
	f.k.Routed, f.k.OK, f.k.PromptTokens = true, true, 100
	var h fasthttp.RequestHeader
	f.resp.SetStatusCode(http.StatusOK)
	if a := testing.AllocsPerRun(1000, func() {
		f.direct, f.reqHeader = true, &h
		s.chargeDirect(f)
	}); a != 0 {
		t.Errorf("charging a straight-through request allocates %.1f times with the queue idle", a)
	}
	if n := calls.n.Load(); n != 0 {
		t.Errorf("classified %d times with the queue idle", n)
	}
}

// countingClassifier counts its calls.
type countingClassifier struct{ n atomic.Int64 }

func (c *countingClassifier) Classify(string, []byte, RequestHeaders) (int, string, flowcontrol.Ignored) {
	c.n.Add(1)
	return 0, "x", 0
}

// TestFlowControlContendedPlacementRequeued: a request the dispatcher placed on the replica
// that freed a slot, whose settle hold then finds a peered prefixlb's decision on that
// replica made first (the peer's request now counted there), goes back to the head of its
// queue instead of being decided again among saturated replicas: no engine sees it until a
// slot frees again, and it still leaves before the request queued behind it. Its second
// wait in the queue-wait histogram counts from its return, not again from its arrival.
func TestFlowControlContendedPlacementRequeued(t *testing.T) {
	a, b := newEngine(t, 1), newEngine(t, 1)
	var peerB atomic.Pointer[backend.Backend]
	pol := &settlingPolicy{
		picks:     []string{a.URL(), b.URL()}, // then b again
		contended: []bool{false, false, true}, // req-3's first hold on b: a peer's decision came first
		wait:      20 * time.Millisecond,
		learnAt:   map[router.Learned]time.Time{},
		received:  map[string]*atomic.Int64{},
		beforeRelease: func(n int) {
			if n == 2 {
				peerB.Load().SetPeerLoad(1, 0) // the peer's request, flushed during the hold
			}
		},
	}
	s, base := startProxy(t, "prefix", []string{a.URL(), b.URL()}, func(o *Options) {
		o.Policy = pol
		o.FlowControl = FlowControl{Enabled: true, Classifier: headerClassifier{}}
		for _, be := range o.Backends {
			be.SetMaxConcurrency(1)
			if be.Name == b.URL() {
				peerB.Store(be)
			}
		}
	})
	ctx := context.Background()
	send := func(id, flow string) <-chan fcResult {
		return sendBody(ctx, base, id, longChatBody(id), map[string]string{"x-test-flow": flow})
	}
	r1 := send("req-1", "z") // z's straight-through work is charged to z, neither x nor y
	if id := a.waitArrival(t); id != "req-1" {
		t.Fatalf("a received %s", id)
	}
	r2 := send("req-2", "z")
	if id := b.waitArrival(t); id != "req-2" {
		t.Fatalf("b received %s", id)
	}
	sent3 := time.Now()
	r3 := send("req-3", "x")
	waitHeld(t, s, 1)
	sent4 := time.Now()
	r4 := send("req-4", "y") // another flow, queued behind req-3
	waitHeld(t, s, 2)

	// req-3's first wait, which its second must not count again.
	time.Sleep(100 * time.Millisecond)
	b.finish() // req-2 ends: req-3 is placed on b, and a peer's request takes b meanwhile
	deadline := time.After(testTimeout)
	for s.fc.m.returned.Get() == 0 {
		select {
		case id := <-b.arrivals:
			t.Fatalf("%s was sent to b, which a peer's request had filled: decided again among saturated replicas instead of queued again", id)
		case <-deadline:
			t.Fatal("req-3 was not put back in the queue")
		case <-time.After(time.Millisecond):
		}
	}
	waitHeld(t, s, 2)
	a.noArrival(t)
	b.noArrival(t)

	peerB.Load().SetPeerLoad(0, 0) // the peer's request ends: b has room again
	if id := b.waitArrival(t); id != "req-3" {
		t.Fatalf("b received %s, want req-3: the returned request lost its place", id)
	}
	// From before it was queued to after its replica had it.
	held3 := time.Since(sent3)
	a.finish() // req-1 ends: req-4 goes to a
	if id := a.waitArrival(t); id != "req-4" {
		t.Fatalf("a received %s, want req-4", id)
	}
	held4 := time.Since(sent4)
	a.finish()
	b.finish()
	for _, ch := range []<-chan fcResult{r1, r2, r3, r4} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d %s", r.id, r.status, r.body)
		}
	}
	if got := s.fc.m.outcomes[flowcontrol.Dispatched].Get(); got != 3 {
		t.Errorf("%d dispatches, want 3 (req-3 twice, req-4)", got)
	}
	// req-3's second wait counts from its return, so the waits add up to no more than the
	// two requests were held (counted again from its arrival they exceed it by its first).
	if waited, most := metricSum(t, s, `prefixlb_flow_queue_wait_seconds_sum{outcome="dispatched"}`), (held3 + held4).Seconds(); waited > most {
		t.Errorf("queue waits of dispatched requests sum to %.3f s, more than req-3 and req-4 were held (%.3f s)", waited, most)
	}
	if seen, _, _ := b.stats(); fmt.Sprint(seen) != "[req-2 req-3]" {
		t.Errorf("b saw %v", seen)
	}
}

// longChatBody is a chat request whose prompt, long enough for a policy to learn and settle
// it, carries id.
func longChatBody(id string) string {
	return `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"` + id + ` ` + strings.Repeat("a long prompt ", 200) + `"}]}`
}

// sendBody posts a chat body with headers h and delivers what came back.
func sendBody(ctx context.Context, base, id, body string, h map[string]string) <-chan fcResult {
	out := make(chan fcResult, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := testClient().Do(req)
		if err != nil {
			out <- fcResult{id: id, err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- fcResult{id: id, status: resp.StatusCode, backend: resp.Header.Get(HeaderBackend), retryAfter: resp.Header.Get("Retry-After"), body: string(b)}
	}()
	return out
}

// configClassifier is the flow_control section's classifier as prefixlb serve wires it
// (app's adapter).
type configClassifier struct{ c *flowcontrol.Classifier }

func (c configClassifier) Classify(path string, model []byte, h RequestHeaders) (int, string, flowcontrol.Ignored) {
	cl := c.c.Classify(flowcontrol.Request{Path: path, Model: string(model), Headers: h})
	return cl.Priority, cl.Flow, cl.Ignored
}

// TestFlowControlCountsIgnoredHeaders: a priority or flow header the classifier does not
// use is counted by reason (prefixlb_flow_ignored_headers_total), its value and name in no
// label.
func TestFlowControlCountsIgnoredHeaders(t *testing.T) {
	long := strings.Repeat("t", flowcontrol.MaxHeaderValue+1)
	cases := []struct {
		name    string
		trusted bool
		headers map[string]string
		want    string // the reason counted; "" none
	}{
		{"no header", false, nil, ""},
		{"priority, untrusted", false, map[string]string{"x-prefixlb-priority": "1000"}, "untrusted"},
		{"llm-d objective, untrusted", false, map[string]string{"X-LLM-D-Inference-Objective": "critical"}, "untrusted"},
		{"llm-d fairness id, untrusted", false, map[string]string{"x-llm-d-inference-fairness-id": "me"}, "untrusted"},
		{"flow, untrusted", false, map[string]string{"x-prefixlb-flow": "me"}, "untrusted"},
		{"bad priority, trusted", true, map[string]string{"x-prefixlb-priority": "urgent"}, "bad_priority"},
		{"priority out of range, trusted", true, map[string]string{"x-prefixlb-priority": "1001"}, "bad_priority"},
		{"too long, trusted", true, map[string]string{"x-prefixlb-flow": long}, "too_long"},
		{"unknown objective, trusted", true, map[string]string{"x-llm-d-inference-objective": "vip"}, "unknown_objective"},
		{"valid, trusted", true, map[string]string{"x-prefixlb-priority": "5", "x-llm-d-inference-objective": "critical"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := flowcontrol.NewClassifier(flowcontrol.ClassifierConfig{TrustedHeaders: tc.trusted, Objectives: map[string]int{"critical": 10}})
			if err != nil {
				t.Fatal(err)
			}
			s := benchFCServer(t, 1)
			s.SetFlowControl(FlowControl{Enabled: true, Classifier: configClassifier{cl}})
			var h fasthttp.RequestHeader
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			f := &flow{s: s, path: []byte("/v1/chat/completions")}
			s.classify(f, &h, s.fc.config())
			m := metricsText(s)
			for _, r := range flowcontrol.IgnoredReasons {
				want := 0
				if r.String() == tc.want {
					want = 1
				}
				line := fmt.Sprintf(`prefixlb_flow_ignored_headers_total{reason=%q} %d`, r, want)
				if !strings.Contains(m, line+"\n") {
					t.Errorf("want %s", line)
				}
			}
			for k, v := range tc.headers {
				for _, l := range strings.Split(m, "\n") {
					if strings.Contains(l, "ignored") && (strings.Contains(strings.ToLower(l), strings.ToLower(k)) || strings.Contains(l, v)) {
						t.Errorf("metrics show a header's name or value: %s", l)
					}
				}
			}
		})
	}
}

// TestFlowControlCountsIgnoredHeadersQueued: end to end, a queued request that tries to
// raise its own priority with trusted headers off is counted once, and keeps the default
// priority.
func TestFlowControlCountsIgnoredHeadersQueued(t *testing.T) {
	cl, err := flowcontrol.NewClassifier(flowcontrol.ClassifierConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, 1)
	s, base := startFC(t, 1, func(c *FlowControl) { c.Classifier = configClassifier{cl} }, e)
	ctx := context.Background()
	first := sendChat(ctx, base, "req-1", nil)
	e.waitArrival(t)
	queued := sendChat(ctx, base, "req-2", map[string]string{"x-prefixlb-priority": "1000", "x-prefixlb-flow": "vip"})
	waitHeld(t, s, 1)
	if info := s.QueueInfo(); len(info.Pools) != 1 || len(info.Pools[0].Queue.Bands) != 1 || info.Pools[0].Queue.Bands[0].Priority != 0 {
		t.Errorf("queued as %+v, want priority 0", info.Pools)
	}
	if !strings.Contains(metricsText(s), `prefixlb_flow_ignored_headers_total{reason="untrusted"} 1`+"\n") {
		t.Error("the untrusted priority header was not counted")
	}
	e.finish()
	e.finish()
	for _, ch := range []<-chan fcResult{first, queued} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d", r.id, r.status)
		}
	}
}
