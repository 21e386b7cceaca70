package router

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// ShadowPrefix is the one shadow policy there is: the prefix policy (config shadow: prefix).
const ShadowPrefix = "prefix"

// shadowModes are the modes a shadow may run beside: those that do not route by prefix.
var shadowModes = []string{"round-robin", "least-load"}

// CheckShadow reports whether shadow (a config's shadow field; "" is off) can run beside
// mode; the error says what can.
func CheckShadow(shadow, mode string) error {
	if shadow == "" {
		return nil
	}
	if shadow != ShadowPrefix {
		return fmt.Errorf("%q is not a shadow policy (the one there is: %q)", shadow, ShadowPrefix)
	}
	for _, m := range shadowModes {
		if m == mode {
			return nil
		}
	}
	return fmt.Errorf("%q runs only beside mode round-robin or least-load, not mode %q (which would route as its own shadow, or by prefix already)", shadow, mode)
}

// Shadow routes as its Actual policy does and, on every first pick of a request whose key
// parsed, also asks the prefix policy what it would have chosen, so that an operator can read
// what prefix routing would save before switching to it. It never changes the backend: the
// Decision is Actual's, with MatchedChunks, PrefillTokens and PredictedTTFT filled in for the
// backend Actual chose (what the prefix index and cost model say of it; Actual's round-robin
// or least-load counters are never touched).
//
// There is one prefix index, and it learns where requests actually went (Learn is called
// with the actual backend): it knows what each replica's KV cache holds under the routing in
// force. Per request the shadow reads, from that one index and one cost-model estimate:
//
//   - whether the prefix policy's choice is the actual backend (agree);
//   - the prompt tokens each choice's backend holds (matched chunks × chunk size, at most the
//     prompt), for the shadow choice and the actual one;
//   - each choice's estimated TTFT (the prefix policy's cost model, see estimate);
//   - the prefill seconds each choice's held tokens would spare at that backend's learned
//     prefill rate (SavedPrefillSeconds; nothing while the backend has none).
//
// What it measures is one step of prefix routing from the current state: "had this request
// gone where prefix routing would send it, this much of its prompt would have been cached".
// It does not simulate the fleet that prefix routing would have built (whose caches would
// hold more, as every turn of a conversation would have gone to one replica), so on
// multi-turn traffic the saving it shows is a lower bound. The cost: one prefix Pick (index
// match of the prompt's chunks over the candidates, estimate) per routed request on the
// request path, allocation-free (BenchmarkShadowPick).
type Shadow struct {
	actual Policy
	prefix *Prefix
	stats  shadowCounters
}

// shadowCounters are ShadowStats as atomics.
type shadowCounters struct {
	agree, disagree                  atomic.Uint64
	shadowTokens, actualTokens       atomic.Uint64
	shadowTTFTNanos, actualTTFTNanos atomic.Uint64

	shadowSavedNanos, actualSavedNanos atomic.Uint64 // saved prefill, ns
}

// ShadowStats are the totals a Shadow reports, over the requests it evaluated.
type ShadowStats struct {
	// Agree and Disagree count the requests whose prefix choice was, or was not, the backend
	// the mode chose.
	Agree, Disagree uint64
	// ShadowPrefixTokens and ActualPrefixTokens sum the prompt tokens the prefix index says
	// the shadow choice's backend and the actual backend held, at routing time.
	ShadowPrefixTokens, ActualPrefixTokens uint64
	// ShadowPredictedTTFTSeconds and ActualPredictedTTFTSeconds sum the cost model's TTFT
	// estimates for each choice, seconds.
	ShadowPredictedTTFTSeconds, ActualPredictedTTFTSeconds float64
	// ShadowSavedPrefillSeconds and ActualSavedPrefillSeconds sum the prefill seconds those
	// held tokens spare each choice's backend at its learned prefill rate
	// (SavedPrefillSeconds; a backend that has learned none adds nothing).
	ShadowSavedPrefillSeconds, ActualSavedPrefillSeconds float64
}

// NewShadow returns actual (the policy of mode) with the shadow policy named shadow beside
// it, built from o; the error is CheckShadow's.
func NewShadow(shadow, mode string, actual Policy, o PolicyOptions) (*Shadow, error) {
	if shadow == "" {
		return nil, fmt.Errorf("no shadow policy named")
	}
	if err := CheckShadow(shadow, mode); err != nil {
		return nil, err
	}
	return &Shadow{actual: actual, prefix: NewPrefix(o.Prefix, nil)}, nil
}

// Actual is the policy that routes: a mode that neither learns nor inspects (CheckShadow), whose
// Fleet and Repicker abilities the Shadow forwards.
func (s *Shadow) Actual() Policy { return s.actual }

// Pick returns Actual's pick and records what the prefix policy would have chosen.
func (s *Shadow) Pick(k *key.Key, candidates []*backend.Backend) Decision {
	d := s.actual.Pick(k, candidates)
	if d.Backend == nil {
		return d
	}
	s.evaluate(k, candidates, &d, true)
	// Where requests go is what the recent share counts, at the work they send there (after
	// the match evaluate found on the actual backend).
	s.prefix.noteRouted(d.Backend, s.prefix.RoutedWork(k, d.MatchedChunks))
	return d
}

// Preview is Pick without recording: Actual's Preview, filled in from the prefix policy's
// view of its backend, with no shadow decision counted and nothing noted for the estimates.
func (s *Shadow) Preview(k *key.Key, candidates []*backend.Backend) Decision {
	d := s.actual.Preview(k, candidates)
	if d.Backend != nil {
		s.evaluate(k, candidates, &d, false)
	}
	return d
}

// evaluate weighs Actual's decision d as the prefix policy would have: it fills d's match and
// estimates from the prefix policy's view of d.Backend and, when commit is set, counts
// agreement, the cached tokens and estimated TTFT of both choices and the work routed. A
// prompt it cannot place (short, not parsed, a backend not among the candidates) is left as
// is. Up to maxStackCandidates candidates it allocates nothing; beyond, it allocates the
// snapshot, as Prefix.Pick does.
func (s *Shadow) evaluate(k *key.Key, candidates []*backend.Backend, d *Decision, commit bool) {
	if short(k) || !k.Routed || !k.OK {
		return
	}
	a := slices.Index(candidates, d.Backend)
	if a < 0 {
		return
	}
	p := s.prefix
	var mbuf [maxStackCandidates]int
	var cbuf [maxStackCandidates]cand
	cs := p.snapshot(k, candidates, mbuf[:0], cbuf[:0])
	estimate(cs, p.costInput(k))
	prompt := int64(k.PromptTokens)
	if commit {
		j, _ := pickCost(k.Chunks, cs, p.selection(k), p.ring.Load())
		if a == j {
			s.stats.agree.Add(1)
		} else {
			s.stats.disagree.Add(1)
		}
		held := func(c *cand) int64 { return min(int64(key.PrefixTokens(c.matched, int(p.chunkTokens))), prompt) }
		shadowHeld, actualHeld := held(&cs[j]), held(&cs[a])
		s.stats.shadowTokens.Add(uint64(shadowHeld))
		s.stats.actualTokens.Add(uint64(actualHeld))
		s.stats.shadowSavedNanos.Add(uint64(estSeconds(SavedPrefillSeconds(shadowHeld, cs[j].learnedRate()))))
		s.stats.actualSavedNanos.Add(uint64(estSeconds(SavedPrefillSeconds(actualHeld, cs[a].learnedRate()))))
		s.stats.shadowTTFTNanos.Add(uint64(estSeconds(cs[j].est)))
		s.stats.actualTTFTNanos.Add(uint64(estSeconds(cs[a].est)))
		// The work actually routed is the actual backend's: it feeds the mean the estimates use.
		p.meanWork.Observe(float64(cs[a].work))
	}
	d.MatchedChunks, d.PrefillTokens, d.PrefillWork, d.PredictedTTFT = cs[a].matched, max(prompt-int64(cs[a].held), 1), cs[a].work, estSeconds(cs[a].est)
}

// Repick is Actual's retry (its Repick, or a Pick again); retries are not evaluated.
func (s *Shadow) Repick(k *key.Key, failed Decision, candidates []*backend.Backend, seq uint64) Decision {
	if r, ok := s.actual.(Repicker); ok {
		return r.Repick(k, failed, candidates, seq)
	}
	return s.actual.Pick(k, candidates)
}

// SetBackends hands the backends to the shadow's prefix policy (and to Actual, if it keeps
// state per backend).
func (s *Shadow) SetBackends(all []*backend.Backend) {
	s.prefix.SetBackends(all)
	if f, ok := s.actual.(Fleet); ok {
		f.SetBackends(all)
	}
}

// ModelsChanged hands a change of b's models to the shadow's prefix policy (and to Actual, if
// it keeps state per model pool).
func (s *Shadow) ModelsChanged(b *backend.Backend) {
	s.prefix.ModelsChanged(b)
	if f, ok := s.actual.(Fleet); ok {
		f.ModelsChanged(b)
	}
}

// Learn records in the shadow's index where the request actually went.
func (s *Shadow) Learn(k *key.Key, b *backend.Backend, held int) Learned {
	return s.prefix.Learn(k, b, held)
}

// Unlearn withdraws a Learn (the backend refused the request).
func (s *Shadow) Unlearn(k *key.Key, b *backend.Backend, l Learned) { s.prefix.Unlearn(k, b, l) }

// Correct corrects the shadow's index from what b reported of k's request (Prefix.Correct):
// the index that learns where requests actually went also forgets what a backend shows it
// lost.
func (s *Shadow) Correct(k *key.Key, b *backend.Backend, l Learned, r CacheReport) int {
	return s.prefix.Correct(k, b, l, r)
}

// Index is the shadow's prefix index.
func (s *Shadow) Index() *index.Index { return s.prefix.Index() }

// Explain is what the shadow's prefix policy weighs per candidate (/debug/route).
func (s *Shadow) Explain(k *key.Key, candidates []*backend.Backend) []CandidateEstimate {
	return s.prefix.Explain(k, candidates)
}

// ShadowStats returns the totals so far.
func (s *Shadow) ShadowStats() (ShadowStats, bool) {
	const nanos = 1e9
	return ShadowStats{
		Agree: s.stats.agree.Load(), Disagree: s.stats.disagree.Load(),
		ShadowPrefixTokens: s.stats.shadowTokens.Load(), ActualPrefixTokens: s.stats.actualTokens.Load(),
		ShadowPredictedTTFTSeconds: float64(s.stats.shadowTTFTNanos.Load()) / nanos,
		ActualPredictedTTFTSeconds: float64(s.stats.actualTTFTNanos.Load()) / nanos,
		ShadowSavedPrefillSeconds:  float64(s.stats.shadowSavedNanos.Load()) / nanos,
		ActualSavedPrefillSeconds:  float64(s.stats.actualSavedNanos.Load()) / nanos,
	}, true
}

// ShadowStats is the prefix policy's: it runs no shadow (it is one).
func (p *Prefix) ShadowStats() (ShadowStats, bool) { return ShadowStats{}, false }

var (
	_ Policy    = (*Shadow)(nil)
	_ Fleet     = (*Shadow)(nil)
	_ Learner   = (*Shadow)(nil)
	_ Repicker  = (*Shadow)(nil)
	_ Inspector = (*Shadow)(nil)
)
