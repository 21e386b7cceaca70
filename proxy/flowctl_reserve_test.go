package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/router/key"
)

// TestFlowControlReservesForHigherBand: while a higher band was served lately, a lower band's
// request waits for a replica whose queued prefill has drained under ReservePrefill, though
// the replica has room by count, and is placed when it drains without any request ending (the
// dispatcher wakes at the predicted drain). A request of the higher band goes straight
// through before, and while the lower band's waits, without queueing: nothing waiting goes
// before it. Queued, it would meet the rule for a flow of its band (flowcontrol.Item.Yields)
// that a request sent on at once does not.
func TestFlowControlReservesForHigherBand(t *testing.T) {
	a := newEngine(t, 8)
	s, base := startFC(t, 1, func(c *FlowControl) { c.PrefillSaturation = -1 }, a)
	ctx := context.Background()
	high := longHighPlaced(t, s, base, a)

	high2 := sendChat(ctx, base, "req-high2", hiBand)
	if id := a.waitArrival(t); id != "req-high2" {
		t.Fatalf("arrived %s, want req-high2 straight through", id)
	}
	low := sendChat(ctx, base, "req-low", loBand)
	waitHeld(t, s, 1)
	start := time.Now()
	queued := s.fc.m.queued.Get()
	high3 := sendChat(ctx, base, "req-high3", hiBand)
	if id := a.waitArrival(t); id != "req-high3" {
		t.Fatalf("arrived %s, want req-high3 before the held lower band's request", id)
	}
	if n := s.fc.m.queued.Get(); n != queued {
		t.Errorf("req-high3 went through the queue (%d queued, %d before it) with only a lower band's request waiting", n, queued)
	}
	if id := a.waitArrival(t); id != "req-low" {
		t.Fatalf("arrived %s, want req-low once the prefill drained", id)
	}
	if w := time.Since(start); w > 5*time.Second {
		t.Errorf("req-low placed %v after it was held, about a second of prefill ahead of it: the dispatcher did not place it at the drain", w)
	}
	finishAllOK(t, a, high, high2, high3, low)
}

// TestFlowControlReserveOff: with ReservePrefill negative, a lower band's request goes
// straight through beside a higher band's queued prefill.
func TestFlowControlReserveOff(t *testing.T) {
	a := newEngine(t, 8)
	s, base := startFC(t, 1, func(c *FlowControl) { c.PrefillSaturation, c.ReservePrefill = -1, -1 }, a)
	high := longHighPlaced(t, s, base, a)
	low := sendChat(context.Background(), base, "req-low", loBand)
	if id := a.waitArrival(t); id != "req-low" {
		t.Fatalf("arrived %s, want req-low", id)
	}
	if n := s.fc.m.queued.Get(); n != 1 {
		t.Errorf("%d requests queued, want 1 (the long prompt only)", n)
	}
	finishAllOK(t, a, high, low)
}

// The bands of the reserve tests: a chat tenant above a batch tenant.
var (
	hiBand = map[string]string{"x-test-priority": "5", "x-test-flow": "chat"}
	loBand = map[string]string{"x-test-priority": "0", "x-test-flow": "batch"}
)

// longHighPlaced notes the higher band in s's queue and leaves a second of its prefill queued
// at a's replica: a lower band's request fills the replica (configured limit 1), a long
// higher-band prompt (about 10k tokens: a second at the default prefill rate, nothing
// learned) is queued behind it, the limit is raised to 8 and the filler ends, so the long
// prompt is placed. It returns the long prompt's result.
func longHighPlaced(t *testing.T, s *Server, base string, a *engine) <-chan fcResult {
	t.Helper()
	ctx := context.Background()
	fill := sendChat(ctx, base, "req-fill", loBand)
	a.waitArrival(t)
	long := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"question req-long ` + strings.Repeat("lorem ipsum dolor sit amet ", 1500) + `"}]}`
	high := sendBody(ctx, base, "req-long", long, hiBand)
	waitHeld(t, s, 1) // queued: its band is noted
	s.pool.Snapshot()[0].SetMaxConcurrency(8)
	a.finish()
	if id := a.waitArrival(t); id != "req-long" {
		t.Fatalf("dispatched %s, want req-long", id)
	}
	if r := recvResult(t, fill, "req-fill"); r.status != http.StatusOK {
		t.Fatalf("req-fill: status %d", r.status)
	}
	return high
}

// TestReserveWakeOnlyForDrain: the dispatcher wakes early at a predicted drain only when a
// replica is held by the reserve rule alone; a lower band's request held because every
// replica is full by count waits for the room signal (a request ending) or the poll, not a
// 1 ms spin: no drain of queued prefill frees a slot there.
func TestReserveWakeOnlyForDrain(t *testing.T) {
	s, pq := dispatcherOnly(t, 1, 10) // full by count; 10 prompt tokens: about 1 ms of prefill
	now := time.Now()
	pq.q.NoteBand(5, now)
	it := &flowcontrol.Item{Priority: 0, Flow: "batch", Arrival: now, Deadline: now.Add(time.Minute), Value: &flow{s: s, k: key.Key{Routed: true, OK: true}}}
	if err := pq.q.Push(it, true); err != nil {
		t.Fatal(err)
	}
	if sleep := s.fc.dispatch(now); sleep < dispatchPoll {
		t.Errorf("a lower band's request held by a full replica: the dispatcher sleeps %v, want the poll (%v)", sleep, dispatchPoll)
	}
	if pq.q.Len() != 1 {
		t.Fatal("the request was placed on a full replica")
	}
}

// TestReserveQueuesSheddable: the reserve rule holds a sheddable request (priority < 0) as
// it holds any lower band's, in the queue until the queued prefill drains: the pool is not
// saturated, and sheddable requests are refused only when it is.
func TestReserveQueuesSheddable(t *testing.T) {
	a := newEngine(t, 8)
	s, base := startFC(t, 1, func(c *FlowControl) { c.PrefillSaturation = -1 }, a)
	high := longHighPlaced(t, s, base, a)
	shed := sendChat(context.Background(), base, "req-shed", map[string]string{"x-test-priority": "-1", "x-test-flow": "eval"})
	select {
	case id := <-a.arrivals:
		if id != "req-shed" {
			t.Fatalf("arrived %s, want req-shed once the prefill drained", id)
		}
	case r := <-shed:
		t.Fatalf("req-shed answered before it reached the engine: status %d, body %s", r.status, r.body)
	case <-time.After(testTimeout):
		t.Fatal("req-shed never reached the engine")
	}
	for range 2 {
		a.finish()
	}
	for _, ch := range []<-chan fcResult{high, shed} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d, body %s", r.id, r.status, r.body)
		}
	}
}

// TestQueuedSheddableShedOnSaturation: a sheddable request queued while its pool had room
// (held by the reserve rule) is refused with 429, reason shed, once the dispatcher finds the
// pool saturated, instead of waiting in the queue for room.
func TestQueuedSheddableShedOnSaturation(t *testing.T) {
	a := newEngine(t, 8)
	s, base := startFC(t, 1, func(c *FlowControl) { c.PrefillSaturation = -1 }, a)
	high := longHighPlaced(t, s, base, a)
	shed := sendChat(context.Background(), base, "req-shed", map[string]string{"x-test-priority": "-1", "x-test-flow": "eval"})
	waitHeld(t, s, 1) // held by the reserve rule: the pool has room by count
	s.pool.Snapshot()[0].SetMaxConcurrency(1)
	r := recvResult(t, shed, "the sheddable request")
	if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "reason shed") {
		t.Errorf("req-shed: status %d, body %s; want 429 naming reason shed", r.status, r.body)
	}
	a.noArrival(t)
	a.finish()
	if r := recvResult(t, high, "req-long"); r.status != http.StatusOK {
		t.Errorf("req-long: status %d", r.status)
	}
}

// TestFlowControlBackloggedFlowYields: while a flow under its share was served lately, a
// request of a backlogged flow of the same band is held for a replica whose queued prefill
// has drained under ReservePrefill (flowcontrol.Item.Yields), though the replica has room by
// count and prefill saturation, and the dispatcher wakes at the predicted drain; with no
// such flow served it is placed at once.
func TestFlowControlBackloggedFlowYields(t *testing.T) {
	for _, lighter := range []bool{true, false} {
		s, pq := dispatcherOnly(t, 8, 200) // room by count; about 20 ms of prefill queued
		now := time.Now()
		if lighter {
			// The light flow's request is served while the heavy flow is backlogged.
			light := pushFlow(t, s, pq, now, 0, "light", 100, true)
			for range 3 {
				pushFlow(t, s, pq, now, 0, "heavy", 100, true)
			}
			if it := pq.q.Next(now); it != light || it.Yields() || !pq.q.Dispatched(it) {
				t.Fatal("the light flow's request was not served first, or yields")
			}
		} else {
			for range 3 {
				pushFlow(t, s, pq, now, 0, "heavy", 100, true)
			}
		}
		sleep := s.fc.dispatch(now)
		switch {
		case lighter && pq.q.Len() != 3:
			t.Errorf("the backlogged flow's request was placed on a replica with 20 ms of prefill queued (%d left queued)", pq.q.Len())
		case lighter && !(sleep > 0 && sleep < dispatchPoll):
			t.Errorf("the dispatcher sleeps %v; want to wake at the predicted drain, before the poll (%v)", sleep, dispatchPoll)
		case !lighter && pq.q.Len() != 0:
			t.Errorf("no lighter flow served: %d requests left queued, want all placed", pq.q.Len())
		}
	}
}

// TestReserveHeldHeadSetAside: a backlogged flow's requests at the head of the queue, held
// by the reserve rule (Yields: the replica has room by count, its queued prefill has not
// drained), do not hold the lighter flow's request behind them: the dispatcher sets them
// aside, places it, and puts them back at their places.
func TestReserveHeldHeadSetAside(t *testing.T) {
	s, pq := dispatcherOnly(t, 64, 200) // room by count; about 20 ms of prefill queued
	now := time.Now()
	var heavy []*flowcontrol.Item
	for range 4 {
		heavy = append(heavy, pushFlow(t, s, pq, now, 0, "heavy", 100, true))
	}
	light := pushFlow(t, s, pq, now, 0, "light", 5000, true)
	// heavy's first request, then light's, with nothing of light's queued behind it: light
	// is the flow under its share, and its counter is now 50 times heavy's.
	for _, want := range []*flowcontrol.Item{heavy[0], light} {
		if it := pq.q.Next(now); it != want || !pq.q.Dispatched(it) {
			t.Fatal("not served in the expected order")
		}
	}
	light2 := pushFlow(t, s, pq, now, 0, "light", 100, true)
	s.fc.dispatch(now)
	select {
	case o := <-light2.Done():
		if o != flowcontrol.Dispatched {
			t.Errorf("the light flow's request: outcome %v", o)
		}
	default:
		t.Error("the light flow's request still queued behind the heavy flow's, held by the reserve rule")
	}
	for i, it := range heavy[1:] {
		select {
		case o := <-it.Done():
			t.Errorf("heavy request %d left the queue (%v) with 20 ms of prefill queued", i+1, o)
		default:
		}
	}
	if pq.q.Len() != 3 {
		t.Errorf("%d queued, want the heavy flow's 3 back in the queue", pq.q.Len())
	}
}

// TestCreditedLowerBandNotHeld: a lower band's request that its guaranteed share
// (min_band_share) brought to the head is placed where the pool has room, as the higher
// band's are, though the reserve rule holds the lower band's other requests (20 ms of
// prefill queued): held, the share would wait on the higher band to leave a replica drained.
func TestCreditedLowerBandNotHeld(t *testing.T) {
	s, pq := dispatcherOnly(t, 64, 200) // room by count; about 20 ms of prefill queued
	now := time.Now()
	low := pushFlow(t, s, pq, now, 0, "f0", 100, true)
	low2 := pushFlow(t, s, pq, now, 0, "f0", 100, true)
	var high []*flowcontrol.Item
	for range 4 {
		high = append(high, pushFlow(t, s, pq, now, 5, "f5", 1000, true))
	}
	pq.q.NoteBand(5, now)
	pq.q.NoteBand(0, now)
	// Two of the higher band's requests served earn the lower band 5/95 of 2,000: its
	// 100-token request is at the head on credit.
	for _, want := range high[:2] {
		if it := pq.q.Next(now); it != want || !pq.q.Dispatched(it) {
			t.Fatal("the higher band was not served first")
		}
	}
	s.fc.dispatch(now)
	for i, it := range append([]*flowcontrol.Item{low}, high[2:]...) {
		select {
		case o := <-it.Done():
			if o != flowcontrol.Dispatched {
				t.Errorf("request %d: outcome %v", i, o)
			}
		default:
			t.Errorf("request %d still queued (0: the lower band's, on credit)", i)
		}
	}
	select {
	case o := <-low2.Done():
		t.Errorf("the lower band's second request, without credit, left the queue (%v) with 20 ms of prefill queued", o)
	default:
	}
}

// dispatcherOnly is a Server with flow control on whose dispatcher the test drives itself
// (fc.dispatch), one replica with limit requests at once and one request's prefillTokens of
// prompt queued on it (10k tokens/s: nothing learned), and the pool's queue.
func dispatcherOnly(t *testing.T, limit, prefillTokens int64) (*Server, *poolQueue) {
	t.Helper()
	o := testOptions(t, "least-load", "http://127.0.0.1:20000")
	noHealthChecks(&o)
	o.FlowControl = FlowControl{Enabled: true}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	s.fc.close()
	t.Cleanup(s.wd.close)
	b := s.pool.Snapshot()[0]
	b.SetMaxConcurrency(limit)
	var l backend.Lease
	l.Begin(b, prefillTokens, prefillTokens, false)
	t.Cleanup(l.Release)
	pq, err := s.fc.queueFor(poolAll)
	if err != nil {
		t.Fatal(err)
	}
	return s, pq
}

// TestYieldingFlowTakesLastDrainedReplica: in a pool of two found saturated lately, a
// backlogged flow's request that yields to a lighter flow of its band starts on the one
// drained replica (the reserve rule's drain), while a lower band's request does not: the last
// drained replica is kept for a higher band only.
func TestYieldingFlowTakesLastDrainedReplica(t *testing.T) {
	for _, lowerBand := range []bool{false, true} {
		o := testOptions(t, "least-load", "http://127.0.0.1:20000", "http://127.0.0.1:20001")
		noHealthChecks(&o)
		o.FlowControl = FlowControl{Enabled: true}
		s, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		s.fc.close() // this test drives the dispatcher itself
		t.Cleanup(s.wd.close)
		bs := s.pool.Snapshot()
		for _, b := range bs {
			b.SetMaxConcurrency(8)
		}
		var l backend.Lease
		l.Begin(bs[0], 5000, 5000, false) // about half a second of prefill queued on one replica
		t.Cleanup(l.Release)
		pq, err := s.fc.queueFor(poolAll)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		pq.noteSaturated(now)
		item := func(prio int, flowID string) *flowcontrol.Item {
			return pushFlow(t, s, pq, now, prio, flowID, 100, true)
		}
		var held *flowcontrol.Item
		if lowerBand {
			pq.q.NoteBand(5, now)
			pq.q.NoteBand(0, now)
			held = item(0, "batch")
		} else {
			light := item(0, "light")
			held = item(0, "heavy") // yields: another of its flow is queued behind it
			item(0, "heavy")
			if it := pq.q.Next(now); it != light || !pq.q.Dispatched(it) {
				t.Fatal("the light flow's request was not served first")
			}
		}
		s.fc.dispatch(now)
		select {
		case o := <-held.Done():
			if lowerBand {
				t.Errorf("a lower band's request took the last drained replica (%v)", o)
			}
		default:
			if !lowerBand {
				t.Errorf("a yielding flow's request was held for a second drained replica (%d queued)", pq.q.Len())
			}
		}
	}
}

// pushFlow queues, in pq of s, a routed request of priority prio and flow flowID with tokens
// of uncached prompt, arrived now, expiring in a minute; saturated as Queue.Push takes it.
func pushFlow(t *testing.T, s *Server, pq *poolQueue, now time.Time, prio int, flowID string, tokens int, saturated bool) *flowcontrol.Item {
	t.Helper()
	it := &flowcontrol.Item{Priority: prio, Flow: flowID, Cost: flowcontrol.Cost{UncachedPrefillTokens: tokens}, Arrival: now,
		Deadline: now.Add(time.Minute), Value: &flow{s: s, k: key.Key{Routed: true, OK: true, PromptTokens: tokens}}}
	if err := pq.q.Push(it, saturated); err != nil {
		t.Fatal(err)
	}
	return it
}

// finishAllOK lets a's replica answer one request for each of chs and checks each answered
// 200.
func finishAllOK(t *testing.T, a *engine, chs ...<-chan fcResult) {
	t.Helper()
	for range chs {
		a.finish()
	}
	for _, ch := range chs {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d", r.id, r.status)
		}
	}
}
