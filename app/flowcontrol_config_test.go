package app

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// TestFlowControlFromConfig: the flow_control section and backends[].max_concurrency reach the
// proxy. With the only replica at its configured limit of 1, a second request waits in
// prefixlb's queue (the replica never sees two at once), classified by its API key's rule, and
// is dispatched when the first ends; a reload that turns flow control off forwards at once.
func TestFlowControlFromConfig(t *testing.T) {
	release := make(chan struct{})
	var running, most, seen atomic.Int64
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/v1/completions" { // the models list
			http.NotFound(w, r)
			return
		}
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if seen.Add(1) == 1 {
			<-release // the first request holds the replica's only slot
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	defer be.Close()
	sum := sha256.Sum256([]byte("tenant-key"))
	conf := func(enabled bool) string {
		s := reloadConf(be.URL) + "    max_concurrency: 1\n"
		if enabled {
			s += "flow_control:\n  enabled: true\n  rules:\n    - api_key_sha256: " + hex.EncodeToString(sum[:]) + "\n      priority: 3\n"
		}
		return s
	}
	f := newReloadFile(t)
	f.write(conf(true))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 20 * time.Millisecond})

	post := func(key string, done chan<- int) {
		req, _ := http.NewRequest("POST", h.base+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x"}`))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- -1
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}
	first, second := make(chan int, 1), make(chan int, 1)
	go post("", first)
	testutil.Eventually(t, testutil.Timeout, "the first request at the replica", func() bool { return running.Load() == 1 })
	go post("tenant-key", second)
	var queue string
	testutil.Eventually(t, testutil.Timeout, "the second request queued", func() bool {
		resp, err := testutil.Client().Get(h.admin + "/debug/queue")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		queue = string(b)
		return strings.Contains(queue, `"priority": 3,`) && strings.Contains(queue, `"flow": "key:`)
	})
	if strings.Contains(queue, "tenant-key") {
		t.Errorf("/debug/queue shows the API key: %s", queue)
	}
	if seen.Load() != 1 {
		t.Fatalf("the replica saw %d requests while at its limit of 1", seen.Load())
	}
	close(release)
	for _, c := range []chan int{first, second} {
		if st := <-c; st != 200 {
			t.Fatalf("status %d", st)
		}
	}
	if most.Load() != 1 {
		t.Errorf("the replica ran %d requests at once; its limit is 1", most.Load())
	}

	// Off by reload: both go at once, the replica takes them both.
	f.write(conf(false))
	testutil.Eventually(t, testutil.Timeout, "the reload", func() bool {
		return logs.Count(func(e testutil.LogEntry) bool { return e.Message == "config reloaded" }) > 0
	})
	seen.Store(10) // nobody holds the slot now
	a, b := make(chan int, 1), make(chan int, 1)
	go post("", a)
	go post("tenant-key", b)
	for _, c := range []chan int{a, b} {
		if st := <-c; st != 200 {
			t.Fatalf("after the reload: status %d", st)
		}
	}
}

// TestClassifierReportsIgnoredHeaders: the classifier prefixlb serve gives the proxy reports
// the headers it ignored, which the proxy counts (prefixlb_flow_ignored_headers_total).
func TestClassifierReportsIgnoredHeaders(t *testing.T) {
	cases := []struct {
		trusted bool
		header  http.Header
		prio    int
		want    flowcontrol.Ignored
	}{
		{false, http.Header{"X-Prefixlb-Priority": {"9"}}, 0, flowcontrol.IgnoredUntrusted},
		{true, http.Header{"X-Prefixlb-Priority": {"nine"}}, 0, flowcontrol.IgnoredBadPriority},
		{true, http.Header{"X-Prefixlb-Priority": {"9"}}, 9, 0},
		{false, http.Header{}, 0, 0},
	}
	for _, tc := range cases {
		o, err := flowControlOptions(&configs.FlowControl{Enabled: true, TrustedHeaders: tc.trusted})
		if err != nil {
			t.Fatal(err)
		}
		prio, _, ignored := o.Classifier.Classify("/v1/chat/completions", []byte("m"), tc.header)
		if prio != tc.prio || ignored != tc.want {
			t.Errorf("trusted %v, %v: priority %d, ignored %v; want %d, %v", tc.trusted, tc.header, prio, ignored, tc.prio, tc.want)
		}
	}
}
