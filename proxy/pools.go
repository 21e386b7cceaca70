package proxy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// Model pools. Each backend serves a set of models (backend.ModelSet: read from its
// /v1/models by the health checker, or fixed by backends[].models); a request naming a model
// goes only to the backends that serve it, and those backends are the candidates the policy
// sees, so that each model's pool has its own load cap and its own order on the hash ring
// (the prefix policy walks the ring over its candidates only). A backend whose models are
// unknown serves any model. The pools are rebuilt, copy on write, whenever the backend list
// or a backend's models change; the request path reads them with one atomic load and one map
// lookup, without allocating.

// modelPools is one immutable view of which backends serve which model.
type modelPools struct {
	// filtering: at least one backend's models are known. Without it every request sees
	// every backend, and GET /v1/models is forwarded, as before models were known.
	filtering bool
	// byModel lists, per known model, the backends serving it and those whose models are
	// unknown, in the backend list's order.
	byModel map[string][]*backend.Backend
	// anyModel is the backends whose models are unknown (they take models nobody lists).
	anyModel []*backend.Backend
	// served is every known model, sorted; list the GET /v1/models answer.
	served []string
	list   []byte
}

// modelLabelOther is the model label of requests for models no backend lists (and of those
// without a model), so that the label set stays bounded by the models served.
const modelLabelOther = "other"

// maxModelEcho bounds how much of an unknown model name the 404 and its log line repeat.
const maxModelEcho = 256

// maxServedEcho bounds how many served models the 404's message names (the first, in order;
// "and N more" counts the rest): GET /v1/models lists them all.
const maxServedEcho = 20

// servedSummary is served joined by ", ", at most maxServedEcho of them, then "and N more".
func servedSummary(served []string) string {
	if len(served) <= maxServedEcho {
		return strings.Join(served, ", ")
	}
	return strings.Join(served[:maxServedEcho], ", ") + fmt.Sprintf(" and %d more (GET /v1/models lists them)", len(served)-maxServedEcho)
}

// buildPools computes the pools of bs. now stamps the list's "created".
func buildPools(bs []*backend.Backend, now time.Time) *modelPools {
	p := &modelPools{byModel: map[string][]*backend.Backend{}}
	parents := map[string]string{}
	for _, b := range bs {
		s := b.Models()
		if s == nil {
			p.anyModel = append(p.anyModel, b)
			continue
		}
		p.filtering = true
		for _, m := range s.Models() {
			if _, seen := parents[m.ID]; !seen {
				parents[m.ID] = m.Parent
				p.served = append(p.served, m.ID)
			}
		}
	}
	slices.Sort(p.served)
	for _, id := range p.served {
		var pool []*backend.Backend
		for _, b := range bs {
			if s := b.Models(); s == nil || s.Has([]byte(id)) {
				pool = append(pool, b)
			}
		}
		p.byModel[id] = pool
	}
	p.list = modelList(p.served, parents, now)
	return p
}

// modelEntry is one entry of the OpenAI model list prefixlb answers.
type modelEntry struct {
	ID      string  `json:"id"`
	Object  string  `json:"object"`
	Created int64   `json:"created"`
	OwnedBy string  `json:"owned_by"`
	Root    string  `json:"root"`
	Parent  *string `json:"parent"`
}

// modelList renders GET /v1/models: {"object":"list","data":[…]}, one entry per served model
// (sorted), adapters with their parent, as vLLM lists them.
func modelList(served []string, parents map[string]string, now time.Time) []byte {
	data := make([]modelEntry, 0, len(served))
	for _, id := range served {
		e := modelEntry{ID: id, Object: "model", Created: now.Unix(), OwnedBy: "prefixlb", Root: id}
		if par := parents[id]; par != "" {
			e.Root, e.Parent = par, &par
		}
		data = append(data, e)
	}
	b, _ := json.Marshal(struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{"list", data})
	return append(b, '\n')
}

// poolFor returns the backends that may serve k's model (healthy or not): all of them for a
// request without a model, or while no backend's models are known; ok is false when no
// backend serves the model. It does not allocate.
func (s *Server) poolFor(k *key.Key) (bs []*backend.Backend, ok bool) {
	p := s.pools.Load()
	if len(k.Model) == 0 || p == nil || !p.filtering {
		return s.pool.Snapshot(), true
	}
	if bs, ok := p.byModel[string(k.Model)]; ok {
		return bs, true
	}
	return p.anyModel, len(p.anyModel) > 0
}

// candidatesFor appends the healthy backends of k's pool to dst (see backend.Healthy; panic
// mode is decided per pool).
func (s *Server) candidatesFor(dst []*backend.Backend, k *key.Key) []*backend.Backend {
	bs, _ := s.poolFor(k)
	out, _ := backend.Healthy(dst, bs)
	return out
}

// rebuildPools recomputes the pools from the current backends; the caller holds setMu.
func (s *Server) rebuildPoolsLocked() {
	p := buildPools(s.pool.Snapshot(), time.Now())
	s.pools.Store(p)
	s.m.setModels(p.served)
}

// modelsChanged is the health checker's OnModels hook: the pools are rebuilt, and the policy
// moves b to its new pool's state (router.Fleet).
func (s *Server) modelsChanged(b *backend.Backend) {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	s.rebuildPoolsLocked()
	s.decider.ModelsChanged(b)
}

// pathModels is the model list's path (matched percent-decoded, as the backend matches it).
const pathModels = "/v1/models"

// serveLocally answers what prefixlb answers itself, after prepare: GET /v1/models (the union
// of the models served, once some are known) and a request for a model no backend serves
// (404, model_not_found, one log line, no backend touched). It reports whether it answered;
// the flow is then done.
func (s *Server) serveLocally(ctx *fasthttp.RequestCtx, f *flow) bool {
	p := s.pools.Load()
	if p == nil || !p.filtering {
		return false
	}
	if key.PathIs(f.path, pathModels) && (ctx.IsGet() || ctx.IsHead()) {
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("application/json")
		ctx.SetBody(p.list)
		s.log.Debug("request", zap.ByteString("method", f.method), zap.ByteString("path", f.path),
			zap.Int("status", fasthttp.StatusOK), zap.String("answered_by", "prefixlb"))
		s.doneLocally(f)
		return true
	}
	if _, ok := s.poolFor(&f.k); ok {
		return false
	}
	name := echoModel(string(f.k.Model))
	msg := notServedMessage(name, p)
	body, _ := json.Marshal(map[string]map[string]any{"error": {
		"message": msg, "type": "invalid_request_error", "param": "model", "code": "model_not_found"}})
	ctx.Response.Reset()
	ctx.SetStatusCode(fasthttp.StatusNotFound)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(body, '\n'))
	s.m.modelNotFound.Inc()
	s.log.Info("rejected request", zap.Int("status", fasthttp.StatusNotFound), zap.String("class", "model_not_found"),
		zap.String("model", name), zap.ByteString("path", f.path), zap.String("remote", ctx.RemoteAddr().String()))
	s.doneLocally(f)
	return true
}

// echoModel is name cut to maxModelEcho bytes (with "…" when cut).
func echoModel(name string) string {
	if len(name) > maxModelEcho {
		return name[:maxModelEcho] + "…"
	}
	return name
}

// notServedMessage is the 404's message for a model no backend of p serves.
func notServedMessage(name string, p *modelPools) string {
	return fmt.Sprintf("model %s is not served; served models: %s", strconv.Quote(echoModel(name)), servedSummary(p.served))
}

// doneLocally ends a flow that no backend saw.
func (s *Server) doneLocally(f *flow) {
	f.tr.endLocal()
	f.done.Store(true)
	s.wd.remove(f)
	s.putFlow(f)
}

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
