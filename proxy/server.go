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
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
	"github.com/prefixlb/prefixlb/tracing"
)

// Response headers prefixlb adds.
const (
	// HeaderBackend names the backend that served the request (its configured URL).
	HeaderBackend = "x-prefixlb-backend"
	// HeaderRoute gives the routing reason and the matched chunks, and in prefix mode the
	// predicted cached tokens and TTFT: "match;chunks=12;cached=764;predicted_ttft_us=21850".
	HeaderRoute = "x-prefixlb-route"
)

// Server is one prefixlb data listener with its backends and policy.
type Server struct {
	log      *zap.Logger
	pool     *backend.Pool
	pools    atomic.Pointer[modelPools] // per-model candidate lists (pools.go)
	ups      atomic.Pointer[map[*backend.Backend]*upstream]
	decider  *router.Decider // the mode's policy, with passthrough, parse-fallback and retries
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

	mode      string // Options.Mode
	defaultKV int64  // Options.DefaultKVCacheTokens

	headerTimeout time.Duration
	idleTimeout   time.Duration
	connTimeout   time.Duration
	clientWrite   time.Duration
	backendHeader bool // add HeaderBackend (not Options.OmitBackendHeader)

	maxBody    int           // Options.MaxRequestBodyBytes
	bodies     *bodyBudget   // Options.MaxBufferedBodyBytes
	bodyIdle   time.Duration // Timeouts.ClientBodyIdle
	clientRead time.Duration // Timeouts.ClientRead

	ext extension // admin additions (extension.go)

	local *localResources // the proxy's own resources running out: counted and logged (localres.go)
	fds   *fdBudget       // the data path's descriptors (nil: no limit known)

	panicLog *logLimiter // which panics log their stack (recover.go)

	tracer *tracing.Tracer // nil: tracing off (trace.go)

	fc *flowControl // flow control (flowctl.go); always built, on by Options.FlowControl.Enabled

	testPanic func(panicStage) // tests only: makes serving panic at a stage (recover.go); nil otherwise
}

// errNoPolicy is New's answer to Options without a Policy.
var errNoPolicy = errors.New("proxy: Options.Policy is required")

// New builds a Server from o (zero fields take the defaults, see Options). It starts
// nothing until Serve.
func New(o Options) (*Server, error) {
	if o.Policy == nil {
		return nil, errNoPolicy
	}
	o = o.withDefaults()
	if err := o.FlowControl.validate(o.Health.ScrapeInterval); err != nil {
		return nil, err
	}
	log := o.Log
	tracer, err := newTracer(o.Tracing, log)
	if err != nil {
		return nil, err
	}
	s := &Server{
		log:           log,
		pool:          backend.NewPool(nil),
		decider:       router.NewDecider(o.Policy),
		keys:          key.NewBuilder(o.ChunkTokens),
		wd:            newWatchdog(),
		hc:            health.New(o.Health, log, nil),
		m:             newServerMetrics(o.Mode),
		panicLog:      newPanicLimiter(time.Now),
		tracer:        tracer,
		mode:          o.Mode,
		defaultKV:     o.DefaultKVCacheTokens,
		headerTimeout: o.Timeouts.ResponseHeader,
		idleTimeout:   o.Timeouts.Idle,
		connTimeout:   o.Timeouts.Connect,
		clientWrite:   o.Timeouts.ClientWrite,
		backendHeader: !o.OmitBackendHeader,
		maxBody:       o.MaxRequestBodyBytes,
		bodyIdle:      o.Timeouts.ClientBodyIdle,
		clientRead:    o.Timeouts.ClientRead,
		fds:           processFDBudget(),
	}
	s.local = newLocalResources(s.m.set, log, time.Now)
	if s.fds != nil {
		s.fds.reclaim = s.closeIdle
	}
	s.m.chunkTokens = o.ChunkTokens
	s.flows.New = func() any { return &flow{s: s, wake: make(chan struct{}, 1)} }
	s.fc = newFlowControl(s, o.FlowControl)
	s.hc.OnKVCapacity(func(b *backend.Backend) {
		log.Info("backend reported its KV-cache capacity", zap.String("backend", b.Name),
			zap.Int64("kv_cache_tokens", b.KVCapacity(s.defaultKV)))
		s.refreshPolicy()
	})
	s.hc.OnModels(s.modelsChanged)
	s.SetBackends(o.Backends)
	s.bodies = newBodyBudget(o.MaxBufferedBodyBytes, s.m.set)
	s.srv = &fasthttp.Server{
		Handler:                       s.handle,
		Name:                          "prefixlb",
		MaxRequestBodySize:            o.MaxRequestBodyBytes,
		ReadBufferSize:                64 << 10, // long Authorization/cookie headers; 431 above
		WriteTimeout:                  0,        // a stream has no total timeout
		ReadTimeout:                   o.Timeouts.ClientRead,
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
		StreamRequestBody:             true, // handle reads bodies within Options.MaxBufferedBodyBytes (bodybudget.go)
		HeaderReceived:                s.headerReceived,
	}
	return s, nil
}

// Health is the backend health checker.
func (s *Server) Health() *health.Checker { return s.hc }

// Backends returns the current backends.
func (s *Server) Backends() []*backend.Backend { return s.pool.Snapshot() }

// Policy returns the routing policy.
func (s *Server) Policy() router.Policy { return s.decider.Policy() }

// Serve starts the health checker and accepts requests on ln until Shutdown. Temporary
// accept errors (out of file descriptors) are retried with backoff instead of stopping;
// connections are accepted within the data path's descriptor budget (retryListener).
func (s *Server) Serve(ln net.Listener) error {
	s.hcOnce.Do(s.hc.Start)
	return s.srv.Serve(&retryListener{Listener: ln, local: s.local, fds: s.fds, where: "accept"})
}

// closeIdle closes every idle pooled backend connection: the descriptor budget reclaims them
// when it runs out.
func (s *Server) closeIdle() {
	if ups := s.ups.Load(); ups != nil {
		for _, u := range *ups {
			u.closeIdle()
		}
	}
}

// Shutdown stops accepting, lets in-flight requests finish until ctx is done, then aborts
// what is left (closing their upstream connections so the engines stop generating).
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	// Queued requests are answered first (503, Retry-After): they are not in flight, and
	// the server's shutdown would otherwise wait for their handlers until ctx ends.
	if n := s.fc.drain(); n > 0 {
		s.log.Info("flow control: queued requests answered 503 at shutdown", zap.Int("requests", n))
	}
	err := s.srv.ShutdownWithContext(ctx)
	if err != nil {
		s.abortAll(errShuttingDown)
		// Give the aborted streams a moment to unwind through their CloseWithError.
		unwind, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.srv.ShutdownWithContext(unwind)
	}
	s.wd.close()
	s.fc.close()
	s.hc.Close()
	for _, u := range *s.ups.Load() {
		u.retire()
	}
	s.flushTraces()
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
	select { // a wake left from an abort after the flow's last wait
	case <-f.wake:
	default:
	}
	f.conn0 = ctx.Conn() // SyscallConn allocates: the watchdog calls it only for flows still in flight at a tick
	return f
}

func (s *Server) putFlow(f *flow) {
	s.settleQueued(f)
	f.placed, f.leased, f.refused, f.queueWait = false, false, false, 0
	f.direct, f.reqHeader, f.directOut, f.relayed = false, nil, 0, false
	f.class, f.classOK = classed{}, false
	f.usageOutput, f.usageOutputSeen = 0, false
	f.k.Recycle()
	f.cands = f.cands[:0]
	f.lease = backend.Lease{}
	f.dec = router.Decision{}
	f.ticket = router.Ticket{}
	f.resp.Reset()
	f.raw = nil
	f.conn0 = nil
	f.up = nil
	f.body = nil
	f.eof = false
	f.firstByte, f.firstBody, f.tokenSeen = 0, 0, false
	f.idleSet = time.Time{}
	f.bytes = 0
	f.attempts, f.settles = 0, 0
	f.usagePrompt, f.usageCached, f.usageCacheSeen = 0, 0, false
	f.readErr = nil
	f.method = f.method[:0]
	f.path = f.path[:0]
	s.flows.Put(f)
}

// Attempt limits of one request.
const (
	// maxAttempts: a request is tried once, and once more on another backend when the first
	// attempt failed before any byte reached the client.
	maxAttempts = 2
	// maxRemovedRepicks bounds the picks again of a request whose backend a reload removed
	// between the snapshot of the candidates and the dial (they do not spend the retry).
	maxRemovedRepicks = 4
	// maxSettles bounds the rounds a request is held and decided again because peers
	// decided on its backend at the same instant (Server.settle): the third decision is sent
	// at once.
	maxSettles = 2
)

// handle is the request path: classify and key, pick, forward (retrying once elsewhere before
// any byte reached the client), relay.
//
// A panic anywhere in it is contained (recover.go): the client gets a 500 and the request's
// resources are released.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	var st serving
	defer s.endServing(ctx, &st)
	if s.overflowed(ctx) {
		return
	}
	st.tr = s.traceRequest(ctx)
	if !s.admit(ctx, &st.body) {
		return
	}
	f := s.getFlow(ctx)
	st.f = f
	st.tr.admitted(f)
	s.prepare(ctx, f)
	if s.serveLocally(ctx, f) {
		return
	}
	if err := s.forward(ctx, f); err != nil {
		s.fail(ctx, f, err)
	}
}

// prepare puts the request in origin form, keys it, rewrites its forwarding headers and
// hands the flow to the watchdog.
func (s *Server) prepare(ctx *fasthttp.RequestCtx, f *flow) {
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
	s.buildKey(f.id, path, req.Body(), &f.k)
	f.keyed = s.m.routing.keyed(f.start)
	f.tr.keyed(&f.k, f.keyed)

	prepareRequestHeader(&req.Header, peerAddr(ctx))
	s.wd.add(f)
}

// forward picks a backend among the healthy ones of the request's model pool and tries it, then, if that failed before any byte reached the
// client, another. nil means the response was handed to fasthttp and the relay finishes the
// flow; otherwise the error is the last attempt's (or errNoBackend).
func (s *Server) forward(ctx *fasthttp.RequestCtx, f *flow) error {
	f.ticket = s.decider.Ticket(&f.k)
	f.cands = s.candidatesFor(f.cands, &f.k)
	if err := s.hold(ctx, f); err != nil {
		return err
	}
	if f.placed && f.gone.Load() {
		// The client left while the dispatcher placed the request: no backend sees it.
		f.placed, f.leased, f.refused = false, false, true
		f.lease.Release()
		return f.goneErr()
	}
	lastErr := errNoBackend
	for removed := 0; len(f.cands) > 0 && f.attempts < maxAttempts; {
		switch {
		case f.placed:
			// Placed by flow control's dispatcher, which decided and began the lease.
			f.placed = false
		case f.attempts == 0:
			from := f.pickStart()
			f.dec = s.decider.Pick(&f.k, f.cands)
			f.tr.picked(&f.dec, f.k.PromptTokens, s.m.routing.picked(from))
		default:
			from := f.pickStart()
			f.dec = s.decider.Repick(&f.k, f.dec, f.cands, f.id)
			f.tr.picked(&f.dec, f.k.PromptTokens, s.m.routing.picked(from))
		}
		s.testPanicAt(stagePick)
		if f.dec.Backend == nil {
			break
		}
		f.attempts++
		canRetry := f.attempts < maxAttempts && len(f.cands) > 1
		err := s.try(ctx, f, f.dec.Backend, canRetry)
		if err == nil {
			return nil
		}
		lastErr = err
		if errors.Is(err, errContended) && !f.gone.Load() {
			// A peer's decision on the backend, made first, arrived while the request was
			// held: nothing was sent; decide again with it in view. One flow control
			// placed is decided again among the replicas with room, else queued again.
			f.attempts--
			if f.qit != nil {
				if err := s.redispatch(f); err != nil {
					return err
				}
			}
			continue
		}
		if errors.Is(err, errBackendRemoved) && removed < maxRemovedRepicks {
			// A reload removed the picked backend between the snapshot and the dial: nothing
			// was sent, so pick again from the current backends without spending the retry.
			removed++
			f.attempts--
			f.cands = s.candidatesFor(f.cands, &f.k)
			continue
		}
		if !retryable(err) || f.gone.Load() {
			break
		}
		s.log.Debug("retrying on another backend", zap.String("backend", f.dec.Backend.Name), zap.Error(err))
		f.cands = without(f.cands, f.dec.Backend)
	}
	return lastErr
}

// fail answers a request that no backend took: the OpenAI error of err, or only the status
// when the client is gone; and finishes the flow.
func (s *Server) fail(ctx *fasthttp.RequestCtx, f *flow, err error) {
	if f.gone.Load() {
		err = f.goneErr()
	}
	status := statusOf(err)
	if status == StatusClientClosedRequest {
		ctx.SetConnectionClose()
		ctx.SetStatusCode(status)
	} else {
		writeError(ctx, status, err.Error())
	}
	if errors.Is(err, errLocalResource) {
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, retryAfterLocal)
	}
	var fr *flowRefusal
	if errors.As(err, &fr) && status != StatusClientClosedRequest {
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.Itoa(fr.retryAfter))
	}
	f.resp.SetStatusCode(status)
	f.finish(status, err)
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
		zap.Int64("predicted_prefill_tokens", f.dec.PrefillTokens),
		zap.Duration("predicted_ttft", f.dec.PredictedTTFT),
		zap.Duration("ttft", f.firstByte),
		zap.Duration("duration", time.Since(f.start)),
		zap.Int64("bytes", f.bytes),
		zap.Int("attempts", f.attempts),
		zap.Int64("queue_wait_ms", f.queueWait.Milliseconds()),
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
