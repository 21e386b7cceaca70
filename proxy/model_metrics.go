package proxy

// Per-model metrics: prefixlb_model_requests_total{model,status} and
// prefixlb_model_ttft_seconds{model}, one label per model served (bounded by maxModelLabels),
// the others under modelLabelOther. The model pools (pools.go) say which models are served
// (setModels); the request metrics (serverMetrics, metrics.go) count each request that
// reached a backend under its model (observeModel).

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// modelLabelOther is the model label of requests for models no backend lists (and of those
// without a model), so that the label set stays bounded by the models served.
const modelLabelOther = "other"

// maxModelLabels bounds the model label's values: at most this many served models have
// series of their own (prefixlb_model_requests_total, prefixlb_model_ttft_seconds), the rest
// count as modelLabelOther. A deployment serves a few base models and adapters; 64 keeps the
// per-model series (a histogram's ~20 and a counter per status) in the low thousands even
// when a backend lists backend.MaxModels ids.
const maxModelLabels = 64

// modelMetrics are one model label's series: prefixlb_model_requests_total{model,status} and
// prefixlb_model_ttft_seconds{model}.
type modelMetrics struct {
	label string // model="…"
	ttft  *metrics.PrometheusHistogram
	mu    sync.RWMutex
	reqs  map[int]*metrics.Counter // by status
	dead  bool                     // unregistered: no new series (guarded by mu)
}

// modelSeries holds the model labels' series: at most maxModelLabels models served now have a
// label of their own (those labelled before keep theirs while served, then the first served in
// order fill the free labels); a model that stops being served has its series unregistered,
// so the registry holds at most maxModelLabels+1 models' series.
type modelSeries struct {
	mu     sync.Mutex
	all    map[string]*modelMetrics // the labelled models: ≤ maxModelLabels
	other  *modelMetrics
	served atomic.Pointer[map[string]*modelMetrics] // model name → series, for the labelled models
}

// setModels gives up to maxModelLabels of served (sorted) a label of their own; any other
// name counts as modelLabelOther. Models no longer served lose their series.
func (sm *serverMetrics) setModels(served []string) {
	ms := &sm.models
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.all == nil {
		ms.all = map[string]*modelMetrics{}
		ms.other = sm.newModelMetrics(modelLabelOther)
	}
	for id, m := range ms.all {
		if _, ok := slices.BinarySearch(served, id); !ok {
			sm.dropModelMetrics(m)
			delete(ms.all, id)
		}
	}
	for _, id := range served {
		if len(ms.all) >= maxModelLabels {
			break
		}
		if ms.all[id] == nil {
			ms.all[id] = sm.newModelMetrics(id)
		}
	}
	cur := make(map[string]*modelMetrics, len(ms.all))
	for id, m := range ms.all {
		cur[id] = m
	}
	ms.served.Store(&cur)
}

func (sm *serverMetrics) newModelMetrics(name string) *modelMetrics {
	l := `model=` + labelValue(name)
	return &modelMetrics{label: l, reqs: map[int]*metrics.Counter{},
		ttft: sm.set.GetOrCreatePrometheusHistogramExt(`prefixlb_model_ttft_seconds{`+l+`}`, latencyBuckets)}
}

// dropModelMetrics unregisters m's series; a flow still holding m updates detached ones.
func (sm *serverMetrics) dropModelMetrics(m *modelMetrics) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dead = true
	sm.set.UnregisterMetric(`prefixlb_model_ttft_seconds{` + m.label + `}`)
	for status := range m.reqs {
		sm.set.UnregisterMetric(modelRequestsName(m.label, status))
	}
}

func modelRequestsName(label string, status int) string {
	return fmt.Sprintf(`prefixlb_model_requests_total{%s,status="%d"}`, label, status)
}

// observeModel counts a request that reached a backend under its model's label (with its TTFT
// when a byte came back). It allocates only the first time a (model, status) pair is seen.
func (sm *serverMetrics) observeModel(f *flow, status int) {
	ms := &sm.models
	cur := ms.served.Load()
	if cur == nil {
		return
	}
	m := (*cur)[string(f.k.Model)]
	if m == nil {
		m = ms.other
	}
	m.mu.RLock()
	c := m.reqs[status]
	m.mu.RUnlock()
	if c == nil {
		m.mu.Lock()
		if c = m.reqs[status]; c == nil {
			if m.dead { // dropped meanwhile: register nothing for it
				m.mu.Unlock()
				return
			}
			c = sm.set.GetOrCreateCounter(modelRequestsName(m.label, status))
			m.reqs[status] = c
		}
		m.mu.Unlock()
	}
	c.Inc()
	if f.bytes > 0 {
		m.ttft.Update(f.firstByte.Seconds())
	}
}
