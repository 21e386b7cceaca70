// Package health decides which backends take traffic and reads their load.
//
// It combines three signals per backend:
//
//   - active checks: GET Path every Interval; Rise consecutive passes mark a backend healthy,
//     Fall consecutive failures mark it unhealthy (HAProxy's rise 2 / fall 3);
//   - passive outlier ejection: the proxy reports the outcome of every attempt (Observe);
//     ConsecutiveFailures connect errors, timeouts or 5xx in a row eject the backend for
//     BaseEjection × n, capped at MaxEjection (Envoy outlier detection: 5, 30 s, 300 s);
//   - model-server metrics: GET MetricsPath every ScrapeInterval, parsed for the vLLM and
//     SGLang load gauges, the KV-cache capacity and the process start time.
//
// A backend is healthy when its active verdict is healthy (always, when active checks are
// Disabled) and it is not ejected. The Checker writes that with backend.SetHealthy; panic
// mode (route to all when fewer than half are healthy) stays in backend.Healthy.
//
// Whenever a backend turns healthy again, and whenever its process start time changes, the
// Checker bumps its cache epoch (backend.ResetCache): a replica that restarted or was away
// has probably lost its KV cache, and the prefix index must forget what it held.
//
// Timing runs on real tickers; every timestamp and every ejection deadline comes from the
// injected clock, and CheckOnce/ScrapeOnce let tests drive the Checker without waiting.
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

// Options configures a Checker. Zero values take the defaults of DefaultOptions, except
// ScrapeInterval, where 0 turns scraping off, and Disabled.
type Options struct {
	// Path is the active-check path: "/health" (vLLM and SGLang both serve it; 200 once the
	// model is loaded).
	Path string
	// Interval is the time between active checks of one backend (5 s). Timeout bounds one
	// check, connect to end of headers (2 s). HAProxy checks every 2 s; vLLM's /health is
	// cheap, 5 s keeps a hundred prefixlb replicas from adding up to a load.
	Interval, Timeout time.Duration
	// Rise is how many consecutive passes mark an unhealthy backend healthy again (2; a backend
	// that never passed needs one, as Envoy's first check at start-up); Fall how many consecutive
	// failures mark it unhealthy (3). HAProxy's defaults; sglang PR #9198 settled on the same
	// after single results flapped.
	Rise, Fall int
	// Disabled turns active checks off: backends are healthy unless passively ejected.
	Disabled bool
	// ConsecutiveFailures is how many connect errors, header timeouts or 5xx responses in a
	// row eject a backend (5, Envoy's consecutive_5xx). 4xx and 429 never count. Negative
	// turns passive ejection off.
	ConsecutiveFailures int
	// BaseEjection × n is how long the n-th ejection of a backend lasts (30 s, Envoy's
	// base_ejection_time), capped at MaxEjection (300 s, Envoy's max_ejection_time).
	BaseEjection, MaxEjection time.Duration
	// MaxEjectedPercent caps passive ejection: a backend is not ejected when that would leave
	// more than this percentage of backends ejected or unhealthy (50; Envoy's default is 10%
	// but it always allows one host, which with 2–4 LLM replicas is the same or more).
	MaxEjectedPercent int
	// ScrapeInterval is the time between scrapes of MetricsPath (1 s: vLLM's gauges move with
	// every engine step, and routing on 10 s old load piles onto a replica, as sglang-router's
	// 10 s poll does). 0 turns scraping off.
	ScrapeInterval time.Duration
	// MetricsPath is the Prometheus text endpoint of the model server ("/metrics").
	MetricsPath string
	// ScrapeStaleAfter is how old the last successful scrape may be before Load reports it
	// not fresh (5 s).
	ScrapeStaleAfter time.Duration
}

// Defaults of Options left at zero (DESIGN.md "Reliability defaults users expect"; the
// reasons are on the fields of Options).
const (
	// DefaultPath is the active-check path, served by vLLM and SGLang (200 once the model is loaded).
	DefaultPath = "/health"
	// DefaultInterval between active checks of one backend: 5 s.
	DefaultInterval = 5 * time.Second
	// DefaultTimeout bounds one active check or scrape, connect to end of headers: 2 s.
	DefaultTimeout = 2 * time.Second
	// DefaultRise is 2 consecutive passes to turn healthy again (HAProxy's rise).
	DefaultRise = 2
	// DefaultFall is 3 consecutive failures to turn unhealthy (HAProxy's fall).
	DefaultFall = 3
	// DefaultConsecutiveFailures is 5 counted failures in a row to eject (Envoy's consecutive_5xx).
	DefaultConsecutiveFailures = 5
	// DefaultBaseEjection is the first ejection's length, 30 s (Envoy's base_ejection_time).
	DefaultBaseEjection = 30 * time.Second
	// DefaultMaxEjection caps an ejection's length at 300 s (Envoy's max_ejection_time).
	DefaultMaxEjection = 300 * time.Second
	// DefaultMaxEjectedPercent: at most 50 % of the backends ejected or unhealthy.
	DefaultMaxEjectedPercent = 50
	// DefaultScrapeInterval between metrics scrapes of one backend: 1 s.
	DefaultScrapeInterval = time.Second
	// DefaultMetricsPath is the model server's Prometheus text endpoint.
	DefaultMetricsPath = "/metrics"
	// DefaultScrapeStaleAfter is how old a scrape may be before its load is not fresh: 5 s.
	DefaultScrapeStaleAfter = 5 * time.Second
)

// housekeepingEvery is how often ejection deadlines are looked at when nothing else happens.
const housekeepingEvery = time.Second

// DefaultOptions returns the defaults documented on Options.
func DefaultOptions() Options {
	return Options{
		Path:                DefaultPath,
		Interval:            DefaultInterval,
		Timeout:             DefaultTimeout,
		Rise:                DefaultRise,
		Fall:                DefaultFall,
		ConsecutiveFailures: DefaultConsecutiveFailures,
		BaseEjection:        DefaultBaseEjection,
		MaxEjection:         DefaultMaxEjection,
		MaxEjectedPercent:   DefaultMaxEjectedPercent,
		ScrapeInterval:      DefaultScrapeInterval,
		MetricsPath:         DefaultMetricsPath,
		ScrapeStaleAfter:    DefaultScrapeStaleAfter,
	}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.Path == "" {
		o.Path = d.Path
	}
	if o.Interval <= 0 {
		o.Interval = d.Interval
	}
	if o.Timeout <= 0 {
		o.Timeout = d.Timeout
	}
	if o.Rise <= 0 {
		o.Rise = d.Rise
	}
	if o.Fall <= 0 {
		o.Fall = d.Fall
	}
	if o.ConsecutiveFailures == 0 {
		o.ConsecutiveFailures = d.ConsecutiveFailures
	}
	if o.BaseEjection <= 0 {
		o.BaseEjection = d.BaseEjection
	}
	if o.MaxEjection <= 0 {
		o.MaxEjection = d.MaxEjection
	}
	if o.MaxEjection < o.BaseEjection {
		o.MaxEjection = o.BaseEjection
	}
	if o.MaxEjectedPercent <= 0 {
		o.MaxEjectedPercent = d.MaxEjectedPercent
	}
	if o.MaxEjectedPercent > 100 {
		o.MaxEjectedPercent = 100
	}
	if o.ScrapeInterval < 0 {
		o.ScrapeInterval = 0
	}
	if o.MetricsPath == "" {
		o.MetricsPath = d.MetricsPath
	}
	if o.ScrapeStaleAfter <= 0 {
		o.ScrapeStaleAfter = d.ScrapeStaleAfter
	}
	return o
}

// Checker runs active checks, passive ejection and metrics scraping for a set of backends.
// It is safe for concurrent use. Create it with New.
type Checker struct {
	kvHook atomic.Pointer[func(*backend.Backend)] // OnKVCapacity
	o      Options
	log    *zap.Logger
	now    func() time.Time
	client *http.Client
	tr     *http.Transport

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

	checkURL, metricsURL string

	removed    bool
	everPassed bool // has passed an active check at least once
	// Active checks.
	activeOK     bool // the active verdict (true when active checks are disabled)
	passes       int  // consecutive passes
	fails        int  // consecutive failures
	lastCheck    time.Time
	lastCheckErr string
	// Passive ejection.
	consec        atomic.Int32 // consecutive counted failures (lock-free for Observe)
	ejections     int          // ejections so far (decays, see eject)
	ejectedUntil  time.Time    // zero: not ejected
	lastReturn    time.Time    // when the last ejection ended
	capLogged     bool         // "not ejected: cap" logged for the current streak
	resetSinceScr bool         // the epoch was bumped since the last successful scrape
	// Scraping: written by the backend's scrape goroutine (or ScrapeOnce), read lock-free.
	scrape     atomic.Pointer[scrapeResult]
	scrapeMu   sync.Mutex // serialises scrapes of this backend
	scrapeFail bool       // guarded by scrapeMu: the last scrape failed (for logging changes)
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
	tr := &http.Transport{
		Proxy:               nil, // checks go straight to the replica, never through HTTP_PROXY
		DialContext:         (&net.Dialer{Timeout: o.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 2, // one for checks, one for scrapes
		IdleConnTimeout:     90 * time.Second,
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
		tr:     tr,
		client: &http.Client{Transport: tr, CheckRedirect: noRedirect},
		ctx:    ctx,
		cancel: cancel,
	}
	empty := map[*backend.Backend]*bstate{}
	c.states.Store(&empty)
	return c
}

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
}

// loop runs f at once and then every period until ctx is done.
func (c *Checker) loop(ctx context.Context, every time.Duration, f func(context.Context)) {
	defer c.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		c.safely(ctx, f)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
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

// CheckOnce runs one active check of every tracked backend, concurrently, records the
// results and then ends expired ejections. It returns when all checks are done or ctx ends.
// The loops Start runs do the same per backend on the Interval; tests and startup code may
// call it directly. It does nothing after Close and, when active checks are Disabled, only
// ends ejections.
func (c *Checker) CheckOnce(ctx context.Context) {
	if !c.o.Disabled {
		c.each(ctx, c.checkOne)
	}
	c.tick()
}

// ScrapeOnce scrapes every tracked backend's metrics once, concurrently, and returns when all
// scrapes are done or ctx ends. It scrapes even when ScrapeInterval is 0; not after Close.
func (c *Checker) ScrapeOnce(ctx context.Context) {
	c.each(ctx, c.scrapeOne)
}

func (c *Checker) each(ctx context.Context, f func(context.Context, *bstate)) {
	// Close cancels these too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)()
	if ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	sts := append([]*bstate(nil), c.order...)
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, st := range sts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx, st)
		}()
	}
	wg.Wait()
}

// get fetches url with the check Timeout. On success the caller must close the body.
func (c *Checker) get(ctx context.Context, url string) (*http.Response, context.CancelFunc, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	req.Header.Set("User-Agent", "prefixlb-health")
	resp, err := c.client.Do(req)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return resp, cancel, nil
}

// checkOne runs one active check of st and records it.
func (c *Checker) checkOne(ctx context.Context, st *bstate) {
	resp, cancel, err := c.get(ctx, st.checkURL)
	if err == nil {
		// Drain a little so the connection is reused; /health bodies are empty or tiny.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		cancel()
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			err = fmt.Errorf("GET %s: status %d", st.checkURL, resp.StatusCode)
		}
	}
	if ctx.Err() != nil {
		return // shutting down or removed: the failure says nothing about the backend
	}
	c.recordCheck(st, err)
}

// recordCheck applies one active-check result: Rise passes in a row turn the verdict
// healthy, Fall failures in a row unhealthy.
func (c *Checker) recordCheck(st *bstate, err error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.removed {
		return
	}
	st.lastCheck = now
	if err == nil {
		st.lastCheckErr = ""
		st.fails = 0
		if st.passes < 1<<30 {
			st.passes++
		}
		// A backend that never passed needs one pass (Envoy marks a host healthy on its first
		// pass at start-up): every start of prefixlb, or a new pod from discovery, would
		// otherwise route in panic mode for Interval × (Rise − 1). A backend that was up and
		// went down needs Rise passes.
		need := c.o.Rise
		if !st.everPassed {
			need = 1
		}
		if !st.activeOK && st.passes >= need {
			st.everPassed = true
			st.b.SetNeverPassed(false)
			st.activeOK = true
			if !c.applyLocked(st, "active checks passing") {
				c.log.Info("active checks passing, backend still ejected",
					zap.String("backend", st.b.Name), zap.Time("ejected_until", st.ejectedUntil))
			}
		}
		return
	}
	st.lastCheckErr = err.Error()
	st.passes = 0
	if st.fails < 1<<30 {
		st.fails++
	}
	if st.activeOK && st.fails >= c.o.Fall {
		st.activeOK = false
		c.applyLocked(st, "active checks failing")
	}
}

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
		st.resetSinceScr = true
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

// panicCheckLocked logs entering and leaving panic mode, computed as backend.Healthy does:
// over the backends that passed an active check at least once (all, when checks are
// disabled). A backend that never passed (not checked yet, or still loading its model) is
// neither routed to nor counted, so a scale-up or a start does not look like an outage.
func (c *Checker) panicCheckLocked() {
	n, healthy := 0, 0
	for _, st := range c.order {
		if !c.o.Disabled && !st.everPassed {
			continue
		}
		n++
		if st.healthyLocked() {
			healthy++
		}
	}
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

// State is a backend's health as shown by /debug/backends.
type State struct {
	Name string `json:"name"`
	// Healthy is the backend's flag as the proxy sees it (backend.Healthy).
	Healthy bool `json:"healthy"`
	// ActiveHealthy is the active-check verdict (true when active checks are disabled).
	ActiveHealthy bool `json:"active_healthy"`
	// NeverPassed is true until the backend's first passing active check: it takes no
	// traffic, not even in panic mode (backend.NeverPassed).
	NeverPassed bool `json:"never_passed"`
	// ConsecutivePasses and ConsecutiveFails count the latest run of active-check results.
	ConsecutivePasses int `json:"consecutive_passes"`
	ConsecutiveFails  int `json:"consecutive_fails"`
	// PassiveFailures counts consecutive failed attempts reported by Observe.
	PassiveFailures int `json:"passive_failures"`
	// Ejections is the ejection count that sets the length of the next ejection.
	Ejections int `json:"ejections"`
	// EjectedUntil is when the current ejection ends (zero: not ejected).
	EjectedUntil time.Time `json:"ejected_until,omitzero"`
	// LastCheck is when the last active check finished; LastCheckError its error, if any.
	LastCheck      time.Time `json:"last_check,omitzero"`
	LastCheckError string    `json:"last_check_error,omitempty"`
	// LastScrape is when the last scrape was attempted; LastScrapeError its error, if any.
	LastScrape      time.Time `json:"last_scrape,omitzero"`
	LastScrapeError string    `json:"last_scrape_error,omitempty"`
	// Load is the last successfully scraped load; LoadFresh as Checker.Load reports it.
	Load      Load `json:"load"`
	LoadFresh bool `json:"load_fresh"`
	// CacheEpoch is the backend's cache epoch (backend.Epoch).
	CacheEpoch uint64 `json:"cache_epoch"`
	// Tracked is false for a backend the Checker does not know; the other fields are then zero.
	Tracked bool `json:"tracked"`
}

// State returns b's health state for debugging.
func (c *Checker) State(b *backend.Backend) State {
	st := c.lookup(b)
	if st == nil {
		return State{Name: b.Name, Healthy: b.Healthy(), CacheEpoch: b.Epoch()}
	}
	s := State{Name: b.Name, Tracked: true, PassiveFailures: int(st.consec.Load())}
	c.mu.Lock()
	s.Healthy = b.Healthy()
	s.ActiveHealthy = st.activeOK
	s.NeverPassed = !c.o.Disabled && !st.everPassed
	s.ConsecutivePasses, s.ConsecutiveFails = st.passes, st.fails
	s.Ejections = st.ejections
	s.EjectedUntil = st.ejectedUntil
	s.LastCheck, s.LastCheckError = st.lastCheck, st.lastCheckErr
	c.mu.Unlock()
	s.CacheEpoch = b.Epoch()
	if r := st.scrape.Load(); r != nil {
		s.LastScrape, s.LastScrapeError = r.attempt, r.err
		s.Load = r.load
		s.LoadFresh = c.fresh(r)
	}
	return s
}
