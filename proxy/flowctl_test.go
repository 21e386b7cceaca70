package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/flowcontrol"
)

// engine is an httptest backend that models an inference engine's concurrency limit: it
// runs at most limit requests at once and queues the rest (waiting), as vLLM's scheduler
// does at max_num_seqs; a running request finishes when the test releases one (finish).
// Every arrival is recorded with its marker ("req-N" in the prompt) before it queues.
type engine struct {
	t        testing.TB
	srv      *httptest.Server
	slots    chan struct{}
	finishes chan struct{}
	arrivals chan string

	// outTokens is the completion_tokens its responses report (0: 3); set before its first
	// request.
	outTokens int

	mu         sync.Mutex
	running    int
	waiting    int
	maxRunning int
	maxWaiting int
	seen       []string
}

var markerRe = regexp.MustCompile(`req-[a-z0-9-]+`)

func newEngine(t testing.TB, limit int) *engine {
	e := &engine{t: t, slots: make(chan struct{}, limit), finishes: make(chan struct{}, 1024), arrivals: make(chan string, 1024)}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(func() {
		close(e.finishes) // frees every running request
		e.srv.Close()
	})
	return e
}

func (e *engine) URL() string { return e.srv.URL }

func (e *engine) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := markerRe.FindString(string(body))
	e.mu.Lock()
	e.seen = append(e.seen, id)
	e.waiting++
	e.maxWaiting = max(e.maxWaiting, e.waiting-0)
	e.mu.Unlock()
	e.arrivals <- id
	select {
	case e.slots <- struct{}{}:
	case <-r.Context().Done():
		e.mu.Lock()
		e.waiting--
		e.mu.Unlock()
		return
	}
	e.mu.Lock()
	e.waiting--
	e.running++
	e.maxRunning = max(e.maxRunning, e.running)
	e.mu.Unlock()
	select {
	case <-e.finishes:
	case <-r.Context().Done():
	}
	e.mu.Lock()
	e.running--
	e.mu.Unlock()
	<-e.slots
	out := e.outTokens
	if out == 0 {
		out = 3
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"id":%q,"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":%d,"total_tokens":%d}}`, id, out, 20+out)
}

// finish lets one running request of the engine finish.
func (e *engine) finish() { e.finishes <- struct{}{} }

// waitArrival waits for the next request to reach the engine and returns its marker.
func (e *engine) waitArrival(t testing.TB) string {
	t.Helper()
	return recvWithin(t, e.arrivals, testTimeout, "a request reaching the engine "+e.URL())
}

// noArrival checks that no request reached the engine (what already arrived was taken).
func (e *engine) noArrival(t testing.TB) {
	t.Helper()
	select {
	case id := <-e.arrivals:
		t.Errorf("request %s reached engine %s", id, e.URL())
	default:
	}
}

func (e *engine) stats() (seen []string, maxRunning, maxWaiting int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.seen...), e.maxRunning, e.maxWaiting
}

// fcResult is what a client got.
type fcResult struct {
	id         string
	status     int
	backend    string
	retryAfter string
	body       string
	err        error
}

// fcChatBody is a chat request whose prompt carries id.
func fcChatBody(id string) string {
	return `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"question ` + id + ` about something long enough to route"}]}`
}

// sendChat posts a chat request with marker id and headers h, and delivers what came back.
func sendChat(ctx context.Context, base, id string, h map[string]string) <-chan fcResult {
	return sendBody(ctx, base, id, fcChatBody(id), h)
}

// headerClassifier reads the priority from x-test-priority and the flow from x-test-flow: a
// gateway's trusted headers, for the tests.
type headerClassifier struct{}

func (headerClassifier) Classify(_ string, _ []byte, h RequestHeaders) (int, string, flowcontrol.Ignored) {
	p, _ := strconv.Atoi(h.Get("x-test-priority"))
	f := h.Get("x-test-flow")
	if f == "" {
		f = "anonymous"
	}
	return p, f, 0
}

// startFC starts a proxy with flow control on in front of engines, each limited to limit
// concurrent requests (configured: backends[].max_concurrency), and tune applied.
func startFC(t *testing.T, limit int64, tune func(*FlowControl), engines ...*engine) (*Server, string) {
	t.Helper()
	urls := make([]string, len(engines))
	for i, e := range engines {
		urls[i] = e.URL()
	}
	return startProxy(t, "least-load", urls, func(o *Options) {
		o.FlowControl = FlowControl{Enabled: true, Classifier: headerClassifier{}}
		if tune != nil {
			tune(&o.FlowControl)
		}
		for _, b := range o.Backends {
			b.SetMaxConcurrency(limit)
		}
	})
}

// waitHeld waits until n requests wait in s's queues.
func waitHeld(t *testing.T, s *Server, n int64) {
	t.Helper()
	eventually(t, testTimeout, fmt.Sprintf("%d requests queued", n), func() bool { return s.fc.held.Load() == n })
}

func recvResult(t *testing.T, ch <-chan fcResult, what string) fcResult {
	t.Helper()
	r := recvWithin(t, ch, testTimeout, what)
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	return r
}

// TestFlowControlNeverHoldsWhenRoom: with flow control on, requests that some replica can
// start go straight through, none is queued: four requests on two replicas of limit two all
// run at once.
func TestFlowControlNeverHoldsWhenRoom(t *testing.T) {
	a, b := newEngine(t, 2), newEngine(t, 2)
	s, base := startFC(t, 2, nil, a, b)
	ctx := context.Background()
	var res []<-chan fcResult
	for i := range 4 {
		res = append(res, sendChat(ctx, base, fmt.Sprintf("req-%d", i), nil))
	}
	for range 4 {
		select {
		case <-a.arrivals:
		case <-b.arrivals:
		case <-time.After(testTimeout):
			t.Fatal("a request that a replica could start was held")
		}
	}
	if n := s.fc.m.queued.Get(); n != 0 {
		t.Errorf("%d requests queued, want 0", n)
	}
	for range 2 {
		a.finish()
		b.finish()
	}
	for _, ch := range res {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d", r.id, r.status)
		}
	}
}

// TestFlowControlDispatchesToFreedReplica: once both replicas are full, a request waits in
// prefixlb (no engine sees it), and when one replica frees a slot it is placed there (late
// binding), whichever the policy would have chosen at arrival.
func TestFlowControlDispatchesToFreedReplica(t *testing.T) {
	a, b := newEngine(t, 1), newEngine(t, 1)
	s, base := startFC(t, 1, nil, a, b)
	ctx := context.Background()
	first := sendChat(ctx, base, "req-1", nil)
	second := sendChat(ctx, base, "req-2", nil)
	got := map[string]bool{}
	for range 2 {
		select {
		case id := <-a.arrivals:
			got["a:"+id] = true
		case id := <-b.arrivals:
			got["b:"+id] = true
		case <-time.After(testTimeout):
			t.Fatal("the first two requests did not reach the engines")
		}
	}
	queued := sendChat(ctx, base, "req-3", nil)
	waitHeld(t, s, 1)
	a.noArrival(t)
	b.noArrival(t)
	// b frees its slot: the queued request goes to b.
	b.finish()
	if id := b.waitArrival(t); id != "req-3" {
		t.Fatalf("b received %s, want req-3", id)
	}
	b.finish()
	r := recvResult(t, queued, "the queued request's response")
	if r.status != http.StatusOK || r.backend != b.URL() {
		t.Fatalf("queued request: status %d on %q, want 200 on b %s", r.status, r.backend, b.URL())
	}
	a.finish()
	for _, ch := range []<-chan fcResult{first, second} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d", r.id, r.status)
		}
	}
	if n := s.fc.m.outcomes[flowcontrol.Dispatched].Get(); n != 1 {
		t.Errorf("dispatched %d, want 1", n)
	}
	if _, maxRun, maxWait := a.stats(); maxRun > 1 || maxWait > 1 {
		t.Errorf("engine a ran %d, queued %d at most", maxRun, maxWait)
	}
}

// TestFlowControlClientGoneWhileQueued: a client that leaves while its request is queued is
// removed from the queue; no engine ever sees the request.
func TestFlowControlClientGoneWhileQueued(t *testing.T) {
	a := newEngine(t, 1)
	s, base := startFC(t, 1, nil, a)
	first := sendChat(context.Background(), base, "req-1", nil)
	a.waitArrival(t)
	ctx, cancel := context.WithCancel(context.Background())
	gone := sendChat(ctx, base, "req-gone", nil)
	waitHeld(t, s, 1)
	cancel()
	<-gone
	waitHeld(t, s, 0)
	eventually(t, testTimeout, "the cancelled outcome counted", func() bool {
		return s.fc.m.outcomes[flowcontrol.Cancelled].Get() == 1
	})
	a.finish()
	if r := recvResult(t, first, "the first response"); r.status != http.StatusOK {
		t.Fatalf("first: status %d", r.status)
	}
	// A later request takes the freed slot; the cancelled one never reached the engine.
	later := sendChat(context.Background(), base, "req-later", nil)
	if id := a.waitArrival(t); id != "req-later" {
		t.Fatalf("engine received %s, want req-later", id)
	}
	a.finish()
	recvResult(t, later, "the later response")
	if seen, _, _ := a.stats(); strings.Contains(strings.Join(seen, ","), "req-gone") {
		t.Fatalf("the engine saw the request whose client left: %v", seen)
	}
	if n := s.m.noBackend.Get(); n != 0 {
		t.Errorf("prefixlb_no_backend_total %d, want 0 (a client that left is no missing backend)", n)
	}
}

// TestFlowControlShutdownAnswersQueued: at shutdown every queued client gets 503 with
// Retry-After and an OpenAI-shaped error naming the reason, before the in-flight requests
// drain; the in-flight ones complete.
func TestFlowControlShutdownAnswersQueued(t *testing.T) {
	a := newEngine(t, 1)
	s, base := startFC(t, 1, nil, a)
	running := sendChat(context.Background(), base, "req-run", nil)
	a.waitArrival(t)
	var queued []<-chan fcResult
	for i := range 3 {
		queued = append(queued, sendChat(context.Background(), base, fmt.Sprintf("req-q%d", i), nil))
	}
	waitHeld(t, s, 3)
	stopped := make(chan struct{})
	go func() {
		stopProxy(t, s)
		close(stopped)
	}()
	for _, ch := range queued {
		r := recvResult(t, ch, "a queued request's answer at shutdown")
		if r.status != http.StatusServiceUnavailable || r.retryAfter == "" {
			t.Errorf("%s: status %d, Retry-After %q; want 503 with Retry-After", r.id, r.status, r.retryAfter)
		}
		var e struct {
			Error struct{ Message, Type string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(r.body), &e); err != nil || !strings.Contains(e.Error.Message, "reason shutdown") {
			t.Errorf("%s: body %q, want an OpenAI error naming reason shutdown", r.id, r.body)
		}
	}
	a.finish()
	if r := recvResult(t, running, "the in-flight response"); r.status != http.StatusOK {
		t.Errorf("in-flight request: status %d, want 200", r.status)
	}
	recvWithin(t, stopped, testTimeout, "shutdown")
	a.noArrival(t)
}

// TestFlowControlReloadKeepsQueue: a reload (SetFlowControl) under a full queue keeps the
// queued requests and applies the new bound to new ones; the queued ones are served.
func TestFlowControlReloadKeepsQueue(t *testing.T) {
	a := newEngine(t, 1)
	s, base := startFC(t, 1, func(c *FlowControl) { c.Queue.MaxItems = 2 }, a)
	running := sendChat(context.Background(), base, "req-run", nil)
	a.waitArrival(t)
	q1 := sendChat(context.Background(), base, "req-q1", nil)
	waitHeld(t, s, 1)
	q2 := sendChat(context.Background(), base, "req-q2", nil)
	waitHeld(t, s, 2)
	full := recvResult(t, sendChat(context.Background(), base, "req-full", map[string]string{"x-test-flow": "anonymous"}), "the refused request")
	if full.status != http.StatusTooManyRequests || !strings.Contains(full.body, "queue_full") || full.retryAfter == "" {
		t.Fatalf("over the bound: status %d, Retry-After %q, body %s; want 429 queue_full", full.status, full.retryAfter, full.body)
	}
	s.SetFlowControl(FlowControl{Enabled: true, Classifier: headerClassifier{}, Queue: flowcontrol.Config{MaxItems: 3}})
	if n := s.fc.held.Load(); n != 2 {
		t.Fatalf("after the reload %d queued, want 2", n)
	}
	q3 := sendChat(context.Background(), base, "req-q3", nil)
	waitHeld(t, s, 3)
	for range 4 {
		a.finish()
	}
	for _, ch := range []<-chan fcResult{running, q1, q2, q3} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d, want 200", r.id, r.status)
		}
	}
	if seen, maxRun, maxWait := a.stats(); len(seen) != 4 || maxRun > 1 || maxWait > 1 {
		t.Errorf("engine saw %v, ran %d and queued %d at most; want 4 requests, one at a time", seen, maxRun, maxWait)
	}
}

// TestFlowControlPriorityAndShedding: queued requests leave by priority, higher first; a
// sheddable request (priority < 0) is refused at once with 429, Retry-After and its reason
// while the pool is saturated; a request past its own deadline is refused 429 expired.
func TestFlowControlPriorityAndShedding(t *testing.T) {
	a := newEngine(t, 1)
	s, base := startFC(t, 1, nil, a)
	running := sendChat(context.Background(), base, "req-run", nil)
	a.waitArrival(t)
	low := sendChat(context.Background(), base, "req-low", map[string]string{"x-test-priority": "0", "x-test-flow": "batch"})
	waitHeld(t, s, 1)
	high := sendChat(context.Background(), base, "req-high", map[string]string{"x-test-priority": "5", "x-test-flow": "chat"})
	waitHeld(t, s, 2)

	shed := recvResult(t, sendChat(context.Background(), base, "req-shed", map[string]string{"x-test-priority": "-1"}), "the sheddable request")
	if shed.status != http.StatusTooManyRequests || shed.retryAfter == "" || !strings.Contains(shed.body, "sheddable") || !strings.Contains(shed.body, `"code":"prefixlb_429"`) {
		t.Errorf("sheddable: status %d, Retry-After %q, body %s; want 429 naming sheddable", shed.status, shed.retryAfter, shed.body)
	}
	expired := recvResult(t, sendChat(context.Background(), base, "req-late", map[string]string{HeaderQueueDeadline: "30"}), "the request with a short deadline")
	if expired.status != http.StatusTooManyRequests || !strings.Contains(expired.body, "expired") {
		t.Errorf("short deadline: status %d, body %s; want 429 expired", expired.status, expired.body)
	}

	a.finish()
	if id := a.waitArrival(t); id != "req-high" {
		t.Fatalf("first dispatched %s, want req-high", id)
	}
	a.finish()
	if id := a.waitArrival(t); id != "req-low" {
		t.Fatalf("second dispatched %s, want req-low", id)
	}
	a.finish()
	for _, ch := range []<-chan fcResult{running, high, low} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d", r.id, r.status)
		}
	}
	if n := s.fc.m.refusal["sheddable"].Get(); n != 1 {
		t.Errorf("sheddable refusals %d, want 1", n)
	}
	if n := s.fc.m.refusal["expired"].Get(); n != 1 {
		t.Errorf("expired refusals %d, want 1", n)
	}
}

// TestFlowControlOffForwardsAtOnce: with flow control off, a saturated replica still gets
// every request at once (the engine queues them), as before flow control existed.
func TestFlowControlOffForwardsAtOnce(t *testing.T) {
	a := newEngine(t, 1)
	s, base := startFC(t, 1, func(c *FlowControl) { c.Enabled = false }, a)
	var res []<-chan fcResult
	for i := range 3 {
		res = append(res, sendChat(context.Background(), base, fmt.Sprintf("req-%d", i), nil))
	}
	for range 3 {
		a.waitArrival(t)
	}
	for range 3 {
		a.finish()
	}
	for _, ch := range res {
		recvResult(t, ch, "a response")
	}
	if n := s.fc.m.queued.Get(); n != 0 {
		t.Errorf("%d queued with flow control off", n)
	}
}

// TestFlowControlReloadOffReleasesQueue: a reload that turns flow control off forwards the
// requests it held at once, as flow control off forwards every request: the engine queues
// them. Kept waiting for room, they stood behind every new request, which now goes straight
// through and fills each freed slot, until they expired with a 429.
func TestFlowControlReloadOffReleasesQueue(t *testing.T) {
	a := newEngine(t, 1)
	s, base := startFC(t, 1, nil, a)
	running := sendChat(context.Background(), base, "req-run", nil)
	a.waitArrival(t)
	held := sendChat(context.Background(), base, "req-held", nil)
	waitHeld(t, s, 1)
	s.SetFlowControl(FlowControl{Enabled: false, Classifier: headerClassifier{}})
	if id := a.waitArrival(t); id != "req-held" {
		t.Fatalf("engine received %s, want req-held released by the reload", id)
	}
	waitHeld(t, s, 0)
	a.finish()
	a.finish()
	for _, ch := range []<-chan fcResult{running, held} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d, want 200", r.id, r.status)
		}
	}
}

// TestFlowControlNoChargeWhenNoReplicaAnswered: a queued request that no replica answered
// (its one replica refuses the connection: 502 from prefixlb) is settled at no work; its
// flow was charged the request's predicted work as if a replica had served it, because the
// proxy's own error status, set before the flow's end, read as the replica's answer.
func TestFlowControlNoChargeWhenNoReplicaAnswered(t *testing.T) {
	a := newEngine(t, 1)
	s, base := startFC(t, 1, nil, a)
	running := sendChat(context.Background(), base, "req-run", nil)
	a.waitArrival(t)
	victim := sendChat(context.Background(), base, "req-victim", map[string]string{"x-test-flow": "victim"})
	waitHeld(t, s, 1)
	// The replica goes away: no new connection, and the running request's is closed after
	// its response, so the queued request's dial is refused.
	a.srv.Config.SetKeepAlivesEnabled(false)
	_ = a.srv.Listener.Close()
	a.finish()
	if r := recvResult(t, running, "the running response"); r.status != http.StatusOK {
		t.Fatalf("running: status %d, want 200", r.status)
	}
	if r := recvResult(t, victim, "the victim's answer"); r.status != http.StatusBadGateway {
		t.Fatalf("victim: status %d, want 502 (no replica answered)", r.status)
	}
	eventually(t, testTimeout, "the dispatched request settled", func() bool { return s.fc.m.outcomes[flowcontrol.Dispatched].Get() == 1 })
	if seen, _, _ := a.stats(); len(seen) != 1 {
		t.Fatalf("engine saw %v, want only req-run", seen)
	}
	s.fc.m.mu.Lock()
	served := s.fc.m.work[0]
	s.fc.m.mu.Unlock()
	if served != nil && served.Get() != 0 {
		t.Errorf("served work %d for a request no replica answered, want 0", served.Get())
	}
}
