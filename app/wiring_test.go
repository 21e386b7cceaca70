package app

// The config reaches the code it configures: `serve` flags override the file, the health
// section becomes the Checker's options (rise and fall not swapped), and the prefix section
// sizes the index and sets the bounded-load cap.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// listening reports whether something accepts connections on addr.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// `prefixlb serve --config FILE` with --mode, --listen, --admin-listen, --log-level,
// --log-format and --backend: each flag wins over the file (the file's listeners stay
// unused, the flag's mode routes, the flag's log settings shape stderr), and --backend adds
// to the file's backends.
func TestServeFlagsOverrideFile(t *testing.T) {
	a, aHits := testutil.StatusBackend(t, 200, "a")
	// --backend's replica answers 500: its request lines are warnings, the lines --log-level
	// warn must keep (a 413 is the client's error, logged at info, and must not appear).
	b, bHits := testutil.StatusBackend(t, 500, "b")
	fileData, fileAdmin, flagData, flagAdmin := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	f := newReloadFile(t)
	f.write(fmt.Sprintf("listen: %s\nadmin_listen: %s\nmode: round-robin\nmax_request_body_bytes: 1024\n"+
		"log:\n  level: debug\n  format: console\ntimeouts:\n  shutdown_grace: 1s\n"+
		"health:\n  disabled: true\n  scrape_disabled: true\nbackends:\n  - url: %s\n", fileData, fileAdmin, a.URL))

	// The command logs to stderr: point stderr at a file while it runs (zap opens os.Stderr
	// when the logger is built, inside the command).
	stderr, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	realStderr := os.Stderr
	os.Stderr = stderr
	restored := false
	restore := func() {
		if !restored {
			os.Stderr, restored = realStderr, true
		}
	}
	defer restore()

	cmd := ServeCommand()
	cmd.SetArgs([]string{"--config", f.path, "--mode", "least-load", "--listen", flagData, "--admin-listen", flagAdmin,
		"--log-level", "warn", "--log-format", "json", "--backend", b.URL})
	cmd.SilenceUsage = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := testutil.RecvWithin(t, done, testutil.Timeout, "serve returns once its context is cancelled"); err != nil {
				t.Errorf("serve: %v", err)
			}
		}
	}
	defer stop()
	testutil.Eventually(t, testutil.Timeout, "serve listens on --listen and --admin-listen", func() bool {
		select {
		case err := <-done:
			stopped = true
			restore()
			t.Fatalf("serve ended: %v", err)
		default:
		}
		return listening(flagData) && listening(flagAdmin)
	})
	if listening(fileData) || listening(fileAdmin) {
		t.Errorf("the file's listeners %s / %s are open although --listen and --admin-listen were given", fileData, fileAdmin)
	}

	c := testutil.Client()
	const requests = 4
	for i := 0; i < requests; i++ {
		resp, err := c.Post("http://"+flagData+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if route := resp.Header.Get(proxy.HeaderRoute); !strings.HasPrefix(route, "least-load;") {
			t.Errorf("request %d routed %q: --mode least-load did not override the file's round-robin", i, route)
		}
	}
	if aHits.Load() == 0 || bHits.Load() == 0 || aHits.Load()+bHits.Load() != requests {
		t.Errorf("the file's backend got %d, --backend's %d of %d: want both used", aHits.Load(), bHits.Load(), requests)
	}
	// An info line that --log-level warn drops: a body over the file's max_request_body_bytes.
	resp, err := c.Post("http://"+flagData+"/v1/completions", "application/json", strings.NewReader(strings.Repeat("x", 2048)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Errorf("over the file's max_request_body_bytes: %d, want 413", resp.StatusCode)
	}
	mresp, err := c.Get("http://" + flagAdmin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(string(m), `mode="least-load"`) {
		t.Errorf("/metrics on --admin-listen does not show mode least-load")
	}
	stop()
	restore()

	out, err := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stderr of serve: %d bytes, %d lines", len(out), strings.Count(string(out), "\n"))
	warned := false
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		var e struct {
			Level, Msg string
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Errorf("stderr line is not JSON (--log-format json): %.200s", line)
			continue
		}
		if e.Level != "warn" && e.Level != "error" {
			t.Errorf("a %s line with --log-level warn: %.200s", e.Level, line)
		}
		warned = warned || e.Msg == "request"
	}
	if !warned {
		t.Errorf("no warning for the 500s on stderr: %.500s", out)
	}
}

// healthToggle answers /health with 200, or 500 while failing is set; other paths 200.
type healthToggle struct{ failing atomic.Bool }

func (h *healthToggle) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" && h.failing.Load() {
		w.WriteHeader(500)
	}
}

// The health section of the file becomes the Checker's options field by field, and the
// thresholds act as named: a backend turns unhealthy after unhealthy_threshold failed
// checks, not sooner, and healthy again after healthy_threshold passes, not sooner.
func TestHealthThresholdsFromConfig(t *testing.T) {
	const rise, fall = 3, 5
	hb := &healthToggle{}
	ts := httptest.NewServer(hb)
	defer ts.Close()
	cfg, err := configs.Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
mode: round-robin
health:
  path: /health
  interval: 100ms
  timeout: 100ms
  healthy_threshold: %d
  unhealthy_threshold: %d
  consecutive_failures: 7
  base_ejection: 11s
  max_ejection: 13s
  max_ejected_percent: 40
  scrape_disabled: true
  metrics_path: /custom-metrics
  scrape_stale_after: 17s
  models_interval: 19s
  models_path: /custom-models
backends:
  - url: %s
`, rise, fall, ts.URL)))
	if err != nil {
		t.Fatal(err)
	}
	s := startConfig(t, cfg)
	want := health.Options{Path: "/health", Interval: 100 * time.Millisecond, Timeout: 100 * time.Millisecond,
		Rise: rise, Fall: fall, ConsecutiveFailures: 7, BaseEjection: 11 * time.Second, MaxEjection: 13 * time.Second,
		MaxEjectedPercent: 40, ScrapeInterval: 0, MetricsPath: "/custom-metrics", ScrapeStaleAfter: 17 * time.Second,
		ModelsInterval: 19 * time.Second, ModelsPath: "/custom-models"}
	if got := s.Health().Options(); got != want {
		t.Errorf("checker options %+v, want the file's %+v", got, want)
	}

	b := s.Backends()[0]
	hc := s.Health()
	testutil.Eventually(t, testutil.Timeout, "the backend passes its first check", func() bool { return hc.State(b).ActiveHealthy })
	// transition polls b's active verdict until it is want, checking at every look that the
	// run of results behind the verdict is as long as the threshold says.
	transition := func(want bool, threshold int, run func(health.State) int, name string) {
		t.Helper()
		testutil.Eventually(t, testutil.Timeout, fmt.Sprintf("active verdict %v after %d %s", want, threshold, name), func() bool {
			st := hc.State(b)
			n := run(st)
			if st.ActiveHealthy == want {
				if n < threshold {
					t.Fatalf("active verdict %v after %d %s, want %d (%s)", want, n, name, threshold, map[bool]string{false: "unhealthy_threshold", true: "healthy_threshold"}[want])
				}
				return true
			}
			if n >= threshold {
				t.Fatalf("%d %s and the verdict is still %v, want a change at %d", n, name, !want, threshold)
			}
			return false
		})
	}
	hb.failing.Store(true)
	transition(false, fall, func(st health.State) int { return st.ConsecutiveFails }, "failed checks")
	hb.failing.Store(false)
	transition(true, rise, func(st health.State) int { return st.ConsecutivePasses }, "passed checks")
}

// holdBackend holds every request until release, counting those it holds.
type holdBackend struct {
	holding  atomic.Int32
	released chan struct{}
	once     sync.Once
}

func newHoldBackend() *holdBackend { return &holdBackend{released: make(chan struct{})} }

// release lets every held request, and every later one, finish.
func (h *holdBackend) release() { h.once.Do(func() { close(h.released) }) }

func (h *holdBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if r.URL.Path == "/v1/models" {
		http.NotFound(w, r) // the health checker's model-list read: no list, any model
		return
	}
	h.holding.Add(1)
	<-h.released
	_, _ = io.WriteString(w, `{"choices":[]}`)
}

// prefix.max_index_entries bounds the index over all backends (each of two backends gets
// half), and the index stays within it under traffic.
func TestMaxIndexEntriesFromConfig(t *testing.T) {
	const maxEntries = 10
	var urls []string
	for range 2 {
		ts, _ := testutil.StatusBackend(t, 200, `{"choices":[]}`)
		urls = append(urls, ts.URL)
	}
	cfg, err := configs.Parse([]byte(fmt.Sprintf("listen: 127.0.0.1:0\nmode: prefix\nprefix:\n  max_index_entries: %d\n"+
		"health:\n  disabled: true\n  scrape_disabled: true\nbackends:\n  - url: %s\n  - url: %s\n", maxEntries, urls[0], urls[1])))
	if err != nil {
		t.Fatal(err)
	}
	s := startConfig(t, cfg)
	url := s.URL()
	ix := s.Policy().(*router.Prefix).Index()
	for _, st := range ix.Stats(nil) {
		if st.Capacity != maxEntries/2 {
			t.Errorf("%s: index capacity %d entries, want %d (max_index_entries %d over 2 backends)", st.Name, st.Capacity, maxEntries/2, maxEntries)
		}
	}
	c := testutil.Client()
	for i := range 4 {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat(fmt.Sprintf("conversation %d says ", i), 200))
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	testutil.WaitInFlightZero(t, s.Backends)
	if n := ix.Entries(); n == 0 || n > maxEntries {
		t.Errorf("index holds %d entries, want 1..%d", n, maxEntries)
	}
	var evicted uint64
	for _, st := range ix.Stats(nil) {
		evicted += st.Evictions
	}
	if evicted == 0 {
		t.Errorf("prompts of ~40 chunks each left no eviction with max_index_entries %d", maxEntries)
	}
}

// prefix.load_factor and prefix.load_margin set the bounded-load cap ceil(c·(in-flight+1)/n)
// + margin. With c = 1 and margin 1 on two backends, the backend holding a prompt takes 3
// concurrent copies of it (cap 2, 2, 3 at 0, 1, 2 in flight) and the 4th (cap 3 at 3 in
// flight) overflows to the other backend. With the defaults (1.25, 2), or either one of them,
// the holder would take the 4th too. A load_margin of 0 written in the file means no margin
// (it was read as "unset", the default 2): the holder then takes 1 copy and the 2nd overflows.
func TestLoadCapFromConfig(t *testing.T) {
	// load_factor 1 on two backends: cap = ceil((in-flight + 1) / 2) + margin. With margin 1
	// the holder takes 3 copies of one prompt; with margin 0 (written in the file: no margin,
	// not the default 2) it takes 1 and the 2nd overflows.
	for _, tc := range []struct{ margin, fits int }{{1, 3}, {0, 1}} {
		t.Run(fmt.Sprintf("load_margin=%d", tc.margin), func(t *testing.T) {
			margin, fits := tc.margin, tc.fits
			var hbs [2]*holdBackend
			var urls []string
			for i := range hbs {
				hbs[i] = newHoldBackend()
				ts := httptest.NewServer(hbs[i])
				defer ts.Close()
				defer hbs[i].release() // before ts.Close, which waits for the handlers
				urls = append(urls, ts.URL)
			}
			// hard_load_factor 1: the cap alone, so that the cost model (the holder's queue
			// drains while its copies are held; backend.QueuedPrefill) does not take a copy
			// over the cap under the hard cap.
			cfg, err := configs.Parse([]byte(fmt.Sprintf("listen: 127.0.0.1:0\nmode: prefix\nprefix:\n  load_factor: 1\n  hard_load_factor: 1\n  load_margin: %d\n"+
				"health:\n  disabled: true\n  scrape_disabled: true\nbackends:\n  - url: %s\n  - url: %s\n", margin, urls[0], urls[1])))
			if err != nil {
				t.Fatal(err)
			}
			sv := startConfig(t, cfg)
			url := sv.URL()
			ix := sv.Policy().(*router.Prefix).Index()
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat("one shared prompt ", 200))
			var k key.Key
			key.NewBuilder(0).Build([]byte("/v1/chat/completions"), []byte(body), &k)
			if len(k.Chunks) == 0 {
				t.Fatal("the prompt has no chunks")
			}
			c := testutil.Client()
			routes := make(chan string, fits+1)
			held := func() (int32, int32) { return hbs[0].holding.Load(), hbs[1].holding.Load() }
			for i := 1; i <= fits+1; i++ {
				go func() {
					resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						routes <- "error: " + err.Error()
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					routes <- resp.Header.Get(proxy.HeaderRoute)
				}()
				testutil.Eventually(t, testutil.Timeout, fmt.Sprintf("%d requests held in the backends", i), func() bool { h0, h1 := held(); return h0+h1 == int32(i) })
				// The proxy learns a prompt right after writing it, which may be after the
				// backend's handler already holds it, and a Record inserts the deepest chunk
				// first: the next copy must find every chunk learned.
				testutil.Eventually(t, testutil.Timeout, "the first copy learned", func() bool { return ix.Entries() >= int64(len(k.Chunks)) })
			}
			h0, h1 := held()
			if f := int32(fits); !(h0 == f && h1 == 1 || h0 == 1 && h1 == f) {
				t.Errorf("%d concurrent copies of one prompt held %d and %d by the backends, want %d on the holder and the last on the other (load_factor 1, load_margin %d)", fits+1, h0, h1, fits, margin)
			}
			hbs[0].release()
			hbs[1].release()
			var got []string
			for range fits + 1 {
				r := testutil.RecvWithin(t, routes, testutil.Timeout, "a held request returns")
				got = append(got, strings.SplitN(r, ";", 2)[0])
			}
			count := map[string]int{}
			for _, r := range got {
				count[r]++
			}
			if count["cold"] != 1 || count["match"] != fits-1 || count["overload-fallback"] != 1 {
				t.Errorf("routes %v, want one cold, %d match and one overload-fallback", got, fits-1)
			}
		})
	}
}
