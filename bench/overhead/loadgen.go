package overhead

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/valyala/fasthttp"
)

// chatPath is the endpoint every request goes to.
const chatPath = "/v1/chat/completions"

// client sends requests to one target: one fasthttp HostClient per address (the direct
// target has one per backend and alternates between them, as a client-side round-robin).
type client struct {
	hcs  []*fasthttp.HostClient
	uris []string
	next atomic.Uint64
}

func newClient(addrs []string, maxConns int) *client {
	c := &client{}
	for _, a := range addrs {
		c.hcs = append(c.hcs, &fasthttp.HostClient{
			Addr:                          a,
			MaxConns:                      maxConns,
			MaxIdleConnDuration:           time.Minute,
			ReadTimeout:                   30 * time.Second,
			WriteTimeout:                  30 * time.Second,
			ReadBufferSize:                16 << 10,
			WriteBufferSize:               64 << 10,
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
		})
		c.uris = append(c.uris, "http://"+a+chatPath)
	}
	return c
}

func (c *client) close() {
	for _, hc := range c.hcs {
		hc.CloseIdleConnections()
	}
}

// Route reasons read from x-prefixlb-route, counted per request; anything else is "other".
var routeNames = []string{"match", "cold", "overload-fallback", "least-load", "round-robin", "parse-fallback", "passthrough"}

const routeOther = 7 // index of "other"; len(routeNames)

type routeCounts [routeOther + 1]int64

func (r *routeCounts) add(o *routeCounts) {
	for i := range r {
		r[i] += o[i]
	}
}

func (r *routeCounts) toMap() map[string]int64 {
	m := map[string]int64{}
	for i, n := range r {
		if n == 0 {
			continue
		}
		if i < len(routeNames) {
			m[routeNames[i]] = n
		} else {
			m["other"] = n
		}
	}
	return m
}

var errBadResponse = errors.New("bad response")

// sender is one load-generating goroutine's state: request, response and body buffer are
// reused, so the steady state allocates nothing.
type sender struct {
	c      *client
	wl     *Workload
	req    fasthttp.Request
	resp   fasthttp.Response
	buf    []byte
	routes routeCounts
}

func newSender(c *client, wl *Workload) *sender {
	s := &sender{c: c, wl: wl, buf: make([]byte, 0, wl.Size+4096)}
	s.req.Header.SetMethod(fasthttp.MethodPost)
	s.req.Header.SetContentType("application/json")
	return s
}

// do sends request number i and reads the whole response. It checks the status and that a
// streamed body ended with the [DONE] event.
func (s *sender) do(i uint64) error {
	var stream bool
	s.buf, stream = s.wl.Body(s.buf, i)
	k := int(s.c.next.Add(1) % uint64(len(s.c.hcs)))
	s.req.SetRequestURI(s.c.uris[k])
	s.req.SetBodyRaw(s.buf)
	s.resp.Reset()
	if err := s.c.hcs[k].Do(&s.req, &s.resp); err != nil {
		return err
	}
	body := s.resp.Body()
	if s.resp.StatusCode() != fasthttp.StatusOK || len(body) == 0 ||
		(stream && !bytes.HasSuffix(body, []byte("data: [DONE]\n\n"))) {
		return errBadResponse
	}
	h := s.resp.Header.Peek("X-Prefixlb-Route") // as fasthttp writes it
	if len(h) == 0 {
		h = s.resp.Header.Peek("x-prefixlb-route")
	}
	s.countRoute(h)
	return nil
}

func (s *sender) countRoute(h []byte) {
	if len(h) == 0 {
		return
	}
	if i := bytes.IndexByte(h, ';'); i >= 0 {
		h = h[:i]
	}
	for j, n := range routeNames {
		if string(h) == n {
			s.routes[j]++
			return
		}
	}
	s.routes[routeOther]++
}

// seq numbers requests across the whole run, so that every request has its own user turn.
var seq atomic.Uint64

// loadResult is one measured window against one target.
type loadResult struct {
	requests int64
	errors   int64
	seconds  float64
	cpu      cpuUse // CPU time spent in the window
	routes   routeCounts
	service  *hdrhistogram.Histogram // open loop: send → response read
	co       *hdrhistogram.Histogram // open loop: scheduled send → response read
	late     int64                   // open loop: sends that left more than 1 ms after schedule
	lastErr  error
}

// cpuMeter reads a process's CPU time; nil means no process to measure.
type cpuMeter func() (time.Duration, error)

// meters are the processes whose CPU a window accounts: the target's proxy and the backends
// (nil when they are not processes of their own); the harness always measures itself.
type meters struct{ proxy, backend cpuMeter }

// cpuUse is CPU time per process; the OK flags say whether both readings succeeded.
type cpuUse struct {
	proxy, backend, self time.Duration
	proxyOK, backendOK   bool
}

func readOne(m cpuMeter) (time.Duration, bool) {
	if m == nil {
		return 0, false
	}
	d, err := m()
	return d, err == nil
}

func (m meters) read() cpuUse {
	var u cpuUse
	u.proxy, u.proxyOK = readOne(m.proxy)
	u.backend, u.backendOK = readOne(m.backend)
	u.self, _ = procCPU(os.Getpid())
	return u
}

// since returns the CPU used from u0 to u.
func (u cpuUse) since(u0 cpuUse) cpuUse {
	return cpuUse{
		proxy: u.proxy - u0.proxy, backend: u.backend - u0.backend, self: u.self - u0.self,
		proxyOK: u.proxyOK && u0.proxyOK, backendOK: u.backendOK && u0.backendOK,
	}
}

// closedLoop runs conns senders back to back against c: warmup (not counted), then a
// measured window of dur. The requests/s of the window is the target's saturation throughput.
func closedLoop(c *client, wl *Workload, conns int, warmup, dur time.Duration, m meters) loadResult {
	var stop atomic.Bool
	type counter struct {
		ok, bad atomic.Int64
		_       [48]byte
	}
	counts := make([]counter, conns)
	senders := make([]*sender, conns)
	var errMu sync.Mutex
	var lastErr error
	var wg sync.WaitGroup
	for w := range conns {
		senders[w] = newSender(c, wl)
		wg.Add(1)
		go func(s *sender, ct *counter) {
			defer wg.Done()
			for !stop.Load() {
				if err := s.do(seq.Add(1)); err != nil {
					ct.bad.Add(1)
					errMu.Lock()
					lastErr = err
					errMu.Unlock()
					time.Sleep(time.Millisecond) // no hot error loop against a dead target
					continue
				}
				ct.ok.Add(1)
			}
		}(senders[w], &counts[w])
	}
	sum := func() (ok, bad int64) {
		for i := range counts {
			ok += counts[i].ok.Load()
			bad += counts[i].bad.Load()
		}
		return
	}
	time.Sleep(warmup)
	ok0, bad0 := sum()
	c0 := m.read()
	t0 := time.Now()
	time.Sleep(dur)
	ok1, bad1 := sum()
	c1 := m.read()
	el := time.Since(t0)
	stop.Store(true)
	wg.Wait()
	r := loadResult{requests: ok1 - ok0, errors: bad1 - bad0, seconds: el.Seconds(), cpu: c1.since(c0), lastErr: lastErr}
	for _, s := range senders {
		r.routes.add(&s.routes)
	}
	return r
}

// newHist records nanoseconds from 1 µs to 60 s at 3 significant digits.
func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1_000, 60_000_000_000, 3) }

// openLoopWorkers bounds the requests in flight in the open loop; when all are busy the
// dispatcher waits, and the wait shows in the co histogram and the late count.
const openLoopWorkers = 64

// openLoop sends at rate requests/s with exponential gaps (Poisson arrivals, fixed seed) for
// warmup + dur and records the latency of requests scheduled in the measured window: from
// the actual send (service) and from the scheduled send (co, free of coordinated omission).
func openLoop(c *client, wl *Workload, rate float64, warmup, dur time.Duration, seed uint64, m meters) loadResult {
	type job struct {
		sched    time.Time
		measured bool
	}
	jobs := make(chan job, openLoopWorkers)
	var mu sync.Mutex
	r := loadResult{service: newHist(), co: newHist()}
	var wg sync.WaitGroup
	for range openLoopWorkers {
		s := newSender(c, wl)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				t0 := time.Now()
				err := s.do(seq.Add(1))
				t1 := time.Now()
				if !j.measured {
					continue
				}
				mu.Lock()
				if err != nil {
					r.errors++
					r.lastErr = err
				} else {
					r.requests++
					_ = r.service.RecordValue(int64(t1.Sub(t0)))
					_ = r.co.RecordValue(int64(t1.Sub(j.sched)))
				}
				mu.Unlock()
			}
			mu.Lock()
			r.routes.add(&s.routes)
			mu.Unlock()
		}()
	}
	rng := rand.New(rand.NewPCG(seed, 0x6f70656e))
	start := time.Now()
	mstart := start.Add(warmup)
	end := mstart.Add(dur)
	var c0 cpuUse
	c0read := false
	at := start
	for {
		at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if at.After(end) {
			break
		}
		measured := !at.Before(mstart)
		if measured && !c0read {
			c0, c0read = m.read(), true
		}
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		if measured && time.Since(at) > time.Millisecond {
			r.late++
		}
		jobs <- job{sched: at, measured: measured}
	}
	close(jobs)
	wg.Wait()
	if c0read {
		r.cpu = m.read().since(c0)
	}
	r.seconds = dur.Seconds()
	return r
}

// quantileUs returns the q-th percentile (0..100) of h in microseconds.
func quantileUs(h *hdrhistogram.Histogram, q float64) float64 {
	if h == nil || h.TotalCount() == 0 {
		return math.NaN()
	}
	return float64(h.ValueAtQuantile(q)) / 1e3
}
