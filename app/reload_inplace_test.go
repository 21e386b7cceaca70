package app

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// healthDelay is how long the backends below take to answer an active check: a new backend
// object (never passed a check) takes no traffic for at least this long.
const healthDelay = 300 * time.Millisecond

// slowHealthBackend answers completions at once and active checks (/health) after
// healthDelay, as a loaded model server does; it counts the completions.
func slowHealthBackend(t *testing.T, served *atomic.Int64) string {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			select {
			case <-time.After(healthDelay):
			case <-r.Context().Done():
			}
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// weightConf is a prefix-mode config with active checks on, and the backends urls with
// weight w and kv_cache_tokens kv.
func weightConf(w int, kv int64, urls ...string) string {
	s := "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nmode: prefix\n" +
		"health:\n  scrape_disabled: true\n  models_disabled: true\nbackends:\n"
	for _, u := range urls {
		s += fmt.Sprintf("  - url: %s\n    weight: %d\n    kv_cache_tokens: %d\n", u, w, kv)
	}
	return s
}

// Reloads that change only weight and kv_cache_tokens change the running backends in place:
// requests sent all along lose none (a replaced backend would take no traffic until its first
// check passed, and a request picked for it before the swap would fail), and the backends
// keep their objects, so their health, ejection state, index entries and learned rates.
func TestWeightOnlyReloadsLoseNoRequests(t *testing.T) {
	var served atomic.Int64
	urls := []string{slowHealthBackend(t, &served), slowHealthBackend(t, &served), slowHealthBackend(t, &served)}
	f := newReloadFile(t)
	f.write(weightConf(1, 100_000, urls...))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 10 * time.Millisecond})
	before := h.s.Backends()

	// The load: 4 clients, each sending its next request as the last one ends, until stopped
	// (at most maxRequests in all).
	const clients, maxRequests, maxFailures = 4, 200_000, 20
	var (
		sent     atomic.Int64
		mu       sync.Mutex
		failures []string
		failed   int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := testutil.Client()
			body := fmt.Sprintf(`{"model":"m","prompt":"client %d: %s"}`, i, strings.Repeat("the same long prefix ", 20))
			for sent.Add(1) <= maxRequests {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Post(h.base+"/v1/completions", "application/json", strings.NewReader(body))
				var why string
				if err != nil {
					why = err.Error()
				} else {
					msg, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						why = fmt.Sprintf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
					}
				}
				if why != "" {
					mu.Lock()
					if failed++; len(failures) < maxFailures {
						failures = append(failures, why)
					}
					mu.Unlock()
				}
			}
		}()
	}
	var stopOnce sync.Once
	stopLoad := func() {
		stopOnce.Do(func() { close(stop) })
		wg.Wait()
	}
	t.Cleanup(stopLoad) // before Run is stopped, also when the test fails early

	progress := func(what string) { // at least 2 × healthDelay of requests more
		t.Helper()
		from := served.Load()
		end := time.Now().Add(2 * healthDelay)
		testutil.Eventually(t, testutil.Timeout, what, func() bool { return served.Load() > from+20 && time.Now().After(end) })
	}
	progress("requests before the reloads")
	const reloads = 6
	weights := []int{3, 1000, 1, 250}
	kv := int64(100_000)
	for i := range reloads {
		w := weights[i%len(weights)]
		kv += 16_000
		f.write(weightConf(w, kv, urls...))
		testutil.Eventually(t, testutil.Timeout, fmt.Sprintf("reload %d logged", i+1), func() bool {
			return len(logs.WithMessage("config reloaded")) == i+1
		})
		progress(fmt.Sprintf("requests after reload %d", i+1))
	}
	stopLoad()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d requests served across %d weight-only reloads, %d failed", served.Load(), reloads, failed)
	for _, why := range failures {
		t.Errorf("request failed: %s", why)
	}
	after := h.s.Backends()
	if len(after) != len(before) {
		t.Fatalf("%d backends after the reloads, want %d", len(after), len(before))
	}
	lastW := weights[(reloads-1)%len(weights)]
	for i, b := range after {
		if b != before[i] {
			t.Errorf("%s was replaced by a new object: its health, index entries and learned rates are lost", b.Name)
		}
		if b.Weight() != lastW || b.KVCacheTokens() != kv {
			t.Errorf("%s: weight %d, kv_cache_tokens %d; want the last reload's %d, %d", b.Name, b.Weight(), b.KVCacheTokens(), lastW, kv)
		}
	}
}
