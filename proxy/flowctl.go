package proxy

// Flow control in the request path (docs/flow-control.md): when every healthy replica of a
// request's model pool is saturated (saturation.go), the request waits in the pool's
// flowcontrol.Queue instead of being forwarded into an engine's waiting queue, and a
// dispatcher places it, by the policy with the state of that moment, when a replica has
// room. A request that some replica could start now goes straight through, as without flow
// control, unless requests of its pool are already waiting (it then takes its turn behind
// them, and the dispatcher is woken at once).

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/router/key"
)

// FlowControl configures flow control (Options.FlowControl; Server.SetFlowControl on a
// reload). Zero fields take the defaults.
type FlowControl struct {
	// Enabled holds requests whose pool is saturated; off, every request is forwarded at once
	// (turned off by a reload, the requests already queued are placed at once too, in the
	// queue's order).
	Enabled bool
	// MaxQueueWait is the longest a request waits queued before it is refused (429,
	// reason expired); default flowcontrol.DefaultMaxQueueWait... 30 s. A client's own
	// shorter deadline (HeaderQueueDeadline) wins.
	MaxQueueWait time.Duration
	// Queue bounds each pool's queue and tunes its ordering (zero fields: flowcontrol's
	// defaults). A reload changes them in the queues in place (flowcontrol.Queue.Reconfigure).
	Queue flowcontrol.Config
	// KVSaturation is the KV-cache usage at or above which a replica is saturated (default
	// DefaultKVSaturation; negative turns the KV rule off).
	KVSaturation float64
	// PrefillSaturation is the queued prefill (at the replica's prefill rate) at or above
	// which a replica is saturated (default DefaultPrefillSaturation; negative turns the rule
	// off).
	PrefillSaturation time.Duration
	// ReservePrefill keeps room for a higher priority band: while the pool served a higher
	// band lately (within Queue.BandMemory), a replica whose queued prefill takes this long
	// or longer at its prefill rate has no room for a lower band's request, which waits in
	// the queue instead (default DefaultReservePrefill; negative turns the rule off).
	ReservePrefill time.Duration
	// DefaultOutputTokens is the output a queued request is predicted to generate when its
	// body sets no max_tokens (max_completion_tokens, max_output_tokens): its charge until
	// its response ends and the real count replaces it. Default DefaultOutputTokens.
	DefaultOutputTokens int
	// Classifier gives a request its priority and flow; nil: priority 0, one flow.
	Classifier Classifier
	// Saturation is the rule that judges a replica saturated: SaturationPrefixLB ("", the
	// default; KVSaturation and the replicas' concurrency limits) or SaturationGIE (llm-d's
	// detector, tuned by GIE, for the bench's llm-d-style arm; it needs metrics scraping on).
	// Any other value is an error in New and read as SaturationPrefixLB on a reload.
	Saturation string
	GIE        GIESaturation
}

// Defaults of FlowControl.
const (
	// DefaultMaxQueueWait: long enough to ride out a burst, short enough that a client still
	// waits for the answer.
	DefaultMaxQueueWait = 30 * time.Second
	// DefaultOutputTokens: a chat reply of a few paragraphs.
	DefaultOutputTokens = 256
)

// HeaderQueueDeadline is the client's own bound on its queue wait, in milliseconds
// ("x-prefixlb-queue-deadline-ms: 2000"). It is read from every client, trusted headers or
// not: it can only shorten the request's own wait below MaxQueueWait, never lengthen it or
// move the request ahead of another.
const HeaderQueueDeadline = "x-prefixlb-queue-deadline-ms"

// RequestHeaders reads a request header by name (case-insensitive); "" when absent.
type RequestHeaders interface {
	Get(name string) string
}

// Classifier maps a request to its priority (higher first; below 0: sheddable, refused at
// once while its pool is saturated) and its flow (the fairness key within a priority: a
// tenant, an API key's hash; never a raw key, it shows in /debug/queue), and the headers it
// found and did not use, for prefixlb_flow_ignored_headers_total (flowcontrol.Ignored: a
// priority or flow header with trusted headers off, a value too long or not valid). Called
// for a request that is queued and, while its pool's queue is active, for one that went
// straight through, when it ends (to charge its flow); with the request's URL path, its
// body's model and its headers.
type Classifier interface {
	Classify(path string, model []byte, h RequestHeaders) (priority int, flow string, ignored flowcontrol.Ignored)
}

// anonymousFlow is the flow of every request when no Classifier is set.
const anonymousFlow = "anonymous"

func (c FlowControl) withDefaults() FlowControl {
	if c.MaxQueueWait <= 0 {
		c.MaxQueueWait = DefaultMaxQueueWait
	}
	if c.KVSaturation == 0 {
		c.KVSaturation = DefaultKVSaturation
	}
	if c.PrefillSaturation == 0 {
		c.PrefillSaturation = DefaultPrefillSaturation
	}
	if c.ReservePrefill == 0 {
		c.ReservePrefill = DefaultReservePrefill
	}
	if c.DefaultOutputTokens <= 0 {
		c.DefaultOutputTokens = DefaultOutputTokens
	}
	c.GIE = c.GIE.withDefaults()
	return c
}

// validate reports a FlowControl that New cannot run; scrape is the health checker's scrape
// interval (0: scraping off).
func (c FlowControl) validate(scrape time.Duration) error {
	switch c.Saturation {
	case "", SaturationPrefixLB:
	case SaturationGIE:
		if scrape <= 0 {
			return errors.New("flow control: saturation rule gie reads the replicas' scraped metrics, and scraping is off (every replica would stay saturated)")
		}
	default:
		return fmt.Errorf("flow control: saturation rule %q is not %q or %q", c.Saturation, SaturationPrefixLB, SaturationGIE)
	}
	return nil
}

// Names of the pools' queues: a model's name, or one of these.
const (
	poolAll      = ""        // every backend: requests without a model, or no backend's models known
	poolAnyModel = "\x00any" // the backends whose models are unknown (a model nobody lists)
)

// poolQueue is one model pool's queue.
type poolQueue struct {
	name string
	q    *flowcontrol.Queue
	// saturatedAt is when, in unix nanoseconds, the pool was last found saturated (0: never):
	// the reserve rule keeps a drained replica for the higher band only within the queue's
	// band memory of it (keeps).
	saturatedAt atomic.Int64
}

// reserveOf is what the reserve rule holds the requests of pq to at now (reserveFor).
type reserveOf struct {
	top           int  // the pool's highest band served lately
	banded, keeps bool // a lower band was served lately too; keeps: pq.keeps(now)
}

// reserveOf reads the pool's bands and saturation memory at now.
func (pq *poolQueue) reserveOf(now time.Time) reserveOf {
	top, banded := pq.q.TopBand(now)
	return reserveOf{top: top, banded: banded, keeps: pq.keeps(now)}
}

// reserveFor is how the reserve rule holds it: below, it leaves room for a higher band's next
// request or for a flow of its band under its fair share (flowcontrol.Item.Yields); keep, the
// pool's last drained replica is kept from it (keptFree), for a higher band only: kept for a
// lighter flow of the same band it halved a 2-replica pool's work for the flooding one, and
// the light flow's TTFT rose with the backlog (fair10x:0.4, 4 rounds: 5.0x its value alone
// became 34x). A lower band's request popped on its guaranteed share (Item.Credited) is
// placed as the top band's are, not held for it: the rule would otherwise keep the share from
// it while the higher band keeps the pool saturated.
func (r reserveOf) reserveFor(it *flowcontrol.Item) (below, keep bool) {
	lower := r.banded && it.Priority < r.top && !it.Credited()
	return lower || it.Yields(), lower && r.keeps
}

// noteSaturated records that the pool was found saturated at now.
func (pq *poolQueue) noteSaturated(now time.Time) { pq.saturatedAt.Store(now.UnixNano()) }

// keeps reports whether the reserve rule keeps the pool's last drained replica for the
// higher band (keptFree) at now: the pool was found saturated within the queue's band
// memory. Below saturation a lower band's request only waits for a drain, so light load
// keeps its latency; under overload, where the engines are always inside someone's prompt,
// a replica kept drained is what lets the higher band start at once.
func (pq *poolQueue) keeps(now time.Time) bool {
	at, m := pq.saturatedAt.Load(), pq.q.BandMemory()
	return at != 0 && m >= 0 && now.UnixNano()-at <= int64(m)
}

// flowControl is a Server's flow control: the pools' queues and their dispatcher.
type flowControl struct {
	s   *Server
	cfg atomic.Pointer[FlowControl]
	// held counts the requests waiting in any queue (pushed, outcome not yet taken by their
	// handler): while 0, a request whose pool is not saturated goes on without a lookup.
	held atomic.Int64
	// noted is the unix nanoseconds of the last band noted in any pool's queue (note); 0:
	// never, and a request whose pool is not saturated is not classified for the reserve rule.
	noted atomic.Int64

	mu     sync.Mutex
	queues map[string]*poolQueue
	list   atomic.Pointer[[]*poolQueue] // queues, for the dispatcher
	closed bool                         // drained at shutdown: no new queue

	kick     chan struct{} // wakes the dispatcher (backend.NotifyRoom, pushes)
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once

	roomy []*backend.Backend  // the dispatcher's scratch
	aside []*flowcontrol.Item // the dispatcher's scratch: requests set aside by place
	m     *flowMetrics
}

// dispatchPoll bounds how long queued requests wait for a signal of room that did not
// come: a replica that turned healthy, a reload that added one, a scrape whose change
// another path missed. Signals (a request ending, a peer's count falling, a scrape) are the
// normal path; this only bounds the cost of a missed one.
const dispatchPoll = 50 * time.Millisecond

func newFlowControl(s *Server, cfg FlowControl) *flowControl {
	fc := &flowControl{
		s:      s,
		queues: map[string]*poolQueue{},
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		m:      newFlowMetrics(s.m.set),
	}
	c := cfg.withDefaults()
	fc.cfg.Store(&c)
	fc.list.Store(&[]*poolQueue{})
	go fc.run()
	return fc
}

// config is the current configuration (defaults filled in).
func (fc *flowControl) config() *FlowControl { return fc.cfg.Load() }

// enabled reports whether new requests may be held.
func (fc *flowControl) enabled() bool { return fc.cfg.Load().Enabled }

// note records a request of priority classified for pq's pool at now (the reserve rule's
// memory of the pool's highest band, flowcontrol.Queue.NoteBand).
func (fc *flowControl) note(pq *poolQueue, priority int, now time.Time) {
	pq.q.NoteBand(priority, now)
	fc.noted.Store(now.UnixNano())
}

// wake signals the dispatcher without blocking.
func (fc *flowControl) wake() {
	select {
	case fc.kick <- struct{}{}:
	default:
	}
}

// SetFlowControl applies a reload's flow-control settings: queued requests stay queued, the
// queues take the new bounds (flowcontrol.Queue.SetLimits), and new requests see the rest.
// Turned off, new requests go straight through and the queued ones are placed at once.
func (s *Server) SetFlowControl(c FlowControl) {
	c = c.withDefaults()
	s.fc.cfg.Store(&c)
	for _, pq := range *s.fc.list.Load() {
		if err := pq.q.Reconfigure(c.Queue); err != nil { // validated by the config; never out of range
			pq.q.SetLimits(c.Queue.MaxItems, c.Queue.MaxBytes)
		}
	}
	s.setMu.Lock()
	s.notifyRoomLocked(s.pool.Snapshot())
	s.setMu.Unlock()
	s.fc.wake()
}

// notifyRoomLocked points the backends' room signal at the dispatcher while flow control is
// on or requests are queued, and off otherwise (a Lease's end then signals nothing). The
// caller holds setMu.
func (s *Server) notifyRoomLocked(bs []*backend.Backend) {
	on := s.fc.enabled() || s.fc.held.Load() > 0
	for _, b := range bs {
		if on {
			b.NotifyRoom(s.fc.kick)
		} else {
			b.NotifyRoom(nil)
		}
	}
}

// poolName names the queue of k's pool (see poolFor).
func (s *Server) poolName(k *key.Key) string {
	p := s.pools.Load()
	if len(k.Model) == 0 || p == nil || !p.filtering {
		return poolAll
	}
	if _, ok := p.byModel[string(k.Model)]; ok {
		return string(k.Model)
	}
	return poolAnyModel
}

// poolMembers returns the backends of the pool named name (healthy or not).
func (s *Server) poolMembers(name string) []*backend.Backend {
	p := s.pools.Load()
	switch {
	case name == poolAll || p == nil || !p.filtering:
		return s.pool.Snapshot()
	case name == poolAnyModel:
		return p.anyModel
	}
	return p.byModel[name] // nil once no backend serves it: its requests wait to expire
}

// queueNamed is the queue of the pool named name, nil when it has none; lock-free (the
// dispatcher's list, which holds every queue: queues are never removed), for the request
// path.
func (fc *flowControl) queueNamed(name string) *poolQueue {
	for _, pq := range *fc.list.Load() {
		if pq.name == name {
			return pq
		}
	}
	return nil
}

// queueFor returns the queue of the pool named name, creating it; nil after shutdown.
func (fc *flowControl) queueFor(name string) (*poolQueue, error) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.closed {
		return nil, flowcontrol.ErrClosed
	}
	if pq := fc.queues[name]; pq != nil {
		return pq, nil
	}
	cfg := fc.config()
	q, err := flowcontrol.New(cfg.Queue)
	if err != nil {
		return nil, err
	}
	pq := &poolQueue{name: name, q: q}
	fc.queues[name] = pq
	l := append(append([]*poolQueue(nil), *fc.list.Load()...), pq)
	fc.list.Store(&l)
	return pq, nil
}

// flowRefusal is a request flow control answered itself: 429 (the pool is overloaded:
// expired, queue_full, queue_bytes_full, sheddable, displaced, shed) or 503 (shutdown, or
// no healthy replica at its deadline), with Retry-After.
type flowRefusal struct {
	status     int
	reason     string
	retryAfter int // seconds
}

func (e *flowRefusal) Error() string {
	switch e.reason {
	case "expired":
		if e.status == fasthttp.StatusServiceUnavailable {
			return "flow control: no healthy replica of the model's pool took the request within its queue wait (reason expired)"
		}
		return "flow control: every replica of the model's pool stayed saturated for the request's whole queue wait (reason expired)"
	case "shutdown":
		return "flow control: prefixlb is shutting down; the queued request was not sent (reason shutdown)"
	case "sheddable":
		return "flow control: every replica of the model's pool is saturated and the request's priority is sheddable (reason sheddable)"
	case "shed":
		return "flow control: the model's pool became saturated and the queued request's priority is sheddable (reason shed)"
	case "displaced":
		return "flow control: the queue was full and a request of a lighter flow or a higher priority took this one's place (reason displaced)"
	case "queue_bytes_full":
		return "flow control: every replica of the model's pool is saturated and the queue's body bytes are at their bound (reason queue_bytes_full)"
	}
	return "flow control: every replica of the model's pool is saturated and its queue is full (reason queue_full)"
}

// retryAfterSeconds is the Retry-After of an overload refusal: a tenth of the queue wait,
// 1 to 10 s (3 s at the default wait): the queue turns over in about that time, and clients
// told to come back at once would only meet the same queue.
func retryAfterSeconds(wait time.Duration) int {
	return min(max(int(wait/(10*time.Second)), 1), 10)
}

// hold runs before the first pick of a routed request with flow control on. It returns
// nil when the request goes on: at once when some replica of its pool can start it and no
// request of the pool waits, or once the dispatcher placed it (f.placed: the decision made
// and its lease begun). Otherwise it returns the refusal (flowRefusal) or, for a client that
// left while queued, its goneErr: no backend saw the request.
func (s *Server) hold(ctx *fasthttp.RequestCtx, f *flow) error {
	fc := s.fc
	cfg := fc.config()
	if !cfg.Enabled || !f.k.Routed || len(f.cands) == 0 {
		return nil
	}
	saturated := s.poolSaturated(cfg, f.cands)
	reserved := false
	if !saturated && cfg.ReservePrefill > 0 && cfg.Saturation != SaturationGIE && fc.noted.Load() != 0 {
		reserved = s.reserved(ctx, f, cfg)
	}
	if !saturated && !reserved && fc.held.Load() == 0 {
		f.direct, f.reqHeader = true, &ctx.Request.Header
		return nil
	}
	return s.holdSlow(ctx, f, cfg, saturated, reserved)
}

// reserved reports whether f's pool, not saturated, has no room for f by the reserve rule:
// its pool served a higher priority band lately (flowcontrol.Queue.TopBand) and every
// healthy replica's queued prefill takes ReservePrefill or longer, so that the higher band's
// next request would wait behind f's prefill inside an engine. It classifies f only while
// some band was noted within its memory (fc.noted), and notes f's band.
func (s *Server) reserved(ctx *fasthttp.RequestCtx, f *flow, cfg *FlowControl) bool {
	now := time.Now()
	pq := s.fc.queueNamed(s.poolName(&f.k))
	if pq == nil {
		return false
	}
	top, ok := pq.q.TopBand(now)
	if !ok {
		return false
	}
	prio := s.priority(f, ctx, cfg)
	s.fc.note(pq, prio, now)
	if prio >= top {
		return false
	}
	r := ruleOf(cfg)
	r.now, r.reserve, r.keep = now, cfg.ReservePrefill, pq.keeps(now)
	return poolSaturated(f.cands, r)
}

// holdSlow queues the request and waits for its outcome (hold). saturated: every replica of
// its pool is (a sheddable request is then refused); reserved: the reserve rule holds it
// though its pool is not saturated (it waits in the queue, sheddable or not).
func (s *Server) holdSlow(ctx *fasthttp.RequestCtx, f *flow, cfg *FlowControl, saturated, reserved bool) error {
	fc := s.fc
	name := s.poolName(&f.k)
	// Nothing it would wait behind: other pools wait, not this one, or only lower bands (the
	// reserve rule holds them for this band's sake), which it goes before anyway. Queued, it
	// would meet the rule for a flow of its band (Item.Yields) that a request sent on at once
	// does not, and a batch request held at light load made the chat band's flooding flow
	// queue behind it (overload light, one round of four: 159 requests held, its p95 1.29x
	// forwarding at once).
	if pq := fc.queueNamed(name); !saturated && !reserved && (pq == nil || pq.q.Len() == 0 || !pq.q.QueuedAtOrAbove(s.priority(f, ctx, cfg))) {
		f.direct, f.reqHeader = true, &ctx.Request.Header
		return nil
	}
	pq, err := fc.queueFor(name)
	if err != nil {
		return s.refuse(f, err, cfg)
	}
	if saturated {
		pq.noteSaturated(time.Now())
	}
	it := s.queueItem(ctx, f, cfg)
	fc.held.Add(1)
	if err := pq.q.Push(it, saturated); err != nil {
		fc.held.Add(-1)
		return s.refuse(f, err, cfg)
	}
	f.qit, f.qq = it, pq
	fc.note(pq, it.Priority, time.Now())
	fc.m.queued.Inc()
	return s.waitQueued(f, pq, it, cfg, it.Arrival)
}

// waitQueued wakes the dispatcher for it, f's item queued in pq (counted in fc.held by the
// caller) since queued (its arrival, or its Return), waits for its outcome and uncounts it:
// nil once dispatched (f.placed), else the refusal or, for a client that left, its goneErr.
// The wait histogram takes the time since queued, so a returned request's two waits add up
// to its time in the queue; f.queueWait is the whole time since its arrival.
func (s *Server) waitQueued(f *flow, pq *poolQueue, it *flowcontrol.Item, cfg *FlowControl, queued time.Time) error {
	fc := s.fc
	fc.wake()
	if fc.held.Load() == 1 {
		// The first held request: make sure the replicas' room signals reach the dispatcher
		// (they are off while flow control is off and nothing waits).
		s.setMu.Lock()
		s.notifyRoomLocked(s.pool.Snapshot())
		s.setMu.Unlock()
	}
	o := s.await(f, pq, it)
	fc.held.Add(-1)
	f.queueWait = time.Since(it.Arrival)
	fc.m.outcome(o, time.Since(queued))
	switch o {
	case flowcontrol.Dispatched:
		return nil
	case flowcontrol.Cancelled:
		f.refused = true // not a request that found no backend
		if f.gone.Load() {
			return f.goneErr()
		}
		return &failure{errClientGone, errClientGone}
	}
	f.qit, f.qq = nil, nil // no replica took it: nothing to settle
	return s.refuse(f, outcomeRefusal(o), cfg)
}

// await waits for it's outcome; a client that leaves meanwhile (the watchdog's abort wakes
// f) is removed from the queue without touching a backend, unless the dispatcher already
// took it, whose outcome then comes.
func (s *Server) await(f *flow, pq *poolQueue, it *flowcontrol.Item) flowcontrol.Outcome {
	select {
	case o := <-it.Done():
		return o
	case <-f.wake:
	}
	// The client left. The dispatcher may hold the item for the instant of a placement: it
	// is then dispatched (and the attempt finds the client gone before dialling) or put
	// back, and removed at the next try.
	for {
		if pq.q.Remove(it) {
			return <-it.Done() // Cancelled
		}
		select {
		case o := <-it.Done():
			return o
		case <-time.After(time.Millisecond):
		}
	}
}

// outcomeRefusal maps a queued request's outcome other than dispatched and cancelled to
// the Push error of the same meaning, for refuse.
func outcomeRefusal(o flowcontrol.Outcome) error {
	switch o {
	case flowcontrol.Shutdown:
		return flowcontrol.ErrClosed
	case flowcontrol.Shed:
		return errShedQueued
	case flowcontrol.Displaced:
		return errDisplaced
	}
	return errExpired
}

var (
	errShedQueued = errors.New("shed")
	errDisplaced  = errors.New("displaced")
	errExpired    = errors.New("expired")
)

// refuse turns a Push error or an outcome into the flowRefusal the client gets, counted.
func (s *Server) refuse(f *flow, err error, cfg *FlowControl) error {
	r := &flowRefusal{status: fasthttp.StatusTooManyRequests, retryAfter: retryAfterSeconds(cfg.MaxQueueWait)}
	switch err {
	case flowcontrol.ErrClosed:
		r.status, r.reason, r.retryAfter = fasthttp.StatusServiceUnavailable, "shutdown", 1
	case errShedQueued, errDisplaced, errExpired:
		r.reason = err.Error()
	default:
		r.reason = flowcontrol.Reason(err)
		if r.reason == "" {
			r.reason = "queue_full" // ErrInUse and config errors: never expected
		}
	}
	if r.reason == "expired" && len(s.candidatesFor(f.cands[:0], &f.k)) == 0 {
		r.status = fasthttp.StatusServiceUnavailable // nothing healthy: not an overload
	}
	s.fc.m.refused(r.reason)
	f.refused = true
	return r
}

// queueItem builds the request's queue item: priority and flow from the classifier, the
// predicted work (prefill the policy would not find cached now, the output its max_tokens
// allows), its body's bytes and its deadline.
func (s *Server) queueItem(ctx *fasthttp.RequestCtx, f *flow, cfg *FlowControl) *flowcontrol.Item {
	prio, fl := s.classify(f, &ctx.Request.Header, cfg)
	prefill := int64(f.k.PromptTokens)
	if d := s.decider.Preview(&f.k, f.cands); d.PrefillTokens > 0 {
		prefill = d.PrefillTokens
	}
	now := time.Now()
	wait := cfg.MaxQueueWait
	if ms, err := strconv.ParseInt(string(peekFold(&ctx.Request.Header, HeaderQueueDeadline)), 10, 64); err == nil && ms >= 0 {
		wait = min(wait, time.Duration(ms)*time.Millisecond)
	}
	return &flowcontrol.Item{
		Priority: prio,
		Flow:     fl,
		Cost:     flowcontrol.Cost{UncachedPrefillTokens: int(prefill), OutputTokens: predictedOutput(f, cfg)},
		Bytes:    int64(len(ctx.Request.Body())),
		Arrival:  f.start,
		Deadline: now.Add(wait),
		Value:    f,
	}
}

// fastHeaders reads a fasthttp request's headers for a Classifier, names matched without
// regard to case (the server keeps names as sent: DisableHeaderNamesNormalizing).
type fastHeaders struct{ h *fasthttp.RequestHeader }

func (h fastHeaders) Get(name string) string { return string(peekFold(h.h, name)) }

// peekFold is the value of the first header named name in any case, nil when absent.
func peekFold(h *fasthttp.RequestHeader, name string) []byte {
	for k, v := range h.All() {
		if len(k) == len(name) && strings.EqualFold(string(k), name) {
			return v
		}
	}
	return nil
}

// settleQueued charges a request that left the queue for a replica what it really cost,
// when its response ends (flow.finish, before its lease's release wakes the dispatcher, so
// that the next placement sees the charge; putFlow for a flow never finished): the prompt tokens the replica did not have cached and
// the tokens it generated, as its usage reported them, else as predicted; nothing when no
// response came.
func (s *Server) settleQueued(f *flow) {
	it, pq := f.qit, f.qq
	f.qit, f.qq = nil, nil
	if it == nil {
		return
	}
	cost := servedCost(f, it.Cost)
	if pq.q.Settle(it, cost) && cost != (flowcontrol.Cost{}) { // Work counts a zero cost as 1
		s.fc.m.served(it.Priority, pq.q.Config().Work(cost))
	}
}
