package proxy

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
)

// What routing costs and what it saves, written at scrape time with their HELP lines (the one
// place an operator's Prometheus shows what the estimates are):
//
//	prefixlb_routing_seconds_total{stage="key|pick"}        time spent keying and picking (≈ CPU-seconds)
//	prefixlb_prefill_saved_seconds_total{backend}            reported cached tokens' prefill at the backend's learned rate
//	prefixlb_shadow_prefill_saved_seconds_total{choice}      shadow mode: the same for each choice, from the index
//
// The cached tokens themselves are prefixlb_backend_cached_tokens_total and
// prefixlb_shadow_prefix_tokens_total.
const (
	routingSecondsName = "prefixlb_routing_seconds_total"
	routingSecondsHelp = "Seconds this prefixlb spent routing requests, on their goroutines: stage key reads the request's model and prompt and hashes its chunks; " +
		"stage pick finds the model pool's candidates and makes the policy's choice (a retry's pick included; the first also counts rewriting the forwarding headers). " +
		"Timed between two monotonic clock reads around work that is CPU-bound and does not wait, so it approximates CPU-seconds " +
		"(a goroutine descheduled in between adds its wait). Set against prefixlb_prefill_saved_seconds_total: routing cost X, saved Y."

	savedSecondsName = "prefixlb_prefill_saved_seconds_total"
	savedSecondsHelp = "Estimated seconds of prefill the backend skipped: the prompt tokens it reported found in its KV cache (prefixlb_backend_cached_tokens_total) " +
		"as prefill work weighted by attention, as the cost model counts it, at the prefill rate prefixlb learned for the backend from streamed requests' TTFT " +
		"(its own, else its model pool's). Nothing while no rate is learned, nor from a backend that does not report cached tokens " +
		"(vLLM --enable-prompt-tokens-details, SGLang --enable-cache-report). An estimate, in seconds of the replica (all its GPUs): " +
		"a hit can happen under any policy (a shared system prompt), so what prefix routing itself saved is this less what another mode saves on the same traffic; " +
		"shadow mode estimates that difference (prefixlb_shadow_prefill_saved_seconds_total)."

	shadowSavedName = "prefixlb_shadow_prefill_saved_seconds_total"
	shadowSavedHelp = "Shadow mode: estimated seconds of prefill spared by the prompt tokens the prefix index says each choice's backend held (prefixlb_shadow_prefix_tokens_total), " +
		"at that backend's learned prefill rate: choice=shadow is the prefix policy not yet switched on, choice=actual the mode in force. " +
		"Shadow less actual is what switching would have saved, one request at a time from the caches as they are " +
		"(a lower bound on multi-turn traffic, where prefix routing would also have kept each conversation's cache warm)."
)

// routingTime is prefixlb_routing_seconds_total, in nanoseconds per stage.
type routingTime struct {
	key, pick atomic.Int64
}

// keyed counts the keying of a request that started at start (the flow's start, its body
// read) and returns now: the first pick's time runs from there.
func (r *routingTime) keyed(start time.Time) time.Time {
	now := time.Now()
	r.key.Add(int64(now.Sub(start)))
	return now
}

// picked counts a pick that started at from (flow.pickStart) and returns now, its end.
func (r *routingTime) picked(from time.Time) time.Time {
	now := time.Now()
	r.pick.Add(int64(now.Sub(from)))
	return now
}

// pickStart is when the pick about to be made started: for the first, the end of the keying
// (the model pool's candidates are part of it), with no clock read; for a later one (a retry,
// a pick again after a contended hold), now.
func (f *flow) pickStart() time.Time {
	if t := f.keyed; !t.IsZero() {
		f.keyed = time.Time{}
		return t
	}
	return time.Now()
}

// savedPrefill is one backend's prefixlb_prefill_saved_seconds_total, in nanoseconds.
type savedPrefill struct{ nanos atomic.Int64 }

// add counts cached reported-cached prompt tokens of one request served by b, at b's learned
// prefill rate; nothing while b has none.
func (p *savedPrefill) add(b *backend.Backend, cached int) {
	if cached <= 0 {
		return
	}
	if rate, ok := b.LearnedPrefillRate(); ok {
		p.nanos.Add(int64(router.SavedPrefillSeconds(int64(cached), rate) * float64(time.Second)))
	}
}

// writeSavings writes the routing time, the saved prefill per current backend (a removed
// backend's series goes with it) and, in shadow mode, the shadow's estimate, each family
// with its HELP and TYPE.
func (s *Server) writeSavings(w io.Writer) {
	var buf []byte
	buf = appendFamily(buf, routingSecondsName, routingSecondsHelp)
	buf = appendSample(buf, routingSecondsName, `{stage="key"}`, nanosToSeconds(s.m.routing.key.Load()))
	buf = appendSample(buf, routingSecondsName, `{stage="pick"}`, nanosToSeconds(s.m.routing.pick.Load()))

	if ups := s.ups.Load(); ups != nil && len(*ups) > 0 {
		bms := make([]*backendMetrics, 0, len(*ups))
		for _, u := range *ups {
			bms = append(bms, u.m)
		}
		slices.SortFunc(bms, func(a, b *backendMetrics) int { return strings.Compare(a.label, b.label) })
		buf = appendFamily(buf, savedSecondsName, savedSecondsHelp)
		for _, bm := range bms {
			buf = appendSample(buf, savedSecondsName, "{"+bm.label+"}", nanosToSeconds(bm.saved.nanos.Load()))
		}
	}

	if st, ok := s.decider.ShadowStats(); ok {
		buf = appendFamily(buf, shadowSavedName, shadowSavedHelp)
		buf = appendSample(buf, shadowSavedName, `{choice="shadow"}`, st.ShadowSavedPrefillSeconds)
		buf = appendSample(buf, shadowSavedName, `{choice="actual"}`, st.ActualSavedPrefillSeconds)
	}
	_, _ = w.Write(buf)
}

// appendFamily appends a counter family's HELP and TYPE lines (help has no backslash or
// newline to escape).
func appendFamily(buf []byte, name, help string) []byte {
	buf = append(buf, "# HELP "...)
	buf = append(buf, name...)
	buf = append(buf, ' ')
	buf = append(buf, help...)
	buf = append(buf, "\n# TYPE "...)
	buf = append(buf, name...)
	return append(buf, " counter\n"...)
}

func appendSample(buf []byte, name, labels string, v float64) []byte {
	buf = append(buf, name...)
	buf = append(buf, labels...)
	buf = append(buf, ' ')
	buf = strconv.AppendFloat(buf, v, 'g', -1, 64)
	return append(buf, '\n')
}

func nanosToSeconds(n int64) float64 { return float64(n) / float64(time.Second) }
