// Package health decides which backends take traffic and reads their load, KV cache and
// models.
//
// It gathers these signals per backend, each written to the backend.Backend it concerns:
//
//   - active checks (active.go): GET Path every Interval; Rise consecutive passes mark a
//     backend healthy, Fall consecutive failures mark it unhealthy (HAProxy's rise 2 / fall 3);
//     the first pass clears backend.NeverPassed;
//   - passive outlier ejection (passive.go): the proxy reports the outcome of every attempt
//     (Observe); ConsecutiveFailures connect errors, timeouts or 5xx in a row eject the
//     backend for BaseEjection × n, capped at MaxEjection (Envoy outlier detection: 5, 30 s,
//     300 s);
//   - load (scrape.go, as every scraped signal below): GET MetricsPath every ScrapeInterval,
//     parsed for the vLLM and SGLang gauges (Load, also read by Checker.Load); requests
//     running and waiting in the engine (backend.SetScrapedLoad, with the in-flight count
//     the proxy and its peers held as the scrape started);
//   - KV-cache usage, the fraction of the KV cache in use (backend.SetScrapedKVUsage);
//   - KV-cache capacity, blocks × block size in tokens (backend.SetScrapedKVCacheTokens;
//     OnKVCapacity tells the prefix index when it first appears or changes);
//   - restarts: process_start_time_seconds changing or, without it, the prompt-token
//     counter going back (the cache epoch, below);
//   - other senders (senders.go): the replica's finished-request count against the
//     requests this proxy finished there says whether someone else sends to it
//     (backend.SetOtherSenders: shared, alone or unknown);
//   - the served models (models.go): GET ModelsPath every ModelsInterval, after a return to
//     healthy and after a detected restart, stored on the backend for per-model routing
//     (backend.SetDiscoveredModels; OnModels tells the proxy's model pools).
//
// A failed scrape falls back to the proxy's own in-flight count (load and KV usage 0) and,
// once the last good scrape is stale (ScrapeStaleAfter), to an unknown senders verdict.
//
// A backend is healthy when its active verdict is healthy (always, when active checks are
// Disabled) and it is not ejected. The Checker writes that with backend.SetHealthy; panic
// mode (route to all when fewer than half are healthy) stays in backend.Healthy.
//
// Whenever a backend turns healthy again, and whenever a scrape finds it restarted, the
// Checker bumps its cache epoch (backend.ResetCache): a replica that restarted or was away
// has probably lost its KV cache, and the prefix index must forget what it held.
//
// Timing runs on real tickers; every timestamp and every ejection deadline comes from the
// injected clock, and CheckOnce lets callers drive the active checks without waiting.
package health

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
)

// housekeepingEvery is how often ejection deadlines are looked at when nothing else happens.
const housekeepingEvery = time.Second

// Checker runs active checks, passive ejection and metrics scraping for a set of backends.
// It is safe for concurrent use. Create it with New.
type Checker struct {
	kvHook     atomic.Pointer[func(*backend.Backend)] // OnKVCapacity
	modelsHook atomic.Pointer[func(*backend.Backend)] // OnModels
	o          Options
	log        *zap.Logger
	now        func() time.Time
	client     *http.Client
	tr         *http.Transport

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// states is replaced whole by SetBackends, so Observe and Load look up without locking.
	states atomic.Pointer[map[*backend.Backend]*bstate]

	mu        sync.Mutex // guards everything below and the health fields of every bstate
	order     []*bstate  // tracked backends, in SetBackends order
	started   bool
	closed    bool
	panicMode bool
	closeOnce sync.Once
}

// bstate is the health-specific state of one backend. Fields without a comment are guarded
// by Checker.mu.
type bstate struct {
	b      *backend.Backend
	ctx    context.Context // cancelled when the backend is removed or the Checker closes
	cancel context.CancelFunc

	checkURL, metricsURL, modelsURL string
	// modelsKick asks the backend's model reader for a read now (models.go); buffered 1.
	modelsKick chan struct{}
	// modelsAsked is when the latest model-list read began (Unix nanoseconds on the
	// Checker's clock; 0: none yet): written by the model reader, read by the scrape, which
	// compares it with the start time of a process it sees for the first time (scrape.go).
	modelsAsked atomic.Int64
	// modelsCapped: a list over backend.MaxModels was warned about (models.go; the model
	// reader's goroutine only).
	modelsCapped bool
	// longIDs limits the warning about over-long model ids (models.go; the model reader's
	// goroutine only).
	longIDs logLimit

	removed    bool
	everPassed bool // has passed an active check at least once
	// Active checks.
	activeOK     bool // the active verdict (true when active checks are disabled)
	passes       int  // consecutive passes
	fails        int  // consecutive failures
	lastCheck    time.Time
	lastCheckErr string
	// Passive ejection.
	passiveFails     atomic.Int32 // consecutive counted failures (lock-free for Observe)
	ejections        int          // ejections so far (decays, see eject)
	ejectedUntil     time.Time    // zero: not ejected
	lastReturn       time.Time    // when the last ejection ended
	capLogged        bool         // "not ejected: cap" logged for the current streak
	resetSinceScrape bool         // the epoch was bumped since the last successful scrape
	// Scraping: written by the backend's scrape goroutine (or a test's scrapeAll), read lock-free.
	scrape     atomic.Pointer[scrapeResult]
	scrapeMu   sync.Mutex   // serialises scrapes of this backend
	scrapeFail bool         // guarded by scrapeMu: the last scrape failed (for logging changes)
	senders    sendersJudge // guarded by scrapeMu: who else sends to the backend
	// scrapeErrors counts the failed scrapes (State.ScrapeErrors).
	scrapeErrors atomic.Uint64
	// restartLog limits the restart warning (scrape.go; guarded by Checker.mu).
	restartLog logLimit
}

func (st *bstate) healthyLocked() bool { return st.activeOK && st.ejectedUntil.IsZero() }

// New returns a Checker; it checks nothing until SetBackends and Start. log may be nil
// (no logging); clock may be nil (time.Now). The clock stamps checks and scrapes and times
// ejections; the check and scrape intervals run on real tickers.
func New(o Options, log *zap.Logger, clock func() time.Time) *Checker {
	if log == nil {
		log = zap.NewNop()
	}
	if clock == nil {
		clock = time.Now
	}
	o = o.withDefaults()
	transport := &http.Transport{
		Proxy:               nil, // checks go straight to the replica, never through HTTP_PROXY
		DialContext:         (&net.Dialer{Timeout: o.Timeout, KeepAlive: dialKeepAlive}).DialContext,
		MaxIdleConnsPerHost: idleConnsPerBackend,
		IdleConnTimeout:     idleConnTimeout,
		// Metrics text compresses well, but on a cluster network decompressing every second
		// costs more CPU than the bytes are worth.
		DisableCompression:    true,
		ResponseHeaderTimeout: o.Timeout,
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Checker{
		o:      o,
		log:    log.Named("health"),
		now:    clock,
		tr:     transport,
		client: &http.Client{Transport: transport, CheckRedirect: noRedirect},
		ctx:    ctx,
		cancel: cancel,
	}
	empty := map[*backend.Backend]*bstate{}
	c.states.Store(&empty)
	return c
}

// The checker's connections to the replicas.
const (
	// dialKeepAlive is the TCP keep-alive period of a connection, as net/http's default
	// transport.
	dialKeepAlive = 30 * time.Second
	// idleConnsPerBackend: one connection for active checks, one for scrapes.
	idleConnsPerBackend = 2
	// idleConnTimeout closes a connection unused this long, as net/http's default transport;
	// checks and scrapes every few seconds keep theirs open.
	idleConnTimeout = 90 * time.Second
	// userAgent names the checker in the replicas' access logs.
	userAgent = "prefixlb-health"
	// drainBytes is how much of a body that nobody reads is drained, so that the connection
	// is reused: /health bodies and error pages are empty or tiny.
	drainBytes = 64 << 10
)

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Options returns the options in effect (defaults applied).
func (c *Checker) Options() Options { return c.o }

// SetBackends makes bs the tracked backends. New ones are marked unhealthy until they pass
// Rise active checks (healthy at once when active checks are Disabled) and, once Start was
// called, checked and scraped from now on; backends no longer in bs stop being checked and
// lose their health state. Backends present before keep theirs.
func (c *Checker) SetBackends(bs []*backend.Backend) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.states.Load()
	next := make(map[*backend.Backend]*bstate, len(bs))
	order := make([]*bstate, 0, len(bs))
	for _, b := range bs {
		if b == nil || next[b] != nil {
			continue
		}
		st := old[b]
		if st == nil {
			st = c.newState(b)
			if !c.closed && c.started {
				c.startLocked(st)
			}
		}
		next[b] = st
		order = append(order, st)
	}
	for b, st := range old {
		if next[b] == nil {
			st.removed = true
			st.cancel()
		}
	}
	c.order = order
	c.states.Store(&next)
	c.panicCheckLocked()
}

func (c *Checker) newState(b *backend.Backend) *bstate {
	ctx, cancel := context.WithCancel(c.ctx)
	base := b.Scheme + "://" + b.Addr
	st := &bstate{
		b:          b,
		ctx:        ctx,
		cancel:     cancel,
		checkURL:   base + c.o.Path,
		metricsURL: base + c.o.MetricsPath,
		modelsURL:  base + c.o.ModelsPath,
		modelsKick: make(chan struct{}, 1),
		activeOK:   c.o.Disabled,
	}
	// A backend that has never passed a check takes no traffic, not even in panic mode.
	b.SetHealthy(c.o.Disabled)
	b.SetNeverPassed(!c.o.Disabled)
	return st
}

func (c *Checker) lookup(b *backend.Backend) *bstate { return (*c.states.Load())[b] }

// Start begins checking and scraping every tracked backend (and those SetBackends adds
// later): one goroutine per backend for active checks (none when Disabled), one per backend
// for scrapes (none when ScrapeInterval is 0) and one for ejection deadlines. The first check
// and scrape of a backend run at once. Start after Close does nothing.
func (c *Checker) Start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.closed {
		return
	}
	c.started = true
	for _, st := range c.order {
		c.startLocked(st)
	}
	if c.o.ConsecutiveFailures > 0 {
		c.wg.Add(1)
		go c.loop(c.ctx, housekeepingEvery, func(context.Context) { c.tick() })
	}
}

func (c *Checker) startLocked(st *bstate) {
	if !c.o.Disabled {
		c.wg.Add(1)
		go c.loop(st.ctx, c.o.Interval, func(ctx context.Context) { c.checkOne(ctx, st) })
	}
	if c.o.ScrapeInterval > 0 {
		c.wg.Add(1)
		go c.loop(st.ctx, c.o.ScrapeInterval, func(ctx context.Context) { c.scrapeOne(ctx, st) })
	}
	c.startModelsLocked(st)
}

// loop runs f at once and then every period until ctx is done.
func (c *Checker) loop(ctx context.Context, every time.Duration, f func(context.Context)) {
	defer c.wg.Done()
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		c.safely(ctx, f)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// safely runs f, logging instead of crashing the process if it panics.
func (c *Checker) safely(ctx context.Context, f func(context.Context)) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("health: panic in background check", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	if ctx.Err() == nil {
		f(ctx)
	}
}

// Close stops every check and scrape, waits for their goroutines and closes idle
// connections. The backends keep their last health state. Safe to call more than once.
func (c *Checker) Close() {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.cancel()
		c.wg.Wait()
		c.tr.CloseIdleConnections()
	})
}

func (c *Checker) each(ctx context.Context, f func(context.Context, *bstate)) {
	// Close cancels these too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)()
	// AfterFunc cancels in a goroutine of its own when c.ctx is already done: after Close,
	// ctx may not be cancelled yet here, so c.ctx is asked too.
	if ctx.Err() != nil || c.ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	tracked := append([]*bstate(nil), c.order...)
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, st := range tracked {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx, st)
		}()
	}
	wg.Wait()
}

// get fetches url with the check Timeout and, when the response is a 2xx, hands its body
// to read (nil: the body is drained and dropped). Any other status is an error naming it.
// The response and its timeout are released before get returns.
func (c *Checker) get(ctx context.Context, url string, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < http.StatusOK || resp.StatusCode >= http.StatusMultipleChoices {
		drain(resp.Body)
		return &statusError{url: url, status: resp.StatusCode}
	}
	if read == nil {
		drain(resp.Body)
		return nil
	}
	return read(resp.Body)
}

// statusError is get's error for a response that is not a 2xx.
type statusError struct {
	url    string
	status int
}

func (e *statusError) Error() string { return fmt.Sprintf("GET %s: status %d", e.url, e.status) }

// drain reads and drops up to drainBytes of body, so that its connection can be reused.
func drain(body io.Reader) { _, _ = io.Copy(io.Discard, io.LimitReader(body, drainBytes)) }

// applyLocked writes st's combined verdict to the backend. On a change it logs one line
// (reason and extra fields included); on a return to healthy it also bumps the cache epoch.
// It reports whether the state changed.
func (c *Checker) applyLocked(st *bstate, reason string, extra ...zap.Field) bool {
	want := st.healthyLocked()
	if !st.b.SetHealthy(want) {
		return false
	}
	if want {
		// Away long enough to be marked down: its KV cache is probably gone (restart, OOM,
		// reschedule), so the prefix index must not route on what it held. A new backend's
		// first pass bumps it too, which costs nothing: nothing was recorded for it yet.
		st.b.ResetCache()
		st.resetSinceScrape = true
		st.kickModels() // back from unhealthy: it may have restarted with other models
		c.log.Info("backend healthy", append([]zap.Field{zap.String("backend", st.b.Name),
			zap.String("reason", reason), zap.Uint64("cache_epoch", st.b.Epoch())}, extra...)...)
	} else {
		fields := append([]zap.Field{zap.String("backend", st.b.Name), zap.String("reason", reason)}, extra...)
		if st.lastCheckErr != "" && !st.activeOK {
			fields = append(fields, zap.String("last_error", st.lastCheckErr))
		}
		c.log.Warn("backend unhealthy", fields...)
	}
	c.panicCheckLocked()
	return true
}

// tallyLocked counts the backends that panic mode counts, those that passed an active check
// at least once (all of them when checks are disabled), and also even if it never passed
// (nil: none), and returns how many it counted and how many of those, also excepted, are
// healthy.
func (c *Checker) tallyLocked(also *bstate) (counted, healthy int) {
	for _, st := range c.order {
		if !c.o.Disabled && !st.everPassed && st != also {
			continue
		}
		counted++
		if st != also && st.healthyLocked() {
			healthy++
		}
	}
	return counted, healthy
}

// panicCheckLocked logs entering and leaving panic mode, computed as backend.Healthy does:
// over the backends that passed an active check at least once (all, when checks are
// disabled). A backend that never passed (not checked yet, or still loading its model) is
// neither routed to nor counted, so a scale-up or a start does not look like an outage.
func (c *Checker) panicCheckLocked() {
	n, healthy := c.tallyLocked(nil)
	p := n > 0 && 2*healthy < n
	if p == c.panicMode {
		return
	}
	c.panicMode = p
	if p {
		c.log.Warn("fewer than half the backends are healthy: routing to all of them (panic mode)",
			zap.Int("healthy", healthy), zap.Int("backends", n))
	} else {
		c.log.Info("half or more of the backends are healthy again: leaving panic mode",
			zap.Int("healthy", healthy), zap.Int("backends", n))
	}
}
