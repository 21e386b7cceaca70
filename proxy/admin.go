package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// maxDebugBody bounds the body /debug/route reads.
const maxDebugBody = 64 << 20

// AdminHandler serves the admin listener: /metrics (Prometheus text), /healthz (process
// alive), /readyz (at least one healthy backend), /debug/backends (JSON state per backend),
// /debug/route (POST a request body, get the routing decision without forwarding; the
// query parameter path= names the endpoint, default /v1/chat/completions), /debug/queue
// (flow control's queues: bands, flows by hashed ID, heads' ages; QueueInfo).
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		s.m.set.WritePrometheus(w)
		s.writeGauges(w)
		if s.ext.metrics != nil {
			s.ext.metrics(w)
		}
		metrics.WriteProcessMetrics(w)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		if s.ext.ready != nil {
			if err := s.ext.ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		for _, b := range s.pool.Snapshot() {
			if b.Healthy() {
				_, _ = io.WriteString(w, "ready\n")
				return
			}
		}
		http.Error(w, "no healthy backend", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("GET /debug/backends", s.debugBackends)
	mux.HandleFunc("POST /debug/route", s.debugRoute)
	mux.HandleFunc("GET /debug/queue", s.debugQueue)
	return mux
}

// Admin listener timeouts: generous for /metrics with many backends and for a large
// /debug/route body, short enough that a slow or stalled client (slowloris, a half-sent body,
// a reader that stopped) cannot hold connections and goroutines open.
const (
	// adminReadHeaderTimeout bounds reading one request's headers.
	adminReadHeaderTimeout = 10 * time.Second
	// adminReadTimeout bounds reading one whole request, headers and body (a /debug/route
	// body of up to 64 MiB).
	adminReadTimeout = 30 * time.Second
	// adminWriteTimeout bounds one response, from the end of the request headers.
	adminWriteTimeout = 60 * time.Second
	// adminIdleTimeout bounds the wait for the next request on a kept-alive connection
	// (Prometheus scrapes every 15–60 s and keeps its connection).
	adminIdleTimeout = 2 * time.Minute
)

// adminTimeouts are the admin server's http.Server timeouts.
type adminTimeouts struct{ readHeader, read, write, idle time.Duration }

var defaultAdminTimeouts = adminTimeouts{
	readHeader: adminReadHeaderTimeout, read: adminReadTimeout, write: adminWriteTimeout, idle: adminIdleTimeout,
}

// ServeAdmin serves AdminHandler on ln until the listener is closed. A connection is closed
// when its request headers take over 10 s, the whole request over 30 s, the response over
// 60 s, or it idles over 2 minutes between requests.
func (s *Server) ServeAdmin(ln net.Listener) error {
	return s.adminServer(defaultAdminTimeouts).Serve(ln)
}

func (s *Server) adminServer(t adminTimeouts) *http.Server {
	return &http.Server{Handler: s.AdminHandler(), ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read,
		WriteTimeout: t.write, IdleTimeout: t.idle}
}

// BackendInfo is one entry of /debug/backends.
type BackendInfo struct {
	Name          string `json:"name"`
	Healthy       bool   `json:"healthy"`
	InFlight      int64  `json:"inflight"`
	PrefillTokens int64  `json:"prefill_tokens"`
	// PeerInFlight and PeerPrefillTokens are what the peered prefixlb replicas last reported
	// in flight and queued here, summed (0 without peering; package peering).
	PeerInFlight      int64  `json:"peer_inflight"`
	PeerPrefillTokens int64  `json:"peer_prefill_tokens"`
	Served            uint64 `json:"served"`
	CacheEpoch        uint64 `json:"cache_epoch"`
	KVCacheTokens     int64  `json:"kv_cache_tokens"`
	IndexEntries      int64  `json:"index_entries"`
	IndexCapacity     int64  `json:"index_capacity"`
	IndexEvictions    uint64 `json:"index_evictions"`
	// Health is the checker's view: active checks, ejections, last check and scrape, scraped load.
	Health health.State `json:"health"`
}

// BackendInfos describes every backend.
func (s *Server) BackendInfos() []BackendInfo {
	bs := s.pool.Snapshot()
	out := make([]BackendInfo, 0, len(bs))
	idx := map[string]int{}
	for i, b := range bs {
		idx[b.Name] = i
		out = append(out, BackendInfo{Name: b.Name, Healthy: b.Healthy(), InFlight: b.InFlight(),
			PrefillTokens: b.PrefillTokens(), PeerInFlight: b.PeerInFlight(), PeerPrefillTokens: b.PeerPrefillTokens(),
			Served: b.Served(), CacheEpoch: b.Epoch(),
			KVCacheTokens: b.KVCapacity(s.defaultKV), Health: s.hc.State(b)})
	}
	if ix := s.decider.Index(); ix != nil {
		for _, st := range ix.Stats(nil) {
			if i, ok := idx[st.Name]; ok {
				out[i].IndexEntries, out[i].IndexCapacity, out[i].IndexEvictions = st.Entries, st.Capacity, st.Evictions
			}
		}
	}
	return out
}

func (s *Server) debugBackends(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"mode": s.mode, "backends": s.BackendInfos()})
}

// RouteInfo is the answer of /debug/route.
type RouteInfo struct {
	Path         string `json:"path"`
	Routed       bool   `json:"routed"`
	Parsed       bool   `json:"parsed"`
	Model        string `json:"model"`
	PromptTokens int    `json:"prompt_tokens"`
	Chunks       int    `json:"chunks"`
	// ShortFirstTurn: the prompt's first turn was shorter than the key's head chunks, so that
	// a match of its first chunk alone counts (key.Key.ShortFirstTurn).
	ShortFirstTurn bool   `json:"short_first_turn,omitempty"`
	Backend        string `json:"backend"`
	Reason         string `json:"reason"`
	MatchedChunks  int    `json:"matched_chunks"`
	// PredictedPrefillTokens and PredictedTTFTMs are the policy's estimate for the chosen
	// backend (0: none); Candidates what it weighed for each (prefix mode).
	PredictedPrefillTokens int64                      `json:"predicted_prefill_tokens,omitempty"`
	PredictedTTFTMs        float64                    `json:"predicted_ttft_ms,omitempty"`
	Candidates             []router.CandidateEstimate `json:"candidates,omitempty"`
	// Error is set when the data path would answer the request itself instead of routing it:
	// a model no backend serves (the 404's OpenAI-shaped error, code model_not_found; Backend
	// is then empty and /debug/route answers 404).
	Error *RouteError `json:"error,omitempty"`
}

// RouteError is the OpenAI-shaped error the data path would answer.
type RouteError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   string `json:"param"`
	Code    string `json:"code"`
}

// debugRoute answers /debug/route. The body and its keying are held within the body budget
// that the data path's bodies share (limits.max_buffered_body_bytes), as readDebugBody
// reads it: a preview that does not fit is refused with 503 (counted in
// prefixlb_request_body_budget_exhausted_total), never held beside it; every refusal is one
// log line.
func (s *Server) debugRoute(w http.ResponseWriter, r *http.Request) {
	var bl bodyLease
	defer s.bodies.release(&bl)
	body, status, msg := s.readDebugBody(r, &bl)
	if status != http.StatusOK {
		lvl := zap.InfoLevel
		if status == http.StatusServiceUnavailable {
			s.bodies.rejected.Inc()
			w.Header().Set("Retry-After", "1")
			lvl = zap.WarnLevel
		}
		if ce := s.log.Check(lvl, "rejected request"); ce != nil {
			ce.Write(zap.Int("status", status), zap.String("path", r.URL.Path), zap.String("reason", msg), zap.String("remote", r.RemoteAddr))
		}
		writeJSON(w, status, map[string]any{"error": map[string]string{"message": msg}})
		return
	}
	path := r.URL.Query().Get("path")
	if path == "" {
		path = "/v1/chat/completions"
	}
	ri := s.Explain(path, body)
	status = http.StatusOK
	if ri.Error != nil {
		status = http.StatusNotFound
	}
	writeJSON(w, status, ri)
}

// readDebugBody reads the body of a /debug/route request into bl's buffer, growing it as the
// data path's readGrowing does, every growth reserved from the body budget before it is
// allocated, and then reserves what keying it may allocate (key.MaxBuildAlloc). It returns
// the body and 200, or the status and message of the refusal: 413 over maxDebugBody, 503
// when the budget has no room, 400 when the body cannot be read whole. The caller releases
// bl in every case.
func (s *Server) readDebugBody(r *http.Request, bl *bodyLease) ([]byte, int, string) {
	const tooLarge = "body over 64 MiB"
	noBudget := fmt.Sprintf("prefixlb is buffering as many request bodies as limits.max_buffered_body_bytes allows (%d bytes); retry shortly", s.bodies.limit)
	cl := r.ContentLength
	if cl > maxDebugBody {
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	}
	total := int(cl)
	if cl < 0 { // chunked: at most maxDebugBody, and one byte to tell that it is more
		total = maxDebugBody + 1
	}
	n := 0
	if total > 0 {
		if !s.bodies.grow(bl, 0, min(bodyFirst, total)) {
			return nil, http.StatusServiceUnavailable, noBudget
		}
		for {
			if n == len(bl.buf) {
				if n == total {
					break
				}
				if cap(bl.buf) > n {
					bl.buf = bl.buf[:min(cap(bl.buf), total)]
				} else if !s.bodies.grow(bl, n, nextLen(n, total)) {
					return nil, http.StatusServiceUnavailable, noBudget
				}
			}
			m, err := r.Body.Read(bl.buf[n:])
			n += m
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, http.StatusBadRequest, "body unreadable: " + err.Error()
			}
		}
	}
	switch {
	case n > maxDebugBody:
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	case cl > 0 && n < total:
		return nil, http.StatusBadRequest, msgBodyIncomplete
	case !s.bodies.reserveWait(bl, key.MaxBuildAlloc(n)):
		return nil, http.StatusServiceUnavailable, noBudget
	}
	return bl.buf[:n], http.StatusOK, ""
}

// Explain returns the decision the proxy would make for body sent to path, without
// forwarding it or recording it in the index: among the healthy backends of the request's
// model pool, as the data path picks; for a model no backend serves, the data path's 404 in
// Error.
func (s *Server) Explain(path string, body []byte) RouteInfo {
	var k key.Key
	s.buildKey(0, []byte(path), body, &k)
	if p := s.pools.Load(); p != nil && p.filtering {
		if _, ok := s.poolFor(&k); !ok {
			return RouteInfo{Path: path, Routed: k.Routed, Parsed: k.OK, Model: string(k.Model), PromptTokens: k.PromptTokens,
				Chunks: len(k.Chunks), Reason: "model_not_found", Error: &RouteError{Message: notServedMessage(string(k.Model), p),
					Type: "invalid_request_error", Param: "model", Code: "model_not_found"}}
		}
	}
	cands := s.candidatesFor(nil, &k)
	d := s.decider.Preview(&k, cands)
	ri := RouteInfo{Path: path, Routed: k.Routed, Parsed: k.OK, Model: string(k.Model), PromptTokens: k.PromptTokens,
		Chunks: len(k.Chunks), ShortFirstTurn: k.ShortFirstTurn, Reason: d.Reason.String(), MatchedChunks: d.MatchedChunks,
		PredictedPrefillTokens: d.PrefillTokens, PredictedTTFTMs: float64(d.PredictedTTFT) / float64(time.Millisecond),
		Candidates: s.decider.Explain(&k, cands)}
	if d.Backend != nil {
		ri.Backend = d.Backend.Name
	}
	return ri
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
