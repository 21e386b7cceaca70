package proxy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

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
