package proxy

// Soak: streaming requests against simulated vLLM replicas through the proxy in prefix mode,
// with clients that cancel mid-stream and before the first byte. Afterwards nothing may be
// left behind: in-flight counts, engine requests, goroutines, heap.
//
// Default length 5 s; PREFIXLB_SOAK=2m (any Go duration) runs longer.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
)

// soakDuration is 5 s, or PREFIXLB_SOAK.
func soakDuration(t *testing.T) time.Duration {
	d := 5 * time.Second
	if v := os.Getenv("PREFIXLB_SOAK"); v != "" {
		p, err := time.ParseDuration(v)
		if err != nil || p <= 0 {
			t.Fatalf("PREFIXLB_SOAK=%q: want a positive Go duration such as 2m", v)
		}
		d = p
	}
	return d
}

// soakIdleUpstreams counts the proxy's pooled idle upstream connections: each is an open
// socket with one goroutine on the replica's side, legitimately kept after the load.
func soakIdleUpstreams(s *Server) int {
	n := 0
	for _, u := range *s.ups.Load() {
		u.mu.Lock()
		n += len(u.idle)
		u.mu.Unlock()
	}
	return n
}

// soakCounts is what the soak clients saw.
type soakCounts struct {
	sent, completed, cancelledMid, cancelledEarly, cancelledNonStream, failed, lost atomic.Int64
	mu                                                                              sync.Mutex
	errs                                                                            []string
}

func (c *soakCounts) fail(lost bool, format string, args ...any) {
	if lost {
		c.lost.Add(1)
	} else {
		c.failed.Add(1)
	}
	c.mu.Lock()
	if len(c.errs) < 20 {
		c.errs = append(c.errs, fmt.Sprintf(format, args...))
	}
	c.mu.Unlock()
}

func soakBody(rng *rand.Rand, stream bool) []byte {
	group := rng.IntN(6)
	var sb strings.Builder
	fmt.Fprintf(&sb, `{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"system","content":"`, sim.DefaultModel, stream, 32+rng.IntN(368))
	for i := 0; i < 150; i++ {
		fmt.Fprintf(&sb, "Tenant %d rule %d: answer precisely and cite the manual. ", group, i)
	}
	fmt.Fprintf(&sb, `"},{"role":"user","content":"question %d about topic %d"}]}`, rng.IntN(1000), rng.IntN(20))
	return []byte(sb.String())
}

// soakOne runs one request with the behaviour rng draws.
func soakOne(cl *http.Client, url string, rng *rand.Rand, c *soakCounts) {
	c.sent.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	action := rng.Float64()
	stream := action < 0.9
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", bytes.NewReader(soakBody(rng, stream)))
	req.Header.Set("Content-Type", "application/json")
	var cancelled atomic.Bool
	switch {
	case action >= 0.6 && action < 0.75: // cancel early, maybe before the first byte
		tm := time.AfterFunc(time.Duration(rng.IntN(3000))*time.Microsecond, func() { cancelled.Store(true); cancel() })
		defer tm.Stop()
	case action >= 0.9 && action < 0.97: // non-streaming: nothing comes before the end
		tm := time.AfterFunc(time.Duration(rng.IntN(20000))*time.Microsecond, func() { cancelled.Store(true); cancel() })
		defer tm.Stop()
	}
	midAfter := -1
	if action >= 0.75 && action < 0.9 {
		midAfter = 1 + rng.IntN(40) // cancel after this many events
	}
	resp, err := cl.Do(req)
	if err != nil {
		switch {
		case cancelled.Load() && !stream:
			c.cancelledNonStream.Add(1)
		case cancelled.Load():
			c.cancelledEarly.Add(1)
		case ctx.Err() != nil:
			c.fail(true, "no response within 60 s")
		default:
			c.fail(false, "no response: %v", err)
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		if cancelled.Load() {
			c.cancelledEarly.Add(1) // the client gave up before reading the answer
			return
		}
		b, _ := io.ReadAll(resp.Body)
		c.fail(false, "status %d: %.200s", resp.StatusCode, b)
		return
	}
	if !stream {
		b, err := io.ReadAll(resp.Body)
		switch {
		case err != nil && cancelled.Load():
			c.cancelledNonStream.Add(1)
		case err != nil:
			c.fail(ctx.Err() != nil, "non-stream body: %v", err)
		case !bytes.Contains(b, []byte(`"finish_reason"`)):
			c.fail(true, "non-stream body incomplete without an error: %.200s", b)
		default:
			c.completed.Add(1)
		}
		return
	}
	sr := newSSEReader(resp.Body)
	for {
		if _, ok := sr.next(); !ok {
			break
		}
		if sr.events == midAfter {
			cancelled.Store(true)
			cancel()
			c.cancelledMid.Add(1)
			return
		}
	}
	switch o := sr.outcome(); {
	case o == sseComplete:
		c.completed.Add(1)
	case cancelled.Load() && sr.events == 0:
		c.cancelledEarly.Add(1)
	case cancelled.Load():
		c.cancelledMid.Add(1)
	case o == sseUnterminated:
		c.fail(true, "stream ended cleanly without [DONE] after %d events", sr.events)
	default:
		c.fail(ctx.Err() != nil, "stream cut after %d events: %v", sr.events, sr.err)
	}
}

// Streaming load through the proxy in prefix mode against three simulated vLLM replicas, a
// third of the clients cancelling mid-stream or before the first byte. Every request not
// cancelled completes; afterwards in-flight is 0 everywhere, the replicas run nothing (the
// aborts reached their engines), goroutines are back to the baseline and the heap is bounded.
func TestSoakStreamingWithCancellations(t *testing.T) {
	dur := soakDuration(t)
	scfg := sim.DefaultConfig()
	scfg.Speedup = 10
	scfg.NumGPUBlocks = 4096 // 65k tokens: the cache churns
	cluster, bs := simBackends(t, scfg, 3)
	s, url := startProxy(t, "prefix", nil, func(o *Options) {
		checksOn(o)
		o.Health.Interval, o.Health.Timeout, o.Health.ScrapeInterval = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
		o.Backends = bs
	}, func(s *Server) {
		// fasthttp keeps idle workers for 10 s by default; reap them sooner so the goroutine
		// count can settle within the test's bounded wait.
		s.srv.MaxIdleWorkerDuration = 500 * time.Millisecond
	})
	for _, b := range s.Backends() {
		if _, ok := fltWaitHealthy(b, true, 10*time.Second); !ok {
			t.Fatalf("%s never healthy", b.Name)
		}
	}
	// The checker's and scraper's connections exist (and their goroutines) before the
	// baseline: a check and a scrape of every backend finished after the first ones did.
	settled := time.Now()
	eventually(t, 10*time.Second, "a check and a scrape of every backend after start-up", func() bool {
		for _, b := range s.Backends() {
			st := s.Health().State(b)
			if !st.LastCheck.After(settled) || !st.LastScrape.After(settled) {
				return false
			}
		}
		return true
	})
	g0 := runtime.NumGoroutine() - soakIdleUpstreams(s)

	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	cl := &http.Client{Transport: tr, Timeout: testTimeout}
	const clients = 8
	var counts, warm soakCounts
	run := func(d time.Duration, seed uint64, counts *soakCounts) {
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for i := 0; i < clients; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(i)))
				for n := 0; n < 1_000_000 && time.Now().Before(end); n++ {
					soakOne(cl, url, rng, counts)
				}
			}()
		}
		wg.Wait()
	}
	// Warm-up: pools, index, caches; then the heap baseline.
	run(500*time.Millisecond, 1, &warm)
	waitInFlightZero(t, s)
	if warm.failed.Load()+warm.lost.Load() != 0 {
		t.Fatalf("warm-up failed: %q", warm.errs)
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapAlloc

	seed := uint64(time.Now().UnixNano())
	t.Logf("soak %v, %d clients, seed %d", dur, clients, seed)
	start := time.Now()
	run(dur, seed, &counts)
	elapsed := time.Since(start)
	tr.CloseIdleConnections()

	waitInFlightZero(t, s)
	// The engines: nothing running or waiting once every stream ended or was aborted.
	var stats []sim.Stats
	eventually(t, 10*time.Second, "no replica runs or queues a request after the load: aborts reach the engines", func() bool {
		stats = stats[:0]
		busy := 0
		for _, r := range cluster.Replicas() {
			st := r.Stats()
			stats = append(stats, st)
			busy += st.Running + st.Waiting
		}
		return busy == 0
	})
	var finished, aborted uint64
	for _, st := range stats {
		finished += st.RequestsFinished
		aborted += st.RequestsAborted
	}
	for i, u := range cluster.URLs() {
		if v := soakGauge(t, u+"/metrics", "vllm:num_requests_running"); v != "0" {
			t.Errorf("replica %d reports vllm:num_requests_running %s", i, v)
		}
	}

	// Goroutines back to the baseline, less the replicas' side of pooled idle connections.
	const tolerance = 5
	var g int
	testutil.Poll(15*time.Second, 50*time.Millisecond, func() bool {
		g = runtime.NumGoroutine() - soakIdleUpstreams(s)
		return g <= g0+tolerance
	})
	if g > g0+tolerance {
		var buf bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
		t.Errorf("goroutines %d (not counting %d idle upstream connections), baseline %d: leak?\n%.6000s", g, soakIdleUpstreams(s), g0, buf.String())
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap1 := ms.HeapAlloc
	const heapBound = 64 << 20
	if heap1 > heap0+heapBound {
		t.Errorf("heap grew from %d to %d MiB during the soak (bound +%d MiB)", heap0>>20, heap1>>20, heapBound>>20)
	}

	var served uint64
	for _, b := range s.Backends() {
		served += b.Served()
	}
	var entries int64
	for _, st := range s.Policy().(*router.Prefix).Index().Stats(nil) {
		entries += st.Entries
	}
	cancelled := counts.cancelledMid.Load() + counts.cancelledEarly.Load() + counts.cancelledNonStream.Load()
	t.Logf("%d requests in %v (%.0f/s): %d completed, %d cancelled (%d mid-stream, %d before any event, %d non-stream), %d failed, %d lost; errors %q",
		counts.sent.Load(), elapsed.Round(time.Millisecond), float64(counts.sent.Load())/elapsed.Seconds(), counts.completed.Load(), cancelled,
		counts.cancelledMid.Load(), counts.cancelledEarly.Load(), counts.cancelledNonStream.Load(), counts.failed.Load(), counts.lost.Load(), counts.errs)
	t.Logf("proxy: %d dispatched, %d client disconnects seen, retries %d; engines: %d finished, %d aborted; index entries %d",
		served, s.m.clientGone.Get(), s.m.retries.Get(), finished, aborted, entries)
	var ejections []int
	for _, b := range s.Backends() {
		ejections = append(ejections, s.Health().State(b).Ejections)
	}
	// No backend failed: an ejection here, or a stream error, would be a client cancellation
	// counted against a backend (see TestFaultClientCancelsDoNotEjectBackend).
	t.Logf("ejections per backend %v; prefixlb_stream_errors_total %d", ejections, s.m.streamErrors.Get())
	for i, n := range ejections {
		if n != 0 {
			t.Errorf("backend %d ejected %d times during a soak where no backend failed", i, n)
		}
	}
	if n := s.m.streamErrors.Get(); n != 0 {
		t.Errorf("prefixlb_stream_errors_total = %d during a soak where no backend failed: client cancellations counted as stream errors", n)
	}
	t.Logf("goroutines %d -> %d (+%d idle upstream connections); heap %.1f -> %.1f MiB",
		g0, g, soakIdleUpstreams(s), float64(heap0)/(1<<20), float64(heap1)/(1<<20))
	t.Logf("fault-table | soak %v, %d clients, ~40%% cancel (mid-stream / before first byte) | sent %d | ok %d + cancelled by client %d | failed with error %d | lost %d | eject - | recover -",
		dur, clients, counts.sent.Load(), counts.completed.Load(), cancelled, counts.failed.Load(), counts.lost.Load())

	if counts.lost.Load() != 0 || counts.failed.Load() != 0 {
		t.Errorf("%d lost, %d failed requests that no one cancelled: %q", counts.lost.Load(), counts.failed.Load(), counts.errs)
	}
	if counts.completed.Load() == 0 || cancelled == 0 {
		t.Errorf("the soak did not exercise both paths: %d completed, %d cancelled", counts.completed.Load(), cancelled)
	}
	if aborted == 0 {
		t.Errorf("%d requests cancelled but no engine saw an abort", cancelled)
	}
}

// soakGauge returns the value of the first sample of metric in a Prometheus text page.
func soakGauge(t *testing.T, url, metric string) string {
	t.Helper()
	resp, err := testClient().Get(url)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return ""
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, metric+"{") || strings.HasPrefix(line, metric+" ") {
			return line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	return "missing"
}
