// Package proxy is prefixlb's data path: a fasthttp server that parses each request once,
// asks the routing policy for a backend, forwards the request unchanged and relays the
// response chunk by chunk as the backend writes it. It owns the plumbing every policy relies
// on: in-flight accounting, retries before the first byte, timeouts, client-disconnect abort
// and graceful shutdown.
package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// Response headers prefixlb adds.
const (
	// HeaderBackend names the backend that served the request (its configured URL).
	HeaderBackend = "x-prefixlb-backend"
	// HeaderRoute gives the routing reason and the matched chunks: "match;chunks=12".
	HeaderRoute = "x-prefixlb-route"
)

// Server is one prefixlb data listener with its backends and policy.
type Server struct {
	cfg      *configs.Config
	log      *zap.Logger
	pool     *backend.Pool
	ups      atomic.Pointer[map[*backend.Backend]*upstream]
	policy   router.Policy
	learner  router.Learner    // the policy, when it learns; nil otherwise
	pass     router.RoundRobin // passthrough endpoints
	keys     *key.Builder
	srv      *fasthttp.Server
	wd       *watchdog
	hc       *health.Checker
	draining atomic.Bool // Shutdown started: /readyz fails
	setMu    sync.Mutex  // serializes backend-list changes
	hcOnce   sync.Once
	m        *serverMetrics
	flows    sync.Pool
	nextID   atomic.Uint64

	headerTimeout time.Duration
	idleTimeout   time.Duration
	connTimeout   time.Duration
	backendHeader bool // add HeaderBackend (response_headers.backend)

	bodies     *bodyBudget   // limits.max_buffered_body_bytes
	bodyIdle   time.Duration // timeouts.client_body_idle
	clientRead time.Duration // timeouts.client_read
}

// New builds a Server from a validated config. It starts nothing until Serve.
func New(cfg *configs.Config, log *zap.Logger) (*Server, error) {
	if log == nil {
		log = zap.NewNop()
	}
	bs, err := cfg.NewBackends()
	if err != nil {
		return nil, err
	}
	pol, err := NewPolicy(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:           cfg,
		log:           log,
		pool:          backend.NewPool(nil),
		policy:        pol,
		keys:          key.NewBuilder(cfg.Prefix.ChunkTokens),
		wd:            newWatchdog(),
		hc:            health.New(HealthOptions(cfg.Health), log, nil),
		m:             newServerMetrics(cfg.Mode),
		headerTimeout: cfg.Timeouts.ResponseHeader.D(),
		idleTimeout:   cfg.Timeouts.Idle.D(),
		connTimeout:   cfg.Timeouts.Connect.D(),
		backendHeader: cfg.ResponseHeaders.BackendOn(),
	}
	s.learner, _ = pol.(router.Learner)
	s.flows.New = func() any { return &flow{s: s} }
	s.hc.OnKVCapacity(func(b *backend.Backend) {
		log.Info("backend reported its KV-cache capacity", zap.String("backend", b.Name),
			zap.Int64("kv_cache_tokens", b.KVCapacity(cfg.Prefix.DefaultKVCacheTokens)))
		s.refreshPolicy()
	})
	s.SetBackends(bs)
	s.bodies = newBodyBudget(cfg.Limits.MaxBufferedBodyBytes, s.m.set)
	s.bodyIdle, s.clientRead = cfg.Timeouts.ClientBodyIdle.D(), cfg.Timeouts.ClientRead.D()
	s.srv = &fasthttp.Server{
		Handler:                       s.handle,
		Name:                          "prefixlb",
		MaxRequestBodySize:            cfg.MaxRequestBodyBytes,
		ReadBufferSize:                64 << 10, // long Authorization/cookie headers; 431 above
		WriteTimeout:                  0,        // a stream has no total timeout
		ReadTimeout:                   cfg.Timeouts.ClientRead.D(),
		IdleTimeout:                   90 * time.Second,
		SecureErrorLogMessage:         true, // never echo request bytes (keys, prompts) in errors
		DisableHeaderNamesNormalizing: true,
		DisablePreParseMultipartForm:  true,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		NoDefaultDate:                 true,
		CloseOnShutdown:               true,
		ErrorHandler:                  s.handleParseError,
		Logger:                        fasthttpLogger{l: log, s: s},
		StreamRequestBody:             true, // handle reads bodies within limits.max_buffered_body_bytes (bodybudget.go)
		HeaderReceived:                s.headerReceived,
	}
	return s, nil
}

// NewPolicy returns the policy for cfg.Mode.
func NewPolicy(cfg *configs.Config) (router.Policy, error) {
	switch cfg.Mode {
	case "round-robin":
		return &router.RoundRobin{}, nil
	case "least-load":
		return &router.LeastLoad{}, nil
	case "prefix":
		return newPrefixPolicy(cfg), nil
	}
	return nil, fmt.Errorf("mode: unknown mode %q", cfg.Mode)
}

// refreshPolicy hands the current backends to the policy again (capacities changed).
func (s *Server) refreshPolicy() {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	if sb, ok := s.policy.(interface{ SetBackends([]*backend.Backend) }); ok {
		sb.SetBackends(s.pool.Snapshot())
	}
}

// SetBackends replaces the backend list. Connections to removed backends are closed once idle;
// in-flight requests to them finish.
func (s *Server) SetBackends(bs []*backend.Backend) {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	old := s.ups.Load()
	m := make(map[*backend.Backend]*upstream, len(bs))
	for _, b := range bs {
		if old != nil {
			if u, ok := (*old)[b]; ok {
				m[b] = u
				continue
			}
		}
		m[b] = newUpstream(b, s.connTimeout, s.m.forBackend(b.Name))
	}
	s.ups.Store(&m)
	s.hc.SetBackends(bs)
	s.pool.Set(bs)
	if sb, ok := s.policy.(interface{ SetBackends([]*backend.Backend) }); ok {
		sb.SetBackends(bs)
	}
	if old != nil {
		for b, u := range *old {
			if _, ok := m[b]; !ok {
				u.retire()
				b.ResetCache()
			}
		}
	}
}

// HealthOptions maps the health section of the config onto the health package's options.
func HealthOptions(h configs.Health) health.Options {
	o := health.Options{
		Path: h.Path, Interval: h.Interval.D(), Timeout: h.Timeout.D(), Rise: h.HealthyThreshold,
		Fall: h.UnhealthyThreshold, Disabled: h.Disabled, ConsecutiveFailures: h.ConsecutiveFailures,
		BaseEjection: h.BaseEjection.D(), MaxEjection: h.MaxEjection.D(), MaxEjectedPercent: h.MaxEjectedPercent,
		ScrapeInterval: h.ScrapeInterval.D(), MetricsPath: h.MetricsPath, ScrapeStaleAfter: h.ScrapeStaleAfter.D(),
	}
	if h.ScrapeDisabled {
		o.ScrapeInterval = 0
	}
	return o
}

// Health is the backend health checker.
func (s *Server) Health() *health.Checker { return s.hc }

// Backends returns the current backends.
func (s *Server) Backends() []*backend.Backend { return s.pool.Snapshot() }

// Policy returns the routing policy.
func (s *Server) Policy() router.Policy { return s.policy }

// Serve starts the health checker and accepts requests on ln until Shutdown. Temporary
// accept errors (out of file descriptors) are retried with backoff instead of stopping.
func (s *Server) Serve(ln net.Listener) error {
	s.hcOnce.Do(s.hc.Start)
	return s.srv.Serve(&retryListener{Listener: ln, log: s.log})
}

// Shutdown stops accepting, lets in-flight requests finish until ctx is done, then aborts
// what is left (closing their upstream connections so the engines stop generating).
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	err := s.srv.ShutdownWithContext(ctx)
	if err != nil {
		s.abortAll(errShuttingDown)
		// Give the aborted streams a moment to unwind through their CloseWithError.
		unwind, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.srv.ShutdownWithContext(unwind)
	}
	s.wd.close()
	s.hc.Close()
	for _, u := range *s.ups.Load() {
		u.retire()
	}
	return err
}

func (s *Server) abortAll(why error) {
	for i := range s.wd.shards {
		sh := &s.wd.shards[i]
		sh.mu.Lock()
		for f := range sh.flows {
			f.abort(why)
		}
		sh.mu.Unlock()
	}
}

func (s *Server) getFlow(ctx *fasthttp.RequestCtx) *flow {
	f := s.flows.Get().(*flow)
	f.id = s.nextID.Add(1)
	f.start = time.Now()
	f.idle = s.idleTimeout
	f.done.Store(false)
	f.gone.Store(false)
	f.goneBy = nil
	f.conn0 = ctx.Conn() // SyscallConn allocates: the watchdog calls it only for flows still in flight at a tick
	return f
}

func (s *Server) putFlow(f *flow) {
	f.k.Recycle()
	f.cands = f.cands[:0]
	f.lease = backend.Lease{}
	f.dec = router.Decision{}
	f.resp.Reset()
	f.raw = nil
	f.conn0 = nil
	f.up = nil
	f.body = nil
	f.eof = false
	f.firstByte = 0
	f.idleSet = time.Time{}
	f.bytes = 0
	f.attempts = 0
	f.usagePrompt, f.usageCached = 0, 0
	f.readErr = nil
	f.method = f.method[:0]
	f.path = f.path[:0]
	s.flows.Put(f)
}

// handle is the request path: classify and key, pick, forward (retrying once elsewhere before
// any byte reached the client), relay.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	var bl bodyLease
	defer s.endRequest(ctx, &bl)
	if !s.admit(ctx, &bl) {
		return
	}
	f := s.getFlow(ctx)
	req := &ctx.Request
	uri := req.Header.RequestURI()
	if len(uri) > 0 && uri[0] != '/' && uri[0] != '*' {
		// Absolute form (POST http://host/v1/chat/completions, as sent to a forward proxy):
		// forwarded and routed in origin form; userinfo in it is not passed on.
		req.Header.SetRequestURIBytes(req.URI().RequestURI())
		uri = req.Header.RequestURI()
	}
	path := uri
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	f.method = append(f.method, req.Header.Method()...)
	f.path = append(f.path, path...)
	s.keys.Build(path, req.Body(), &f.k)

	prepareRequestHeader(&req.Header, peerAddr(ctx))
	s.wd.add(f)

	f.cands, _ = backend.Healthy(f.cands, s.pool.Snapshot())
	var lastErr error
	for removed := 0; ; {
		if len(f.cands) == 0 || f.attempts >= 2 {
			break
		}
		if f.attempts == 0 {
			f.dec = s.pick(&f.k, f.cands)
		} else {
			f.dec = s.repick(f)
		}
		if f.dec.Backend == nil {
			break
		}
		f.attempts++
		canRetry := f.attempts < 2 && len(f.cands) > 1
		err := s.try(ctx, f, f.dec.Backend, canRetry)
		if err == nil {
			return // response handed to fasthttp; the relay finishes the flow
		}
		lastErr = err
		if errors.Is(err, errBackendRemoved) && removed < 4 {
			// A reload removed the picked backend between the snapshot and the dial: nothing
			// was sent, so pick again from the current backends without spending the retry.
			removed++
			f.attempts--
			f.cands, _ = backend.Healthy(f.cands, s.pool.Snapshot())
			continue
		}
		if !retryable(err) || f.gone.Load() {
			break
		}
		s.log.Debug("retrying on another backend", zap.String("backend", f.dec.Backend.Name), zap.Error(err))
		f.cands = without(f.cands, f.dec.Backend)
	}
	if lastErr == nil {
		lastErr = errNoBackend
	}
	if f.gone.Load() {
		lastErr = f.goneErr()
	}
	status := statusOf(lastErr)
	if status == StatusClientClosedRequest {
		ctx.SetConnectionClose()
		ctx.SetStatusCode(status)
	} else {
		writeError(ctx, status, lastErr.Error())
	}
	f.resp.SetStatusCode(status)
	f.finish(status, lastErr)
}

func (s *Server) pick(k *key.Key, cands []*backend.Backend) router.Decision {
	if !k.Routed {
		d := s.pass.Pick(k, cands)
		d.Reason = router.ReasonPassthrough
		return d
	}
	d := s.policy.Pick(k, cands)
	if !k.OK {
		d.Reason = router.ReasonParseFallback
	}
	return d
}

// repick chooses the backend of a retry among the candidates not yet tried. The prefix
// policy gives its next best; counter-based picks (round-robin, passthrough) take the next
// candidate after the failed one instead of advancing their shared counter a second time,
// which would make every first attempt land on the same backend.
func (s *Server) repick(f *flow) router.Decision {
	switch f.dec.Reason {
	case router.ReasonRoundRobin, router.ReasonPassthrough:
		d := f.dec
		d.Backend = f.cands[f.id%uint64(len(f.cands))]
		return d
	}
	return s.pick(&f.k, f.cands)
}

// retryStatus is a backend answer that says "not now" before any byte reached the client:
// 502/503 (overloaded, starting, behind its own proxy) and 429 (busy).
type retryStatus int

func (r retryStatus) Error() string { return fmt.Sprintf("backend answered %d", int(r)) }

func retryable(err error) bool {
	var rs retryStatus
	var de *dialError
	return errors.As(err, &rs) || errors.As(err, &de) || errors.Is(err, errHeaderTimeout) ||
		errors.Is(err, errUpstreamClosed) || errors.Is(err, errInvalidResponse)
}

// earlyResponseWait bounds the read of a response after writing the request failed: a
// backend that answered before reading the whole body (413, 400) and closed has its answer
// in the socket already; a connection that carries none is given up on at once.
const earlyResponseWait = time.Second

// try sends the request to b and, when response headers arrive, hands the response to
// fasthttp. A nil error means the flow now belongs to the relay.
func (s *Server) try(ctx *fasthttp.RequestCtx, f *flow, b *backend.Backend, canRetry bool) error {
	up := (*s.ups.Load())[b]
	if up == nil {
		return &dialError{errBackendRemoved}
	}
	f.up = up
	f.lease.Begin(b, int64(f.k.PromptTokens))
	req := &ctx.Request
	req.Header.SetHost(b.Addr)
	head := bytes.Equal(f.method, []byte(fasthttp.MethodHead))
	// The prefix index learns as soon as the request is on its way, so that updating it
	// overlaps the backend's work instead of delaying the response; a backend that then
	// refuses the request (status ≥ 400) or never answers is unlearned again.
	learn := s.learner != nil && f.k.Routed && f.k.OK
	var learned router.Learned
	early := false // the response was read after writing the request failed
	for fresh := 0; ; fresh++ {
		now := time.Now()
		var c *uconn
		var reused bool
		var err error
		if fresh == 0 {
			c, reused, err = up.get(now)
		} else {
			// The pooled connection was stale: its siblings idle as long likely are too (a
			// backend that restarted closed them all), so the resend dials.
			c, err = up.dial()
		}
		if err != nil {
			s.unlearn(f, b, learned)
			f.lease.Release()
			s.hc.Observe(b, health.OutcomeConnectError)
			return err
		}
		if !f.setConn(c) {
			_ = c.Close()
			s.unlearn(f, b, learned)
			f.lease.Release()
			return f.goneErr()
		}
		deadline := now.Add(s.headerTimeout)
		_ = c.SetDeadline(deadline)
		err = c.writeRequest(req)
		if err == nil && learn && learned == 0 {
			learned = s.learner.Learn(&f.k, b, f.dec.MatchedChunks)
		}
		early = false
		if err == nil {
			err = readHead(f, c, head)
		} else if !f.gone.Load() && !isTimeout(err) {
			// The backend may have answered before reading all of the body (413, 400) and
			// closed, which makes the write fail: its answer is in the socket. Relay it and
			// judge the backend by its status; the connection is not reused.
			_ = c.SetReadDeadline(earliest(deadline, time.Now().Add(earlyResponseWait)))
			if readHead(f, c, head) == nil {
				err, early = nil, true
			}
		}
		if err == nil && f.resp.StatusCode() < fasthttp.StatusOK {
			// 101 Switching Protocols: the connection now speaks another protocol (fasthttp
			// consumes 100, 103 and the other 1xx before the final response). prefixlb does not
			// tunnel upgrades; the connection is closed, never pooled.
			err = &failure{errInvalidResponse, errUnexpected1xx}
		}
		if err == nil {
			break
		}
		if cc := f.takeConn(); cc != nil {
			_ = cc.Close()
		}
		f.resp.Reset()
		switch {
		case f.gone.Load():
			err = f.goneErr()
		case reused && fresh == 0 && staleConn(err):
			continue
		case isTimeout(err):
			err = &failure{errHeaderTimeout, err}
			s.hc.Observe(b, health.OutcomeTimeout)
		default:
			if !errors.Is(err, errInvalidResponse) {
				err = classify(err)
			}
			s.hc.Observe(b, health.OutcomeConnectError)
		}
		s.unlearn(f, b, learned)
		f.lease.Release()
		return err
	}
	status := f.resp.StatusCode()
	s.hc.Observe(b, outcomeOf(status))
	// A refused request (400 context too long, 429, 503 retried elsewhere) left nothing in
	// the backend's cache.
	if status >= 400 {
		s.unlearn(f, b, learned)
	}
	if canRetry && (status == fasthttp.StatusServiceUnavailable || status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusBadGateway) {
		_ = f.resp.CloseBodyStream()
		if cc := f.takeConn(); cc != nil {
			_ = cc.Close()
		}
		f.resp.Reset()
		f.lease.Release()
		return retryStatus(status)
	}

	// Headers arrived: from here on the response belongs to the client.
	f.resp.Header.CopyTo(&ctx.Response.Header)
	if early {
		f.resp.SetConnectionClose() // the request was not written whole: the connection is done
	}
	stripHopResponse(&ctx.Response.Header)
	if s.backendHeader {
		ctx.Response.Header.Set(HeaderBackend, b.Name)
	} else {
		ctx.Response.Header.Del(HeaderBackend) // a backend's own (a prefixlb in front of others)
	}
	var rh [48]byte
	ctx.Response.Header.SetBytesV(HeaderRoute, appendRouteHeader(rh[:0], f.dec))
	f.body = f.resp.BodyStream()
	if f.body == nil { // HEAD, 204, 304
		f.eof = true
		ctx.Response.SkipBody = head
		f.finish(status, nil)
		return nil
	}
	f.ctx, f.clientWrite = ctx, s.cfg.Timeouts.ClientWrite.D()
	cl := f.resp.Header.ContentLength()
	if cl < 0 {
		cl = -1
		if !ctx.Request.Header.IsHTTP11() {
			f.relayClosing(ctx)
			return nil
		}
	}
	ctx.SetBodyStream(f, cl)
	return nil
}

// unlearn withdraws what was learned for f on b (the backend refused it or never answered).
func (s *Server) unlearn(f *flow, b *backend.Backend, learned router.Learned) {
	if learned != 0 {
		s.learner.Unlearn(&f.k, b, learned)
	}
}

// hasBody reports whether a response has body bytes still to come on the connection.
func hasBody(r *fasthttp.Response, head bool) bool {
	st := r.StatusCode()
	return !head && r.Header.ContentLength() != 0 && st >= 200 && st != fasthttp.StatusNoContent && st != fasthttp.StatusNotModified
}

// outcomeOf classifies a response status for passive health: 5xx counts against the backend,
// 429 means busy (not dead), other 4xx are the client's fault.
func outcomeOf(status int) health.Outcome {
	switch {
	case status == fasthttp.StatusTooManyRequests:
		return health.OutcomeBusy
	case status >= 500:
		return health.OutcomeServerError
	case status >= 400:
		return health.OutcomeClientError
	}
	return health.OutcomeOK
}

func routeHeader(d router.Decision) string { return string(appendRouteHeader(nil, d)) }

// appendRouteHeader appends the x-prefixlb-route value "REASON;chunks=N" (no fmt: this runs
// on every request).
func appendRouteHeader(dst []byte, d router.Decision) []byte {
	dst = append(dst, d.Reason.String()...)
	dst = append(dst, ";chunks="...)
	return strconv.AppendInt(dst, int64(d.MatchedChunks), 10)
}

func without(cs []*backend.Backend, b *backend.Backend) []*backend.Backend {
	out := cs[:0]
	for _, c := range cs {
		if c != b {
			out = append(out, c)
		}
	}
	return out
}

// logRequest writes the request's line: status is what the client saw, res what became of
// the request (a stream cut after its 200 is result truncated, not a success); err, when set,
// appears as its class only, and at debug with a sanitised detail, never the backend's bytes.
func (s *Server) logRequest(f *flow, status int, err error, res result) {
	lvl := zap.InfoLevel
	if (res != resultOK && res != resultClientGone && res != resultClientWriteTimeout) || status >= 500 {
		lvl = zap.WarnLevel
	}
	ce := s.log.Check(lvl, "request")
	if ce == nil {
		return
	}
	name := ""
	if b := f.lease.Backend(); b != nil {
		name = b.Name
	}
	fields := []zap.Field{
		zap.ByteString("method", f.method),
		zap.ByteString("path", f.path),
		zap.String("backend", name),
		zap.Int("status", status),
		zap.Stringer("reason", f.dec.Reason),
		zap.Int("matched_chunks", f.dec.MatchedChunks),
		zap.Int("prompt_tokens", f.k.PromptTokens),
		zap.Duration("ttft", f.firstByte),
		zap.Duration("duration", time.Since(f.start)),
		zap.Int64("bytes", f.bytes),
		zap.Int("attempts", f.attempts),
		zap.Stringer("result", res),
	}
	if err != nil {
		fields = append(fields, zap.String("error", err.Error()))
		if s.log.Core().Enabled(zap.DebugLevel) {
			fields = append(fields, zap.String("detail", errDetail(err)))
		}
	}
	ce.Write(fields...)
}
