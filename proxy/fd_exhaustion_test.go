package proxy

// Running out of file descriptors is prefixlb's condition, never a backend's. A prefixlb in a
// child process (this test binary run again) lowers its own RLIMIT_NOFILE to fdChildLimit and
// serves two healthy streaming backends in this process; more concurrent streams than it has
// descriptors arrive over real sockets on 127.0.0.1. No backend may be blamed (passive
// failures, ejections, 502s), the clients over the limit get 503 with Retry-After and an
// OpenAI-shaped error naming the cause, the admin port answers /metrics and /debug/backends
// meanwhile, and the condition is one counter and a rate-limited log line (no "http: Accept
// error" once a second).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const (
	// fdChildEnv carries the child's backends; unset, TestFDExhaustionChild skips.
	fdChildEnv = "PREFIXLB_TEST_FD_CHILD"
	// fdChildLimit is the child's RLIMIT_NOFILE, soft and hard (Go raises a soft limit to
	// the hard one at start, so both are lowered).
	fdChildLimit = 256
	// fdStreams is how many concurrent streams the test opens with the budget: more than
	// the child has descriptors, each stream needing two.
	fdStreams = 400
	// fdStreamsEMFILE is how many it opens without: more than the child can serve, few enough
	// that every one is accepted, and answered, within the bound (each that is answered 503
	// hands its descriptor to the next).
	fdStreamsEMFILE = 140
)

// With the descriptor budget, the data path stops short of the limit: the clients over it
// get 503 (kind fd_budget) and the admin port keeps its reserve. Without it (as when
// something else in the process took the descriptors), the dials and accepts meet EMFILE
// itself: still 503 (kind emfile), still nobody blamed.
func TestFDExhaustionIsNotBlamedOnBackends(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("RLIMIT_NOFILE semantics checked on Linux")
	}
	var own syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &own); err != nil || own.Cur < 3*fdStreams {
		t.Skipf("this process needs %d descriptors for the clients and backends (limit %d, %v)", 3*fdStreams, own.Cur, err)
	}
	t.Run("budget", func(t *testing.T) { fdExhaustion(t, true) })
	t.Run("emfile", func(t *testing.T) { fdExhaustion(t, false) })
}

// fdExhaustion is one case of TestFDExhaustionIsNotBlamedOnBackends: the child with or
// without its descriptor budget.
func fdExhaustion(t *testing.T, budget bool) {
	release := make(chan struct{})
	var streamsStarted atomic.Int64
	var bes []*rawBackend
	for range 2 {
		bes = append(bes, newRawBackend(t, func(c net.Conn, br *bufio.Reader) { fdStreamingBackend(c, br, release, &streamsStarted) }))
	}
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)

	mode, streams := "budget", fdStreams
	if !budget {
		mode, streams = "emfile", fdStreamsEMFILE
	}
	child := startFDChild(t, mode+";"+bes[0].URL()+","+bes[1].URL())

	// The streams: each a connection of its own, its head read within a bound.
	type outcome struct {
		status     int
		retryAfter string
		body       string
		done       bool // a 200 stream that ended with [DONE]
		err        error
	}
	outcomes := make([]outcome, streams)
	heads := make(chan struct{}, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outcomes[i]
			defer func() {
				if o.status == 0 {
					heads <- struct{}{}
				}
			}()
			c, err := net.DialTimeout("tcp", child.data, testTimeout)
			if err != nil {
				o.err = err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * testTimeout))
			body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":"stream %d"}]}`, i)
			_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			if err != nil {
				o.err = err
				return
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				o.err = err
				return
			}
			o.status, o.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				o.body = string(b)
				heads <- struct{}{}
				return
			}
			sse := newSSEReader(resp.Body)
			_, ok := sse.next()
			heads <- struct{}{}
			if ok {
				o.done = sse.drain() == sseComplete
			}
		}()
	}
	for i := range streams {
		select {
		case <-heads:
		case <-time.After(2 * testTimeout):
			t.Fatalf("%d of %d streams got a response head within %v", i, streams, 2*testTimeout)
		}
	}

	// With every stream the child could take held open: the admin port answers, in the
	// reserve the budget keeps (without one, it may not: it is checked after the release).
	admin := &http.Client{Timeout: 5 * time.Second}
	if budget {
		fdCheckAdmin(t, admin, child)
	}
	releaseOnce()
	wg.Wait()
	if !budget {
		fdCheckAdmin(t, admin, child)
	}
	byStatus := map[int]int{}
	for i, o := range outcomes {
		byStatus[o.status]++
		switch {
		case o.err != nil:
			t.Errorf("stream %d: %v", i, o.err)
		case o.status == http.StatusOK:
			if !o.done {
				t.Errorf("stream %d: 200 but the stream did not complete", i)
			}
		case o.status == http.StatusServiceUnavailable:
			if o.retryAfter == "" || !strings.Contains(o.body, `"code":"prefixlb_503"`) ||
				!strings.Contains(o.body, `"type":"service_unavailable"`) || !strings.Contains(o.body, "file descriptors") {
				t.Errorf("stream %d: 503 with Retry-After %q and body %q; want Retry-After and an OpenAI error naming file descriptors", i, o.retryAfter, o.body)
			}
		default:
			t.Errorf("stream %d: status %d %q, want 200 or 503", i, o.status, o.body)
		}
	}
	t.Logf("child RLIMIT_NOFILE %d, %d streams: %v (status: count); backends saw %d streams",
		fdChildLimit, streams, byStatus, streamsStarted.Load())
	if byStatus[http.StatusOK] == 0 || byStatus[http.StatusServiceUnavailable] == 0 {
		t.Errorf("statuses %v: want streams served and the rest refused with 503", byStatus)
	}

	// Descriptors come back as the child sees the clients' connections close: a new
	// request is served.
	eventually(t, testTimeout, "a request served after the streams ended", func() bool {
		st, _ := userDo(t, testClient(), http.MethodPost, "http://"+child.data, "after")
		return st == http.StatusOK
	})
	logs := child.stop(t)
	if n := strings.Count(logs, "http: Accept error"); n != 0 {
		t.Errorf("%d \"http: Accept error\" lines in the log", n)
	}
	if n := strings.Count(logs, logLocalResource); n == 0 || n > 2*int(nLocalKinds) {
		t.Errorf("%d local-resource warnings in the log, want at least one and at most one per kind per %v", n, localLogEvery)
	}
}

// fdCheckAdmin checks the child's admin port: /debug/backends shows both backends healthy,
// never failed nor ejected; /metrics counts local resource errors.
func fdCheckAdmin(t *testing.T, admin *http.Client, child *fdChild) {
	t.Helper()
	var dbg struct {
		Backends []BackendInfo `json:"backends"`
	}
	if err := json.Unmarshal([]byte(fdGet(t, admin, "http://"+child.admin+"/debug/backends")), &dbg); err != nil {
		t.Fatalf("/debug/backends: %v", err)
	}
	if len(dbg.Backends) != 2 {
		t.Fatalf("/debug/backends lists %d backends, want 2", len(dbg.Backends))
	}
	for _, b := range dbg.Backends {
		if !b.Healthy || b.Health.PassiveFailures != 0 || b.Health.Ejections != 0 || !b.Health.EjectedUntil.IsZero() {
			t.Errorf("backend %s blamed for prefixlb's descriptors: healthy %v, passive failures %d, ejections %d",
				b.Name, b.Healthy, b.Health.PassiveFailures, b.Health.Ejections)
		}
	}
	metricsText := fdGet(t, admin, "http://"+child.admin+"/metrics")
	m := regexp.MustCompile(`(?m)^prefixlb_local_resource_errors_total\{kind="(\w+)"\} (\d+)$`).FindAllStringSubmatch(metricsText, -1)
	counts := map[string]int{}
	for _, x := range m {
		counts[x[1]], _ = strconv.Atoi(x[2])
	}
	want := "fd_budget"
	if !strings.Contains(child.mode, "budget") {
		want = "emfile"
	}
	if counts[want] == 0 {
		t.Errorf("prefixlb_local_resource_errors_total %v: want %s counted", counts, want)
	}
	t.Logf("prefixlb_local_resource_errors_total %v", counts)
}

// fdStreamingBackend serves one connection of a streaming backend: /health and any other GET
// get an empty 200; a POST gets the head and a first event at once, then the rest and
// [DONE] once release is closed.
func fdStreamingBackend(c net.Conn, br *bufio.Reader, release <-chan struct{}, started *atomic.Int64) {
	for {
		req, err := readRequest(br)
		if err != nil {
			return
		}
		if req.Method != http.MethodPost {
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"); err != nil {
				return
			}
			continue
		}
		started.Add(1)
		if _, err := io.WriteString(c, chunkedHead+chunk("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")); err != nil {
			return
		}
		select {
		case <-release:
		case <-time.After(3 * testTimeout):
			return
		}
		if _, err := io.WriteString(c, chunk("data: [DONE]\n\n")+"0\r\n\r\n"); err != nil {
			return
		}
	}
}

// fdGet fetches url and returns its body; the test fails unless it answers 200.
func fdGet(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("admin port while the data path is at its limit: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %.200s", url, resp.StatusCode, b)
	}
	return string(b)
}

// fdChild is the prefixlb child process: its data and admin addresses and its log.
type fdChild struct {
	mode        string // "budget" or "emfile"
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	log         *bytes.Buffer
	logMu       *sync.Mutex
	data, admin string
}

// startFDChild runs this test binary again as TestFDExhaustionChild with spec ("budget;" or
// "emfile;" then the backends, comma separated) and waits for its addresses.
func startFDChild(t *testing.T, spec string) *fdChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFDExhaustionChild$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), fdChildEnv+"="+spec)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	mode, _, _ := strings.Cut(spec, ";")
	ch := &fdChild{mode: mode, cmd: cmd, stdin: stdin, log: &bytes.Buffer{}, logMu: &sync.Mutex{}}
	cmd.Stderr = lockedWriter{ch.logMu, ch.log}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(testTimeout):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- line
			}
		}
	}()
	select {
	case line := <-ready:
		f := strings.Fields(line)
		ch.data, ch.admin = f[0], f[1]
	case <-time.After(2 * testTimeout):
		t.Fatalf("the child did not start: %s", ch.logs())
	}
	return ch
}

func (ch *fdChild) logs() string {
	ch.logMu.Lock()
	defer ch.logMu.Unlock()
	return ch.log.String()
}

// stop ends the child (it shuts down when its stdin closes) and returns its log.
func (ch *fdChild) stop(t *testing.T) string {
	t.Helper()
	_ = ch.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- ch.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("child: %v\n%s", err, ch.logs())
		}
	case <-time.After(2 * testTimeout):
		_ = ch.cmd.Process.Kill()
		t.Fatalf("the child did not stop")
	}
	return ch.logs()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestFDExhaustionChild is the prefixlb of TestFDExhaustionIsNotBlamedOnBackends, run in a
// child process; on its own it skips.
func TestFDExhaustionChild(t *testing.T) {
	spec := os.Getenv(fdChildEnv)
	if spec == "" {
		t.Skip("the child process of TestFDExhaustionIsNotBlamedOnBackends")
	}
	mode, backends, _ := strings.Cut(spec, ";")
	lim := syscall.Rlimit{Cur: fdChildLimit, Max: fdChildLimit}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("setrlimit: %v", err)
	}
	s, url := startProxy(t, "round-robin", strings.Split(backends, ","), func(o *Options) {
		checksOn(o)
		o.Log = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(os.Stderr), zapcore.InfoLevel))
	}, func(s *Server) {
		if s.fds == nil {
			t.Fatal("no descriptor budget under RLIMIT_NOFILE")
		}
		if mode == "emfile" {
			s.fds = nil
			for _, u := range *s.ups.Load() {
				u.fds = nil
			}
		}
	})
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.ServeAdmin(s.AdminListener(aln)) }()
	fmt.Printf("READY %s %s\n", strings.TrimPrefix(url, "http://"), aln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
	_ = aln.Close()
}
