package router

import (
	"reflect"
	"slices"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// A policy is one type with Pick and Preview (Policy). Beside them it may have abilities,
// grouped by the lifecycle that calls them, each group an interface a policy implements
// whole or not at all (a method it has nothing to do for is a one-line no-op):
//
//   - Fleet: the configured backends and their models, as they change (the proxy's backend
//     list, the health checker's models hook);
//   - Learner: one request's learning, from where it was sent to what the backend reported
//     of its cache (driven by the request's Ticket), and Settler, a Learner that also holds
//     first attempts to settle with peered replicas;
//   - Tracker: one request from its first token to its end (driven by its Ticket too);
//   - Inspector: what operators read of the policy (/metrics, /debug/backends, /debug/route);
//   - Repicker: the retry of a failed attempt.
//
// A new ability goes in the group of the lifecycle that calls it, or in a new group listed
// in abilities below. The Decider finds the groups once and is the proxy's one way in; a
// policy that wraps another (Shadow, peering.Policy) implements every group of what it wraps
// and forwards each method (TestDeciderForwardsEveryAbility, TestShadowExposesWhatItWraps,
// TestShadowForwardsToActual and peering's TestPolicyKeepsPrefixAbilities fail when one is
// dropped). A policy asserts each group it implements (var _ router.Learner = (*T)(nil)), so
// that a method added to a group fails to compile where it is missing rather than silently
// taking the whole group away.

// Fleet is implemented by policies that keep state per configured backend or model pool
// (the prefix policy's hash ring, index and pooled prefill models).
type Fleet interface {
	// SetBackends gets every configured backend, healthy or not, at start, whenever the
	// list changes and whenever a backend's KV capacity changes; the candidates of later
	// Picks are among them.
	SetBackends(all []*backend.Backend)
	// ModelsChanged says that b's models changed (discovered, or changed since), and its
	// model pool with them.
	ModelsChanged(b *backend.Backend)
}

// Learner is implemented by policies that learn from where a request was actually sent
// (after retries). The Decider's Ticket calls it, once per transition, and only for
// requests whose key parsed (Decider.Ticket):
//
//   - Learn once the request is written to backend b, while b works on it (a Settler's Hold
//     before it is held and sent instead), with held the Decision's MatchedChunks for b; it
//     returns the stamp of what it learned (0: nothing);
//   - Unlearn with that stamp if b then refuses the request (status ≥ 400) or never
//     answers: it withdraws what that Learn added and nobody has learned again since;
//   - Correct with that stamp once b's response completed with usage r: the index corrects
//     itself when b held far less than it listed (Shortfall); it returns the index entries
//     dropped (0: nothing corrected, always for a policy whose index does not correct
//     itself).
type Learner interface {
	Learn(k *key.Key, b *backend.Backend, held int) Learned
	Unlearn(k *key.Key, b *backend.Backend, l Learned)
	Correct(k *key.Key, b *backend.Backend, l Learned, r CacheReport) int
}

// Settler is implemented by Learners whose replicas decide concurrently without seeing each
// other's latest decisions (peered prefixlb replicas, package peering). A first attempt that
// SettleWait asks to wait is learned by Hold instead of Learn before anything is sent, held
// for the wait, and Released: again means that a decision on the same backend made
// elsewhere before it arrived meanwhile; Release has then withdrawn what Hold learned and
// the request is decided again, with that decision in view. Otherwise the decision stands
// as if Learn had made it (Unlearn withdraws it). A request whose client leaves during the
// hold is Abandoned instead of Released: never sent, it is withdrawn where Hold learned it.
type Settler interface {
	Learner
	// SettleWait is how long to hold a request decided d (0: send it at once).
	SettleWait(k *key.Key, d Decision) time.Duration
	// Hold learns k's request as decided d (d.Backend, d.MatchedChunks held there; d.Reason
	// says whether it could go elsewhere at no cache cost).
	Hold(k *key.Key, d Decision) Learned
	Release(k *key.Key, d Decision, l Learned, decided time.Time) (again bool)
	Abandon(k *key.Key, b *backend.Backend, l Learned)
}

// Tracker is implemented by Learners that follow each request they routed until it ends, as
// Dynamo's KV router tracks its active sequences (a request's prefill tokens until its first
// token, its blocks until it ends). The request's Ticket calls Prefilled once its backend's
// first token arrived and Finished once the request ended there (answered, failed or
// cancelled), each once and with the stamp Learn returned; a request unlearned (Unlearn,
// Abandon) has ended as far as the policy is concerned, and neither is called for it after.
type Tracker interface {
	Learner
	Prefilled(k *key.Key, b *backend.Backend, l Learned)
	Finished(k *key.Key, b *backend.Backend, l Learned)
}

// Inspector is implemented by policies that show operators their state.
type Inspector interface {
	// Index is the policy's prefix index, whose size per backend the proxy reports in
	// /metrics and /debug/backends (nil: none).
	Index() *index.Index
	// Explain shows, per candidate, what a Pick weighs: /debug/route returns it beside the
	// decision (nil: nothing to show).
	Explain(k *key.Key, candidates []*backend.Backend) []CandidateEstimate
	// ShadowStats are the totals of the shadow the policy runs, which the proxy writes in
	// /metrics (prefixlb_shadow_*); ok false: it runs none.
	ShadowStats() (st ShadowStats, ok bool)
}

// Repicker is implemented by policies whose retry is not a second Pick. After the attempt
// on failed.Backend failed before any byte reached the client, Repick chooses among the
// candidates left (healthy, not yet tried; never empty); seq is the request's sequence
// number, distinct per request. A policy without Repick is asked to Pick again.
type Repicker interface {
	Repick(k *key.Key, failed Decision, candidates []*backend.Backend, seq uint64) Decision
}

// abilities are the ability groups, in the order of a request's life.
var abilities = [...]reflect.Type{
	reflect.TypeFor[Fleet](),
	reflect.TypeFor[Learner](),
	reflect.TypeFor[Settler](),
	reflect.TypeFor[Tracker](),
	reflect.TypeFor[Repicker](),
	reflect.TypeFor[Inspector](),
}

// Abilities returns the ability groups a Policy may implement beside Pick and Preview.
// A policy that wraps another (Decider, Shadow, peering.Policy) must expose every ability of
// what it wraps, or the proxy, which finds abilities by type assertion, silently loses it
// (the http.ResponseWriter/Flusher trap): the wrapper tests check each wrapper against this
// list, and a test checks that the list names every interface the package declares.
func Abilities() []reflect.Type { return slices.Clone(abilities[:]) }
