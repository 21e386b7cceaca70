package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
)

// Model discovery: every ModelsInterval, at start, and whenever a backend comes back healthy
// or the scrape detects a restart, the Checker GETs the backend's ModelsPath (/v1/models) and
// stores the ids it lists on the backend (backend.SetDiscoveredModels): base models and the
// LoRA adapters vLLM lists beside them (with "parent" naming the base). A backend whose models
// the config fixes (backends[].models) is not read. A read that fails (endpoint absent, bad
// JSON, no ids) leaves what was known: a backend never read serves any model. An id over
// maxModelIDBytes is dropped, and at most backend.MaxModels ids are kept.

// maxModelsBytes bounds a /v1/models body: a few hundred bytes per model, and vLLM lists at
// most a few hundred adapters (--max-loras), so 4 MiB is far above any real list.
const maxModelsBytes = 4 << 20

// maxModelIDBytes bounds a model id (and an adapter's parent) read from a backend: a Hugging
// Face repository id is at most 96 characters and its owner's name, a local path rarely over
// 200. An id is a label value in /metrics and is listed in the 404 for an unknown model and in
// GET /v1/models, so one 3 MB id would make each of them megabytes: a longer id is dropped
// (its model is not routed to that backend by name) with a warning (longIDWarnEvery).
const maxModelIDBytes = 256

// longIDWarnEvery is how often, at most, a backend whose list keeps over-long ids is warned
// about (the list is read every ModelsInterval and on every kick).
const longIDWarnEvery = 10 * time.Minute

// maxModelsLogged bounds the ids the "backend models" log line names (it gives the count).
const maxModelsLogged = 20

// OnModels sets f to be called (from a model-discovery goroutine) when a backend's
// discovered model set changes; the proxy rebuilds its per-model pools then.
func (c *Checker) OnModels(f func(b *backend.Backend)) { c.modelsHook.Store(&f) }

// startModelsLocked starts st's model reader, unless discovery is off.
func (c *Checker) startModelsLocked(st *bstate) {
	if c.o.ModelsInterval <= 0 {
		return
	}
	c.wg.Add(1)
	go c.modelsLoop(st)
}

// kickModels asks for a read of the backend's models now (never blocks; one pending kick is
// enough).
func (st *bstate) kickModels() {
	select {
	case st.modelsKick <- struct{}{}:
	default:
	}
}

// modelsLoop reads st's models at once, then every ModelsInterval and on every kick, until
// the backend is removed or the Checker closes.
func (c *Checker) modelsLoop(st *bstate) {
	defer c.wg.Done()
	ticker := time.NewTicker(c.o.ModelsInterval)
	defer ticker.Stop()
	failing := false
	for {
		c.safely(st.ctx, func(ctx context.Context) { failing = c.readModels(ctx, st, failing) })
		select {
		case <-st.ctx.Done():
			return
		case <-ticker.C:
		case <-st.modelsKick:
		}
	}
}

// readModels reads st's models once and reports whether the read failed; wasFailing (the
// previous read's outcome) makes a failure or a recovery log once per change.
func (c *Checker) readModels(ctx context.Context, st *bstate, wasFailing bool) bool {
	if st.b.ModelsConfigured() {
		return false
	}
	var set *backend.ModelSet
	var long int
	st.modelsAsked.Store(c.now().UnixNano())
	err := c.get(ctx, st.modelsURL, func(body io.Reader) error {
		var perr error
		set, long, perr = parseModels(io.LimitReader(body, maxModelsBytes))
		return perr
	})
	if long > 0 {
		if ok, held := st.longIDs.allow(c.now(), longIDWarnEvery); ok {
			c.log.Warn("backend lists model ids over the length limit; dropping them",
				zap.String("backend", st.b.Name), zap.Int("dropped", long), zap.Int("max_bytes", maxModelIDBytes),
				zap.Int("reads_not_logged", held))
		}
	}
	if ctx.Err() != nil {
		return wasFailing
	}
	if err != nil {
		if !wasFailing {
			// A server without the endpoint (404) is no fault: it serves any model. Anything
			// else (an error page, bad JSON, a timeout) is worth a warning.
			lvl := zap.WarnLevel
			if se := (*statusError)(nil); errors.As(err, &se) && se.status == http.StatusNotFound {
				lvl = zap.InfoLevel
			}
			c.log.Check(lvl, "model list unreadable; keeping what was known (unknown: serves any model)").Write(
				zap.String("backend", st.b.Name), zap.String("url", st.modelsURL), zap.Bool("known", st.b.Models() != nil), zap.Error(err))
		}
		return true
	}
	if set.Dropped > 0 && !st.modelsCapped {
		st.modelsCapped = true
		c.log.Warn("backend lists too many models; keeping the first (by id), dropping the rest",
			zap.String("backend", st.b.Name), zap.Int("kept", len(set.Models())), zap.Int("dropped", set.Dropped),
			zap.Int("max", backend.MaxModels))
	}
	if st.b.SetDiscoveredModels(set) {
		n := min(len(set.Models()), maxModelsLogged)
		ids := make([]string, n)
		for i, m := range set.Models()[:n] {
			ids[i] = m.ID
		}
		c.log.Info("backend models", zap.String("backend", st.b.Name), zap.Strings("models", ids),
			zap.Int("count", len(set.Models())), zap.Int("dropped", set.Dropped))
		if h := c.modelsHook.Load(); h != nil {
			(*h)(st.b)
		}
	} else if wasFailing {
		c.log.Info("model list readable again", zap.String("backend", st.b.Name))
	}
	return false
}

// errNoModels: a list without any id would route nothing to the backend; it is taken as unknown.
var errNoModels = errors.New("the model list has no ids")

// parseModels reads an OpenAI model list ({"object":"list","data":[{"id":…,"parent":…}]}).
// Models whose id or parent is over maxModelIDBytes are left out; long counts them.
func parseModels(r io.Reader) (set *backend.ModelSet, long int, err error) {
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return nil, 0, fmt.Errorf("model list is not JSON: %w", err)
	}
	ms := make([]backend.Model, 0, len(list.Data))
	for _, d := range list.Data {
		m := backend.Model{ID: d.ID}
		if d.Parent != nil {
			m.Parent = *d.Parent
		}
		if len(m.ID) > maxModelIDBytes || len(m.Parent) > maxModelIDBytes {
			long++
			continue
		}
		ms = append(ms, m)
	}
	set = backend.NewModelSet(ms, false)
	if len(set.Models()) == 0 {
		if long > 0 {
			return nil, long, fmt.Errorf("%w of at most %d bytes (%d longer)", errNoModels, maxModelIDBytes, long)
		}
		return nil, 0, errNoModels
	}
	return set, long, nil
}
