package health

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// limitServer is a model server whose /metrics answers as its mode says.
type limitServer struct {
	srv  *httptest.Server
	mode atomic.Pointer[string]
}

const runningLine = "vllm:num_requests_running 1\n"

func newLimitServer(t *testing.T) *limitServer {
	t.Helper()
	s := &limitServer{}
	s.set("good")
	head := "vllm:num_requests_running 5\nvllm:num_requests_waiting 0\n"
	comment := []byte("#" + strings.Repeat(" ", 1<<20-2) + "\n")
	exact := []byte(head + "#" + strings.Repeat(" ", maxMetricsBytes-len(head)-2) + "\n")
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != DefaultMetricsPath {
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		switch *s.mode.Load() {
		case "good":
			_, _ = fmt.Fprint(w, "vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n")
		case "exact": // exactly maxMetricsBytes: read whole, and counts
			_, _ = w.Write(exact)
		case "endless": // a sample, then comment lines, fast, until the reader leaves (bounded at 4× the cap)
			_, _ = fmt.Fprint(w, runningLine)
			for written := 0; written < 4*maxMetricsBytes; written += len(comment) {
				if _, err := w.Write(comment); err != nil {
					return
				}
			}
		case "trickle": // a sample every 10 ms, until the reader leaves (bounded at 10 s)
			fl := w.(http.Flusher)
			for range 1000 {
				if _, err := fmt.Fprint(w, runningLine); err != nil {
					return
				}
				fl.Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *limitServer) set(mode string) { s.mode.Store(&mode) }

// TestScrapeCutOrTimedOutDiscarded: a scrape whose body does not end within maxMetricsBytes,
// or within the check Timeout, is a failed scrape: its values (summed over what was read) are
// discarded, the last good load stays (not fresh), and the failure is counted. A body of
// exactly the cap still counts.
func TestScrapeCutOrTimedOutDiscarded(t *testing.T) {
	for _, tc := range []struct {
		mode, err string
		timeout   time.Duration
	}{
		{"endless", "longer than 16 MiB", 10 * time.Second}, // reading 16 MiB under -race on a loaded machine takes seconds
		{"trickle", "deadline exceeded", 300 * time.Millisecond},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			s := newLimitServer(t)
			b, err := backend.New(s.srv.URL, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			c, _, _ := newTestChecker(t, Options{Disabled: true, Timeout: tc.timeout})
			c.SetBackends([]*backend.Backend{b})
			c.scrapeAll(bg)
			if l, fresh := c.Load(b); !fresh || l.Running != 3 {
				t.Fatalf("good scrape: running %v fresh %v, want 3 true", l.Running, fresh)
			}
			s.set(tc.mode)
			c.scrapeAll(bg)
			l, fresh := c.Load(b)
			st := c.State(b)
			if fresh || l.Running != 3 || b.ScrapedExcess() != 0 {
				t.Errorf("running %v fresh %v scraped excess %d, want the last good 3, not fresh, no excess",
					l.Running, fresh, b.ScrapedExcess())
			}
			if st.ScrapeErrors != 1 || !strings.Contains(st.LastScrapeError, tc.err) {
				t.Errorf("%d scrape errors, last %q; want 1, %q", st.ScrapeErrors, st.LastScrapeError, tc.err)
			}
			if tc.mode != "endless" {
				return
			}
			s.set("exact")
			c.scrapeAll(bg)
			if l, fresh := c.Load(b); !fresh || l.Running != 5 {
				t.Errorf("a body of exactly %d bytes: running %v fresh %v, want 5 true (%s)", maxMetricsBytes, l.Running, fresh, c.State(b).LastScrapeError)
			}
		})
	}
}

// TestRestartWarningRateLimited: a start time that changes on every scrape resets the cache
// every time but warns at most once per restartWarnEvery, the next warning counting the
// restarts it did not log.
func TestRestartWarningRateLimited(t *testing.T) {
	srv := newFakeServer(t)
	b := srv.backend(t)
	c, clk, logs := newTestChecker(t, Options{Disabled: true})
	c.SetBackends([]*backend.Backend{b})
	start := 1.7e9
	scrape := func() {
		start++
		srv.setMetrics(fmt.Sprintf("vllm:num_requests_running 1\nprocess_start_time_seconds %.0f\n", start))
		c.scrapeAll(bg)
		clk.Add(time.Second)
	}
	scrape()
	scrape() // the first change seen
	e := b.Epoch()
	const restarts = 10
	for range restarts {
		scrape()
	}
	const msg = "backend restart detected; its cached prefixes are forgotten"
	if n := countLogs(logs, msg); n != 1 {
		t.Errorf("%d restart warnings over %d restarts a second apart, want 1", n, restarts+1)
	}
	if got := b.Epoch(); got != e+restarts {
		t.Errorf("epoch %d after %d more restarts, want %d: each one resets the cache", got, restarts, e+restarts)
	}
	clk.Add(restartWarnEvery)
	scrape()
	w := logs.WithMessage(msg)
	if len(w) != 2 || w[1].Fields["restarts_not_logged"] != int64(restarts) {
		t.Errorf("a period later: %d warnings, want 2, the second with restarts_not_logged=%d", len(w), restarts)
	}
}
