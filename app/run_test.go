package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/proxy"
)

// reloadFile is a config file that a test rewrites atomically (write + rename, as
// ConfigMap updates and editors do).
type reloadFile struct {
	t    *testing.T
	path string
}

func newReloadFile(t *testing.T) *reloadFile {
	return &reloadFile{t: t, path: filepath.Join(t.TempDir(), "prefixlb.yaml")}
}

func (f *reloadFile) write(body string) {
	f.t.Helper()
	if err := os.WriteFile(f.path+".tmp", []byte(body), 0o644); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(f.path+".tmp", f.path); err != nil {
		f.t.Fatal(err)
	}
}

func (f *reloadFile) load() (*configs.Config, error) {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, err
	}
	return configs.Parse(data)
}

// reloadConf is a valid round-robin config with active checks off and the given backends.
func reloadConf(urls ...string) string {
	s := "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nmode: round-robin\nhealth:\n  disabled: true\n  scrape_disabled: true\nbackends:\n"
	for _, u := range urls {
		s += "  - url: " + u + "\n"
	}
	return s
}

// badConf does not validate: its backend URL has no scheme.
const badConf = "backends:\n  - url: nope\n"

// badField is the field the rejection of badConf must name.
const badField = "backends[0].url"

// reloadRejected returns the rejections of a reload logged so far whose error names field.
func reloadRejected(logs *testutil.LogRecorder, trigger, field string) int {
	return logs.Count(func(e testutil.LogEntry) bool {
		return strings.Contains(e.Message, "reload rejected") && e.Fields["trigger"] == trigger &&
			strings.Contains(fmt.Sprint(e.Fields["error"]), field)
	})
}

// Backends are added and removed by rewriting the config file under load, without a failed
// request; a bad new config is rejected with an error naming the field and the old one keeps
// serving; a removed backend gets no request that started after its removal.
func TestConfigReloadUnderLoad(t *testing.T) {
	var urls [3]string
	for i := range urls {
		ts, _ := testutil.StatusBackend(t, 200, "ok")
		urls[i] = ts.URL
	}
	f := newReloadFile(t)
	f.write(reloadConf(urls[0], urls[1]))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 20 * time.Millisecond})
	s := h.s

	// The load: one client in a loop; each request numbered before it is sent.
	const maxFailures = 20
	var (
		seq      atomic.Int64
		mu       sync.Mutex
		failures []string
		servedBy = map[string][]int64{} // backend → numbers of the requests it answered
	)
	stop, loadDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(loadDone)
		c := testutil.Client()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := seq.Add(1)
			resp, err := c.Get(h.base + "/v1/models")
			mu.Lock()
			switch {
			case err != nil:
				if len(failures) < maxFailures {
					failures = append(failures, err.Error())
				}
			default:
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 && len(failures) < maxFailures {
					failures = append(failures, fmt.Sprint("status ", resp.StatusCode))
				}
				be := resp.Header.Get(proxy.HeaderBackend)
				servedBy[be] = append(servedBy[be], n)
			}
			mu.Unlock()
		}
	}()
	var stopOnce sync.Once
	stopLoad := func() {
		stopOnce.Do(func() { close(stop) })
		testutil.RecvWithin(t, loadDone, testutil.Timeout, "the load generator stops")
	}
	t.Cleanup(stopLoad) // before Run is stopped, also when the test fails early
	served := func(be string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(servedBy[be])
	}
	names := func() (out []string) {
		for _, b := range s.Backends() {
			out = append(out, b.Name)
		}
		return out
	}

	first := s.Backends()[0]
	f.write(reloadConf(urls[0], urls[1], urls[2]))
	testutil.Eventually(t, testutil.Timeout, "a third backend", func() bool { return len(s.Backends()) == 3 })
	if s.Backends()[0] != first {
		t.Error("an unchanged backend was replaced: its state (in-flight, index) would be lost")
	}
	testutil.Eventually(t, testutil.Timeout, "traffic on the new backend", func() bool { return served(urls[2]) > 0 })

	f.write(badConf)
	testutil.Eventually(t, testutil.Timeout, "the bad file's rejection, naming "+badField, func() bool { return reloadRejected(logs, "file changed", badField) > 0 })
	if got := names(); len(got) != 3 {
		t.Errorf("a bad config changed the backends: %v", got)
	}
	before := seq.Load()
	testutil.Eventually(t, testutil.Timeout, "requests served after the rejection", func() bool { return seq.Load() > before+10 })

	f.write(reloadConf(urls[2]))
	testutil.Eventually(t, testutil.Timeout, "removal of two backends", func() bool { return len(s.Backends()) == 1 })
	cut := seq.Load() // every request numbered above cut started after the removal
	testutil.Eventually(t, testutil.Timeout, "requests after the removal", func() bool { return seq.Load() > cut+20 })
	stopLoad()
	mu.Lock()
	defer mu.Unlock()
	for _, u := range urls[:2] {
		for _, n := range servedBy[u] {
			if n > cut {
				t.Errorf("removed backend %s answered request %d, which started after its removal (at %d)", u, n, cut)
			}
		}
	}
	for _, f := range failures {
		t.Errorf("request failed during reload: %s", f)
	}
	t.Logf("%d requests across three reloads", seq.Load())
}

// Run re-reads the config file on SIGHUP (the file is not watched here, so only the signal
// can trigger it); a file that does not validate is rejected on SIGHUP with an error naming
// the field, and the backends stay as they were.
func TestSIGHUPReloadsConfig(t *testing.T) {
	// While any channel is registered for SIGHUP, the signal does not terminate the process;
	// registering one here first makes signalling this test binary safe whether or not Run
	// has registered its own yet. Its Stop runs after Run's cleanup (cleanups run last first).
	own := make(chan os.Signal, 1)
	signal.Notify(own, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(own) })

	a, _ := testutil.StatusBackend(t, 200, "a")
	b, _ := testutil.StatusBackend(t, 200, "b")
	f := newReloadFile(t)
	f.write(reloadConf(a.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load}) // no Path: SIGHUP only
	// hup signals until cond holds: Run registers for SIGHUP just after it starts listening.
	hup := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(testutil.Timeout); !cond(); {
			if time.Now().After(end) {
				t.Fatalf("not within %v of SIGHUPs: %s", testutil.Timeout, what)
			}
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			testutil.Poll(100*time.Millisecond, 2*time.Millisecond, cond) // then the next SIGHUP
		}
	}

	f.write(reloadConf(a.URL, b.URL))
	// The reload logs after it swapped the backends in: wait for both.
	hup("the second backend added and the reload logged", func() bool {
		return len(h.s.Backends()) == 2 && len(logs.WithMessage("config reloaded")) > 0
	})
	for _, e := range logs.WithMessage("config reloaded") {
		if e.Fields["trigger"] != "SIGHUP" {
			t.Errorf("reload triggered by %v, want SIGHUP (the file is not watched)", e.Fields["trigger"])
		}
	}
	kept := h.s.Backends()

	f.write(badConf)
	hup("the bad file's rejection, naming "+badField, func() bool { return reloadRejected(logs, "SIGHUP", badField) > 0 })
	if got := h.s.Backends(); len(got) != 2 || got[0] != kept[0] || got[1] != kept[1] {
		t.Errorf("a rejected file changed the backends: %v", got)
	}
	resp, err := testutil.Client().Get(h.base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("after the rejected reload: status %d", resp.StatusCode)
	}
}

type staticResolver struct{ hosts atomic.Pointer[[]string] }

func (r *staticResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	return *r.hosts.Load(), nil
}

func (r *staticResolver) LookupSRV(ctx context.Context, _, _, name string) (string, []*net.SRV, error) {
	return "", nil, fmt.Errorf("no SRV for %s", name)
}

// DNS discovery adds the pods a headless Service resolves to, and follows changes: a new pod
// is added, a pod that left is removed; an answer with no pod at all (a Service momentarily
// without a ready pod) keeps the previous backends serving.
func TestDNSDiscoveryFeedsBackends(t *testing.T) {
	var hits atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.UserAgent() != "prefixlb-health" { // the checker's model-list reads are not requests routed here
			hits.Add(1)
		}
	}))
	defer ts.Close()
	_, port, _ := net.SplitHostPort(ts.Listener.Addr().String())
	cfg, err := configs.Parse([]byte("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nmode: least-load\n" +
		"health:\n  disabled: true\n  scrape_disabled: true\n" +
		"discovery:\n  dns:\n    name: vllm.test.svc\n    port: " + port + "\n    interval: 100ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := &staticResolver{}
	r.hosts.Store(&[]string{"127.0.0.1"})
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Resolver: r})
	s := h.s
	pod1, pod2 := "http://127.0.0.1:"+port, "http://127.0.0.2:"+port
	is := func(want ...string) func() bool {
		return func() bool {
			got := s.Backends()
			if len(got) != len(want) {
				return false
			}
			for i := range got {
				if got[i].Name != want[i] {
					return false
				}
			}
			return true
		}
	}
	c := testutil.Client()
	get := func() int {
		resp, err := c.Get(h.base + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testutil.Eventually(t, testutil.Timeout, "the resolved pod becomes a backend", is(pod1))
	if code := get(); code != 200 || hits.Load() != 1 {
		t.Errorf("request through a discovered backend: %d, hits %d", code, hits.Load())
	}
	r.hosts.Store(&[]string{"127.0.0.1", "127.0.0.2"})
	testutil.Eventually(t, testutil.Timeout, "a new pod is added", is(pod1, pod2))
	r.hosts.Store(&[]string{"127.0.0.1"})
	testutil.Eventually(t, testutil.Timeout, "a pod that left is removed", is(pod1))
	failed := func() int {
		return logs.Count(func(e testutil.LogEntry) bool { return strings.Contains(e.Message, "resolution failed") })
	}
	before := failed()
	r.hosts.Store(&[]string{})
	testutil.Eventually(t, testutil.Timeout, "an empty answer is reported", func() bool { return failed() > before })
	if !is(pod1)() {
		t.Errorf("an empty answer changed the backends: %v", s.Backends())
	}
	if code := get(); code != 200 {
		t.Errorf("after an empty answer: status %d, want 200 from the previous backend", code)
	}
}

// Run checks every backend once before it serves: a backend that never passed takes no
// traffic, so without that first round the requests of the first milliseconds after a start
// would find no backend.
func TestRunChecksBackendsBeforeServing(t *testing.T) {
	up, _ := testutil.StatusBackend(t, http.StatusOK, `{"choices":[{"text":"ok"}]}`)
	cfg, err := configs.Parse([]byte("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nhealth:\n  scrape_disabled: true\n" +
		"backends:\n  - url: " + up.URL + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	type ready struct {
		healthy bool
		data    string
	}
	readyc := make(chan ready, 1)
	startRun(t, cfg, nil, RunOptions{OnReady: func(s *proxy.Server, d, _ net.Addr) {
		readyc <- ready{healthy: s.Backends()[0].Healthy(), data: "http://" + d.String()}
	}})
	r := testutil.RecvWithin(t, readyc, testutil.Timeout, "Run calls OnReady")
	if !r.healthy {
		t.Fatal("serving before the backend's first check: the first requests would get 503")
	}
	if status := testutil.PostJSON(t, r.data+"/v1/completions", `{"model":"m","prompt":"x"}`); status != http.StatusOK {
		t.Fatalf("first request after start: %d", status)
	}
}
