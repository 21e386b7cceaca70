package router

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// Learned identifies one Learn (or Hold) for Unlearn, Release, Abandon and Correct; zero
// means that nothing was learned.
type Learned int64

// TicketState is where a request stands in its learning lifecycle (Ticket).
type TicketState uint8

const (
	// TicketOpen: issued; nothing learned stands.
	TicketOpen TicketState = iota
	// TicketHeld: learned by Hold before anything was sent, held to settle with peered
	// replicas (Settler).
	TicketHeld
	// TicketSent: the request was written to its backend and learned there (Learn, or a hold
	// Released to be sent).
	TicketSent
	// TicketRefused: what was learned is withdrawn: the backend refused the request or never
	// answered (Unlearn), the client left during the hold (Abandon), or peers' decisions made
	// first sent it to be decided again (Release). A retry is sent (and learned) again.
	TicketRefused
	// TicketReported: the response completed and what the backend reported of its cache was
	// handed to the policy (Correct); what was learned stands.
	TicketReported
	// TicketDone: the request is over; what stands, stands, and nothing moves the ticket.
	TicketDone
)

var ticketStateNames = [...]string{"open", "held", "sent", "refused", "reported", "done"}

func (s TicketState) String() string {
	if int(s) < len(ticketStateNames) {
		return ticketStateNames[s]
	}
	return "ticket-state(?)"
}

// Ticket is one request's learning lifecycle with its policy, as backend.Lease is its load on
// a backend: the Decider issues it once per request (Decider.Ticket), the proxy moves it as
// the request goes, and it owns the stamp of what the policy learned (Learned), so that each
// policy call is made once and with the right stamp:
//
//	open ──Hold──▶ held ──Release──▶ sent ──Report──▶ reported
//	  │              ├──Release (again), Refuse──▶ refused
//	  └────Send──────────────────────▶ sent ──Refuse──▶ refused ──Send, Hold (decided again)──▶ …
//	any ──Done──▶ done
//
// A transition called in a state it does not leave does nothing, so each is safe to call
// twice (a Send after the hold was released, a Refuse on every exit of a failed attempt).
// The ticket of a request the policy does not learn (not a Learner, or a key that did not
// parse) moves through the same states without calling the policy. A Ticket is moved by
// one goroutine at a time (its request's); its zero value is a ticket that learns nothing.
type Ticket struct {
	learner Learner // nil: the request is not learned
	settler Settler // nil: it is never held
	tracker Tracker // nil: nobody follows it to its end
	k       *key.Key
	b       *backend.Backend // where it was held or sent
	dec     Decision         // the held decision (Release)
	held    int              // the chunks b held when it was routed there (CacheReport.MatchedChunks)
	stamp   Learned          // what stands (0: nothing)
	state   TicketState
	// prefilled: Prefilled was called for what stands (Tracker).
	prefilled bool
}

// State is where the ticket stands.
func (t *Ticket) State() TicketState { return t.state }

// Learns reports whether the policy learns the request.
func (t *Ticket) Learns() bool { return t.learner != nil }

// Stands reports whether what the policy learned of the request stands (held, sent or
// reported, with a stamp: a Learn that learned nothing leaves none).
func (t *Ticket) Stands() bool {
	return t.stamp != 0 && (t.state == TicketHeld || t.state == TicketSent || t.state == TicketReported)
}

// redecidable reports whether the request may be held or sent (again): nothing of it stands.
func (t *Ticket) redecidable() bool { return t.state == TicketOpen || t.state == TicketRefused }

// SettleWait is how long to hold the request decided d before sending it (Settler.SettleWait):
// 0, send it at once, for a policy that does not settle, a request not learned, or one that
// is held or sent already.
func (t *Ticket) SettleWait(d Decision) time.Duration {
	if t.settler == nil || !t.redecidable() {
		return 0
	}
	return t.settler.SettleWait(t.k, d)
}

// Hold learns the request as decided d before it is sent, for the hold SettleWait asked for
// (Settler.Hold): held. False when nothing was held (the policy learned nothing: the request
// is sent at once and learned once written), or the ticket is not open or refused.
func (t *Ticket) Hold(d Decision) bool {
	if t.settler == nil || !t.redecidable() {
		return false
	}
	l := t.settler.Hold(t.k, d)
	if l == 0 {
		return false
	}
	t.b, t.dec, t.held, t.stamp, t.state, t.prefilled = d.Backend, d, d.MatchedChunks, l, TicketHeld, false
	return true
}

// Release ends the hold that began at decided (Settler.Release). again: peers' decisions
// on the backend made first arrived meanwhile; the policy withdrew the hold (refused) and the
// request is to be decided again. Otherwise it is sent, learned as held. A ticket not held
// is not released (false).
func (t *Ticket) Release(decided time.Time) (again bool) {
	if t.state != TicketHeld {
		return false
	}
	if t.settler.Release(t.k, t.dec, t.stamp, decided) {
		t.stamp, t.state = 0, TicketRefused
		return true
	}
	t.state = TicketSent
	return false
}

// Send records that the request was written to b, which held its first held chunks when it
// was routed there (Decision.MatchedChunks), and learns it there (Learner.Learn): sent. A
// request held and released was learned already: nothing happens, as for one sent already.
func (t *Ticket) Send(b *backend.Backend, held int) {
	if !t.redecidable() {
		return
	}
	t.b, t.held, t.stamp, t.state, t.prefilled = b, held, 0, TicketSent, false
	if t.learner != nil {
		t.stamp = t.learner.Learn(t.k, b, held)
	}
}

// Refuse withdraws what the policy learned of the request: the backend refused it (status ≥
// 400) or never answered (Learner.Unlearn), or its client left during the hold, before
// anything was sent (Settler.Abandon: the peers never got its chunks). refused; a ticket
// neither held nor sent stays as it is.
func (t *Ticket) Refuse() {
	switch t.state {
	case TicketHeld:
		t.settler.Abandon(t.k, t.b, t.stamp)
	case TicketSent:
		if t.stamp != 0 {
			t.learner.Unlearn(t.k, t.b, t.stamp)
		}
	default:
		return
	}
	t.stamp, t.state = 0, TicketRefused
}

// Report hands what the backend reported of the request's prompt, once its response completed
// (usage.prompt_tokens and the cached tokens among them, in its own tokens), to the policy
// (Learner.Correct, with the chunks the backend was found to hold when routed): reported. It
// returns the index entries dropped. A ticket whose learning does not stand reports nothing.
func (t *Ticket) Report(prompt, cached int) int {
	if t.state != TicketSent || t.stamp == 0 {
		return 0
	}
	t.state = TicketReported
	return t.learner.Correct(t.k, t.b, t.stamp, CacheReport{MatchedChunks: t.held, ReportedPrompt: prompt, ReportedCached: cached})
}

// FirstToken tells a Tracker that the backend's first token of the request arrived
// (Tracker.Prefilled), once for what stands; nothing for a request whose learning does not
// stand, or a policy that does not track.
func (t *Ticket) FirstToken() {
	if t.tracker == nil || t.prefilled || t.stamp == 0 || (t.state != TicketSent && t.state != TicketReported) {
		return
	}
	t.prefilled = true
	t.tracker.Prefilled(t.k, t.b, t.stamp)
}

// Done ends the ticket: what stands, stands, a Tracker is told the request ended
// (Tracker.Finished), and nothing moves it after. The ticket is done before Finished is
// called, so that a Finished that panics is not called again by the Done of the proxy's
// panic recovery.
func (t *Ticket) Done() {
	was := t.state
	t.state = TicketDone
	if t.tracker != nil && t.stamp != 0 && (was == TicketSent || was == TicketReported) {
		t.tracker.Finished(t.k, t.b, t.stamp)
	}
}
