package proxy

// Flow control outside the queue's wait: the classification every caller shares, the charge
// of a request that went straight through (its flow's virtual counter counts all the work
// it was served), and a dispatched request whose replica a peer took first
// (docs/flow-control.md).

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/router/key"
)

// priority is f's band (classify).
func (s *Server) priority(f *flow, ctx *fasthttp.RequestCtx, cfg *FlowControl) int {
	p, _ := s.classify(f, &ctx.Request.Header, cfg)
	return p
}

// classify is f's priority and flow by cfg's classifier (priority 0, the anonymous flow
// without one), counting the headers it ignored.
func (s *Server) classify(f *flow, h *fasthttp.RequestHeader, cfg *FlowControl) (int, string) {
	if f.classOK {
		return f.class.priority, f.class.flow
	}
	prio, fl := 0, anonymousFlow
	if cfg.Classifier != nil {
		var ignored flowcontrol.Ignored
		prio, fl, ignored = cfg.Classifier.Classify(string(f.path), f.k.Model, fastHeaders{h})
		s.fc.m.ignoredHeaders(ignored)
	}
	f.class, f.classOK = classed{priority: prio, flow: fl}, true
	return prio, fl
}

// classed is a request's class: its priority and flow.
type classed struct {
	priority int
	flow     string
}

// predictedOutput is the tokens f's request may generate: its max_completion_tokens,
// max_tokens or max_output_tokens, else cfg.DefaultOutputTokens.
func predictedOutput(f *flow, cfg *FlowControl) int {
	out, ok := key.TopLevelInt(f.k.Body, "max_completion_tokens", "max_tokens", "max_output_tokens")
	if !ok {
		out = int64(cfg.DefaultOutputTokens)
	}
	return int(min(max(out, 0), 1<<30))
}

// servedCost is the work f's replica did: the prompt tokens it did not have cached and the
// tokens it generated, as its usage reported them, else as predicted; zero when no replica
// answered (no response was relayed: prefixlb answered the request itself).
func servedCost(f *flow, predicted flowcontrol.Cost) flowcontrol.Cost {
	cost := predicted
	switch {
	case !f.relayed:
		return flowcontrol.Cost{}
	case f.usagePrompt > 0:
		cost.UncachedPrefillTokens = max(f.usagePrompt-f.usageCached, 0)
		if f.usageOutputSeen {
			cost.OutputTokens = f.usageOutput
		}
	}
	return cost
}

// chargeDirect charges a request that went straight through (f.direct: its pool had room)
// what it really cost to its flow in its pool's queue, when its response ends and before
// its lease's release wakes the dispatcher (flow.finish). Only while that queue is active
// (flowcontrol.Queue.Active: something of it queued, in flight or remembered) is the
// request classified and the queue locked; otherwise the charge would be forgotten at once
// and nothing is done: an atomic load, no lock, no allocation. Its predicted cost, when no
// usage came: the uncached prompt tokens its decision predicted (else its prompt) and the
// output predictDirect read, else the default (the body is no longer held here).
func (s *Server) chargeDirect(f *flow) {
	if !f.direct {
		return
	}
	h := f.reqHeader
	f.direct, f.reqHeader = false, nil
	pq := s.fc.queueNamed(s.poolName(&f.k))
	if pq == nil || !pq.q.Active() {
		return
	}
	cfg := s.fc.config()
	prefill := f.dec.PrefillTokens
	if prefill <= 0 {
		prefill = int64(f.k.PromptTokens)
	}
	out := f.directOut
	if out <= 0 {
		out = cfg.DefaultOutputTokens
	}
	cost := servedCost(f, flowcontrol.Cost{UncachedPrefillTokens: int(min(prefill, 1<<30)), OutputTokens: out})
	if cost == (flowcontrol.Cost{}) {
		return
	}
	prio, fl := s.classify(f, h, cfg)
	s.fc.note(pq, prio, time.Now())
	pq.q.Charge(prio, fl, cost)
}

// predictDirect notes the output a straight-through request may generate (predictedOutput:
// its max_tokens) for chargeDirect, while its body is still held (the handler relays the
// response head), and only while its pool's queue is active: the body is scanned only when a
// charge is likely to count. Without it a charge with no output usage takes the default.
func (s *Server) predictDirect(f *flow) {
	if !f.direct {
		return
	}
	if pq := s.fc.queueNamed(s.poolName(&f.k)); pq != nil && pq.q.Active() {
		f.directOut = predictedOutput(f, s.fc.config())
	}
}

// redispatch takes over a request the dispatcher placed whose settle hold found a peer's
// decision on its replica, made first (errContended; nothing was sent, its lease released):
// the peer's request may have taken the slot that was free. It is decided again only among
// the replicas of its pool that have room now, with the peer's request counted, as the
// dispatcher decides; when none has, it goes back to the head of its queue
// (flowcontrol.Queue.Return: its place and its charge as before it was dispatched) and waits
// for the next freed slot, instead of being forced onto a saturated replica. nil: f is
// placed again (f.placed, its lease begun); otherwise the refusal or, for a client that
// left, its goneErr, as hold returns them.
func (s *Server) redispatch(f *flow) error {
	fc := s.fc
	cfg := fc.config()
	pq, it := f.qq, f.qit
	f.cands = s.candidatesFor(f.cands, &f.k)
	below, keep := pq.reserveOf(time.Now()).reserveFor(it)
	roomy := s.appendRoomy(cfg, make([]*backend.Backend, 0, len(f.cands)), f.cands, below, keep)
	if len(roomy) > 0 {
		from := f.pickStart()
		f.dec = s.decider.Pick(&f.k, roomy)
		f.tr.picked(&f.dec, f.k.PromptTokens, s.m.routing.picked(from))
		if f.dec.Backend != nil {
			s.beginLease(f, f.dec.Backend)
			f.placed, f.leased = true, true
			return nil
		}
	}
	fc.held.Add(1)
	returned := time.Now()
	if !pq.q.Return(it) {
		fc.held.Add(-1) // settled or drained meanwhile: never expected; decided as before
		return nil
	}
	fc.m.returned.Inc()
	if err := s.waitQueued(f, pq, it, cfg, returned); err != nil {
		return err
	}
	if f.gone.Load() {
		// The client left while the dispatcher placed the request again: no backend sees it.
		f.placed, f.leased, f.refused = false, false, true
		f.lease.Release()
		return f.goneErr()
	}
	return nil
}
