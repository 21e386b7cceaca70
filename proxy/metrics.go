package proxy

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// Latency buckets, seconds: 5 ms … 10 min. TTFT spans cached prefills of a few ms to minutes of
// queueing; end-to-end spans long generations.
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// predictionBuckets for predicted ÷ measured TTFT: a factor of 8 either way, finer near 1.
var predictionBuckets = []float64{.125, .25, .5, .67, .8, .9, 1, 1.11, 1.25, 1.5, 2, 4, 8}

// ratioBuckets for matched-prefix ratios: 0, 0.1 … 1.
var ratioBuckets = []float64{0, .1, .2, .3, .4, .5, .6, .7, .8, .9, .95, 1}

// serverMetrics are the Prometheus families of one Server (names prefixlb_*, units in names).
// Per-backend series live in backendMetrics, reached through the backend's upstream, so the
// hot path does no label formatting after a series exists.
type serverMetrics struct {
	set  *metrics.Set
	mode string
	// chunkTokens is the keys' chunk size (Options.ChunkTokens; 0: the default), for the
	// matched share in tokens.
	chunkTokens int

	retries        *metrics.Counter
	parseFallbacks *metrics.Counter
	rejected413    *metrics.Counter
	bodyIncomplete *metrics.Counter // request bodies that ended before their framing said (bodybudget.go)
	noBackend      *metrics.Counter
	modelNotFound  *metrics.Counter // 404s for models no backend serves (pools.go)
	models         modelSeries      // the model label's series (pools.go)
	streamErrors   streamErrorCounters
	clientGone     *metrics.Counter
	keyPanics      *metrics.Counter // key builds that panicked, routed by parse-fallback (recover.go)
	handlerPanics  *metrics.Counter // requests whose serving panicked (recover.go)
	matchedRatio   *metrics.PrometheusHistogram
	// backends are the per-backend series by backend name, while an upstream holds them
	// (forBackend, releaseBackend); guarded by backendsMu.
	backendsMu sync.Mutex
	backends   map[string]*backendMetrics
	// ttftPrediction is the policy's predicted TTFT ÷ the TTFT measured, per streamed
	// request with a prediction: the cost model is right when it sits near 1.
	ttftPrediction *metrics.PrometheusHistogram
	routing        routingTime // prefixlb_routing_seconds_total (savings.go)
}

func newServerMetrics(mode string) *serverMetrics {
	s := metrics.NewSet()
	return &serverMetrics{
		set:            s,
		mode:           mode,
		retries:        s.NewCounter(`prefixlb_retries_total`),
		parseFallbacks: s.NewCounter(`prefixlb_parse_fallbacks_total`),
		rejected413:    s.NewCounter(`prefixlb_request_body_too_large_total`),
		bodyIncomplete: s.NewCounter(`prefixlb_request_body_incomplete_total`),
		noBackend:      s.NewCounter(`prefixlb_no_backend_total`),
		modelNotFound:  s.NewCounter(`prefixlb_model_not_found_total`),
		streamErrors:   newStreamErrorCounters(s),
		clientGone:     s.NewCounter(`prefixlb_client_disconnects_total`),
		keyPanics:      s.NewCounter(`prefixlb_key_panics_total`),
		handlerPanics:  s.NewCounter(`prefixlb_handler_panics_total`),
		matchedRatio:   s.NewPrometheusHistogramExt(`prefixlb_matched_prefix_ratio`, ratioBuckets),
		ttftPrediction: s.NewPrometheusHistogramExt(`prefixlb_ttft_predicted_over_measured`, predictionBuckets),
		backends:       map[string]*backendMetrics{},
	}
}

// streamErrorCounters is prefixlb_stream_errors_total{reason}: responses that started (their
// status already went to the client, and prefixlb_requests_total counts that status) but did
// not complete, by what ended them. Indexed by result; nil for results that are not stream
// errors (a client that left is prefixlb_client_disconnects_total).
type streamErrorCounters [nResults]*metrics.Counter

func newStreamErrorCounters(s *metrics.Set) streamErrorCounters {
	var c streamErrorCounters
	for _, r := range []result{resultTruncated, resultIdleTimeout, resultClientWriteTimeout, resultShutdown} {
		c[r] = s.NewCounter(fmt.Sprintf(`prefixlb_stream_errors_total{reason=%q}`, r))
	}
	return c
}

// Get is the total over the reasons.
func (c *streamErrorCounters) Get() uint64 {
	var n uint64
	for _, x := range c {
		if x != nil {
			n += x.Get()
		}
	}
	return n
}

// backendMetrics are one backend's series, shared by the upstreams of that name (a reload
// may replace a backend by another of the same URL) and unregistered when the last of them
// leaves the configuration (releaseBackend): otherwise every URL a reload or DNS discovery
// ever named would keep its series in /metrics for the life of the process.
type backendMetrics struct {
	sm           *serverMetrics
	name         string // the backend's name (URL)
	label        string // backend="…"
	refs         int    // upstreams holding these series (guarded by sm.backendsMu)
	ttft         *metrics.PrometheusHistogram
	e2e          *metrics.PrometheusHistogram
	promptTokens *metrics.Counter
	cachedTokens *metrics.Counter
	// predictedCached is the prompt tokens the policy predicted cached, in the backend's own
	// tokens (its predicted share × the reported prompt_tokens), beside cachedTokens.
	predictedCached *metrics.Counter
	saved           savedPrefill // prefixlb_prefill_saved_seconds_total (savings.go)

	mu   sync.RWMutex
	reqs map[uint32]*metrics.Counter // reason<<16 | status
	dead bool                        // unregistered: no new series (guarded by mu)
}

// backendSeries are the names of a backend's fixed series, after its label l (backend="…").
func backendSeries(l string) [5]string {
	return [...]string{`prefixlb_ttft_seconds{` + l + `}`, `prefixlb_request_duration_seconds{` + l + `}`,
		`prefixlb_backend_prompt_tokens_total{` + l + `}`, `prefixlb_backend_cached_tokens_total{` + l + `}`,
		`prefixlb_backend_predicted_cached_tokens_total{` + l + `}`}
}

// forBackend returns the series of the backend named name, for one more upstream (each call
// is matched by one releaseBackend).
func (sm *serverMetrics) forBackend(name string) *backendMetrics {
	sm.backendsMu.Lock()
	defer sm.backendsMu.Unlock()
	if bm := sm.backends[name]; bm != nil {
		bm.refs++
		return bm
	}
	l := `backend=` + labelValue(name)
	n := backendSeries(l)
	bm := &backendMetrics{
		sm:              sm,
		name:            name,
		label:           l,
		refs:            1,
		ttft:            sm.set.GetOrCreatePrometheusHistogramExt(n[0], latencyBuckets),
		e2e:             sm.set.GetOrCreatePrometheusHistogramExt(n[1], latencyBuckets),
		promptTokens:    sm.set.GetOrCreateCounter(n[2]),
		cachedTokens:    sm.set.GetOrCreateCounter(n[3]),
		predictedCached: sm.set.GetOrCreateCounter(n[4]),
		reqs:            map[uint32]*metrics.Counter{},
	}
	sm.backends[name] = bm
	return bm
}

// releaseBackend drops an upstream's hold on bm (its backend left the configuration); the
// last unregisters every series of bm. Requests still in flight there update detached series.
func (sm *serverMetrics) releaseBackend(bm *backendMetrics) {
	sm.backendsMu.Lock()
	defer sm.backendsMu.Unlock()
	if bm.refs--; bm.refs > 0 {
		return
	}
	if sm.backends[bm.name] == bm {
		delete(sm.backends, bm.name)
	}
	bm.mu.Lock()
	defer bm.mu.Unlock()
	bm.dead = true
	for _, n := range backendSeries(bm.label) {
		sm.set.UnregisterMetric(n)
	}
	for k := range bm.reqs {
		sm.set.UnregisterMetric(bm.requestsName(router.Reason(k>>16), int(k&0xffff)))
	}
}

func (bm *backendMetrics) requestsName(r router.Reason, status int) string {
	return fmt.Sprintf(`prefixlb_requests_total{%s,mode=%s,reason=%s,status="%d"}`, bm.label, labelValue(bm.sm.mode), labelValue(r.String()), status)
}

// request counts one finished request: prefixlb_requests_total{backend,mode,reason,status}.
// A backend whose series are unregistered (releaseBackend) registers none again.
func (bm *backendMetrics) request(r router.Reason, status int) {
	k := uint32(r)<<16 | uint32(status&0xffff)
	bm.mu.RLock()
	c := bm.reqs[k]
	bm.mu.RUnlock()
	if c == nil {
		bm.mu.Lock()
		if c = bm.reqs[k]; c == nil {
			if bm.dead {
				bm.mu.Unlock()
				return
			}
			c = bm.sm.set.GetOrCreateCounter(bm.requestsName(r, status))
			bm.reqs[k] = c
		}
		bm.mu.Unlock()
	}
	c.Inc()
}

// observe records a finished flow with the status the client saw and what became of it.
func (sm *serverMetrics) observe(f *flow, status int, res result) {
	switch {
	case res == resultClientGone:
		sm.clientGone.Inc()
	case sm.streamErrors[res] != nil && (f.bytes > 0 || f.body != nil):
		// The response started and did not complete: the client sees a truncated body.
		sm.streamErrors[res].Inc()
	}
	if f.k.Routed && !f.k.OK {
		sm.parseFallbacks.Inc()
	}
	if f.attempts > 1 {
		sm.retries.Add(f.attempts - 1)
	}
	if f.up == nil {
		if !f.refused { // flow control's refusals are counted as such (prefixlb_flow_refused_total)
			sm.noBackend.Inc()
		}
		return
	}
	bm := f.up.m
	bm.request(f.dec.Reason, status)
	sm.observeModel(f, status)
	if f.bytes > 0 {
		bm.ttft.Update(f.firstByte.Seconds())
		if f.dec.PredictedTTFT > 0 && f.k.Stream && f.attempts == 1 && f.firstByte > 0 {
			sm.ttftPrediction.Update(f.dec.PredictedTTFT.Seconds() / f.firstByte.Seconds())
		}
	}
	bm.e2e.Update(time.Since(f.start).Seconds())
	if len(f.k.Chunks) >= key.HeadChunks && f.k.PromptTokens > 0 {
		// In tokens: past key.FineChunks a chunk is key.CoarseFactor times longer.
		matched := min(key.PrefixTokens(f.dec.MatchedChunks, sm.chunkTokens), f.k.PromptTokens)
		sm.matchedRatio.Update(float64(matched) / float64(f.k.PromptTokens))
	}
	if f.usagePrompt > 0 {
		bm.promptTokens.Add(f.usagePrompt)
		bm.cachedTokens.Add(f.usageCached)
		bm.saved.add(f.up.b, f.usageCached)
		if f.dec.PrefillTokens > 0 && f.k.PromptTokens > 0 {
			share := 1 - float64(f.dec.PrefillTokens)/float64(f.k.PromptTokens)
			bm.predictedCached.Add(int(math.Round(max(share, 0) * float64(f.usagePrompt))))
		}
	}
}

// writeGauges writes the per-backend gauges read at scrape time (no registration to undo when
// backends change).
func (s *Server) writeGauges(w io.Writer) {
	bs := s.pool.Snapshot()
	for _, b := range bs {
		l := `{backend=` + labelValue(b.Name) + `}`
		metrics.WriteGaugeUint64(w, `prefixlb_backend_inflight`+l, uint64(max(b.InFlight(), 0)))
		metrics.WriteGaugeUint64(w, `prefixlb_backend_prefill_tokens`+l, uint64(max(b.PrefillTokens(), 0)))
		metrics.WriteGaugeUint64(w, `prefixlb_backend_peer_inflight`+l, uint64(max(b.PeerInFlight(), 0)))
		metrics.WriteGaugeUint64(w, `prefixlb_backend_peer_prefill_tokens`+l, uint64(max(b.PeerPrefillTokens(), 0)))
		h := uint64(0)
		if b.Healthy() {
			h = 1
		}
		metrics.WriteGaugeUint64(w, `prefixlb_backend_healthy`+l, h)
	}
	if x := s.decider.Index(); x != nil {
		for _, st := range x.Stats(nil) {
			l := `{backend=` + labelValue(st.Name) + `}`
			metrics.WriteGaugeUint64(w, `prefixlb_index_entries`+l, uint64(max(st.Entries, 0)))
			metrics.WriteGaugeUint64(w, `prefixlb_index_capacity_entries`+l, uint64(max(st.Capacity, 0)))
			metrics.WriteCounterUint64(w, `prefixlb_index_evictions_total`+l, st.Evictions)
			metrics.WriteCounterUint64(w, `prefixlb_index_corrections_total`+l, st.Corrections)
			metrics.WriteCounterUint64(w, `prefixlb_index_corrected_tokens_total`+l, st.CorrectedTokens)
		}
		metrics.WriteGaugeUint64(w, `prefixlb_index_chunks`, uint64(x.Chunks()))
	}
	s.writeShadow(w)
	s.writeSavings(w)
	s.writeFlowGauges(w)
}

func intAfter(p, key []byte) (int, bool) {
	i := bytes.Index(p, key)
	if i < 0 {
		return 0, false
	}
	p = bytes.TrimLeft(p[i+len(key):], " ")
	v, j := 0, 0
	for ; j < len(p) && j < 12 && p[j] >= '0' && p[j] <= '9'; j++ {
		v = v*10 + int(p[j]-'0')
	}
	return v, j > 0
}
