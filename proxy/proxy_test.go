package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
)

// startProxy runs a proxy on 127.0.0.1 in front of urls and returns its base URL.
func startProxy(t *testing.T, mode string, urls []string, mutate func(*configs.Config)) (*Server, string) {
	t.Helper()
	// Test backends answer every path, /health included, with their test behaviour; active
	// checks and scraping are tested in health_test.go.
	cfg := &configs.Config{Mode: mode, Listen: "127.0.0.1:0", Health: configs.Health{Disabled: true, ScrapeDisabled: true}}
	return serveConfig(t, cfg, urls, mutate)
}

// serveConfig adds urls as backends to cfg, applies mutate, validates, and serves it on an
// ephemeral 127.0.0.1 port until the test ends. It returns the server and its base URL.
func serveConfig(t testing.TB, cfg *configs.Config, urls []string, mutate func(*configs.Config)) (*Server, string) {
	t.Helper()
	for _, u := range urls {
		cfg.Backends = append(cfg.Backends, configs.Backend{URL: u})
	}
	if mutate != nil {
		mutate(cfg)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s, "http://" + ln.Addr().String()
}

// waitInFlightZero waits (bounded) until every backend's in-flight count is 0.
func waitInFlightZero(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		total := int64(0)
		for _, b := range s.Backends() {
			total += b.InFlight()
			if b.PrefillTokens() != 0 && b.InFlight() == 0 {
				t.Fatalf("%s: prefill tokens %d with nothing in flight", b.Name, b.PrefillTokens())
			}
		}
		if total == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, b := range s.Backends() {
		t.Errorf("%s: in-flight %d, want 0", b.Name, b.InFlight())
	}
}

// sseBackend emits n SSE events `gap` apart and records when each was written.
type sseBackend struct {
	n   int
	gap time.Duration
	mu  sync.Mutex
	at  []time.Time
}

func (b *sseBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	b.mu.Lock()
	b.at = b.at[:0]
	b.mu.Unlock()
	for i := 0; i < b.n; i++ {
		if i > 0 {
			time.Sleep(b.gap)
		}
		b.mu.Lock()
		b.at = append(b.at, time.Now())
		b.mu.Unlock()
		fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
		fl.Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// readEvents posts a streaming chat request and returns the arrival time of each data line.
func readEvents(t *testing.T, url string) (arrivals []time.Time, start time.Time, hdr http.Header) {
	t.Helper()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	start = time.Now()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: {") {
			arrivals = append(arrivals, time.Now())
		}
		if err != nil {
			break
		}
	}
	return arrivals, start, resp.Header
}

// Events written 200 ms apart arrive one by one through the proxy, each before the next is sent.
func TestSSEStreamsChunkByChunk(t *testing.T) {
	be := &sseBackend{n: 5, gap: 200 * time.Millisecond}
	ts := httptest.NewServer(be)
	defer ts.Close()
	s, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
	arr, _, hdr := readEvents(t, url)
	if len(arr) != be.n {
		t.Fatalf("got %d events, want %d", len(arr), be.n)
	}
	be.mu.Lock()
	sent := append([]time.Time(nil), be.at...)
	be.mu.Unlock()
	for i := 0; i+1 < len(arr); i++ {
		if !arr[i].Before(sent[i+1]) {
			t.Errorf("event %d arrived at +%v, after event %d was sent: the proxy buffered", i, arr[i].Sub(sent[i]), i+1)
		}
	}
	if got := hdr.Get(HeaderBackend); got != ts.URL {
		t.Errorf("%s = %q, want %q", HeaderBackend, got, ts.URL)
	}
	waitInFlightZero(t, s)
}

// TTFT direct vs through the proxy, median of 20 (logged, not asserted: machines are noisy).
func TestSSETTFTDirectVsProxy(t *testing.T) {
	be := &sseBackend{n: 2, gap: 5 * time.Millisecond}
	ts := httptest.NewServer(be)
	defer ts.Close()
	_, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
	median := func(base string) time.Duration {
		var ds []time.Duration
		for i := 0; i < 20; i++ {
			arr, start, _ := readEvents(t, base)
			if len(arr) == 0 {
				t.Fatal("no events")
			}
			ds = append(ds, arr[0].Sub(start))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	direct, proxied := median(ts.URL), median(url)
	t.Logf("TTFT median of 20: direct %v, through prefixlb %v, added %v", direct, proxied, proxied-direct)
}

// cancelBackend records when each request's context is cancelled. mode "stream" sends an
// event every 50 ms; "silent" sends headers then nothing (prefill); "queued" sends nothing.
type cancelBackend struct {
	mode      string
	started   chan struct{}
	cancelled chan time.Time
}

func (b *cancelBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A model server reads the whole body before queueing; net/http notices a closed client
	// only once the body is consumed.
	_, _ = io.ReadAll(r.Body)
	b.started <- struct{}{}
	fl := w.(http.Flusher)
	if b.mode != "queued" {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fl.Flush()
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case <-r.Context().Done():
			b.cancelled <- time.Now()
			return
		case <-deadline:
			return
		case <-tick.C:
			if b.mode == "stream" {
				fmt.Fprint(w, "data: {\"x\":1}\n\n")
				fl.Flush()
			}
		}
	}
}

// A client that leaves (mid-stream, during a silent prefill, or while queued before any
// header) makes the proxy close the upstream connection within about a second.
func TestClientDisconnectAbortsBackend(t *testing.T) {
	for _, mode := range []string{"stream", "silent", "queued"} {
		t.Run(mode, func(t *testing.T) {
			be := &cancelBackend{mode: mode, started: make(chan struct{}, 1), cancelled: make(chan time.Time, 1)}
			ts := httptest.NewServer(be)
			defer ts.Close()
			s, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
			conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			select {
			case <-be.started:
			case <-time.After(5 * time.Second):
				t.Fatal("backend never got the request")
			}
			if mode == "stream" {
				buf := make([]byte, 512)
				if _, err := conn.Read(buf); err != nil {
					t.Fatal(err)
				}
			}
			closedAt := time.Now()
			_ = conn.Close()
			select {
			case at := <-be.cancelled:
				d := at.Sub(closedAt)
				t.Logf("%s: backend saw the cancel %v after the client left", mode, d)
				if d > 2*time.Second {
					t.Errorf("backend cancelled after %v, want about 1 s", d)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("backend request was never cancelled")
			}
			waitInFlightZero(t, s)
		})
	}
}

func TestOverLimitBodyGets413JSON(t *testing.T) {
	var hits atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer ts.Close()
	_, url := startProxy(t, "round-robin", []string{ts.URL}, func(c *configs.Config) { c.MaxRequestBodyBytes = 4096 })
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(strings.Repeat("x", 10000)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
	var e struct {
		Error struct{ Message, Type string } `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("413 body is not JSON: %v", err)
	}
	if !strings.Contains(e.Error.Message, "max_request_body_bytes") || !strings.Contains(e.Error.Message, "4096") {
		t.Errorf("413 message %q does not name the limit", e.Error.Message)
	}
	if hits.Load() != 0 {
		t.Errorf("backend got %d requests, want 0", hits.Load())
	}
}

// Any path and method is forwarded with its query and body unchanged; hop-by-hop headers are
// stripped, end-to-end headers kept, X-Forwarded-For appended.
func TestForwardingHeadersAndPaths(t *testing.T) {
	type seen struct {
		method, uri, body string
		h                 http.Header
	}
	got := make(chan seen, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, string(b), r.Header.Clone()}
		w.Header().Set("X-Backend-Header", "kept")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.WriteHeader(201)
		_, _ = w.Write([]byte("ok"))
	}))
	defer ts.Close()
	_, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
	cases := []struct{ method, path, body string }{
		{"POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"POST", "/v1/embeddings", `{"model":"e","input":"x"}`},
		{"GET", "/v1/models", ""},
		{"PUT", "/some/other/path?a=1&b=%2F", "not json at all {"},
		{"DELETE", "/v1/files/abc", ""},
	}
	for _, c := range cases {
		t.Run(c.method+c.path, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, url+c.path, strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer sk-secret")
			req.Header.Set("Connection", "X-Hop")
			req.Header.Set("X-Hop", "drop-me")
			req.Header.Set("X-Forwarded-For", "10.0.0.1")
			req.Header.Set("X-End", "keep-me")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			rb, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			s := <-got
			if s.method != c.method || s.uri != c.path || s.body != c.body {
				t.Errorf("backend saw %s %s %q, want %s %s %q", s.method, s.uri, s.body, c.method, c.path, c.body)
			}
			if s.h.Get("Authorization") != "Bearer sk-secret" || s.h.Get("X-End") != "keep-me" {
				t.Errorf("end-to-end headers not passed: %v", s.h)
			}
			if s.h.Get("X-Hop") != "" {
				t.Errorf("header named in Connection was forwarded")
			}
			if xff := s.h.Get("X-Forwarded-For"); xff != "10.0.0.1, 127.0.0.1" {
				t.Errorf("X-Forwarded-For = %q, want %q", xff, "10.0.0.1, 127.0.0.1")
			}
			if resp.StatusCode != 201 || string(rb) != "ok" || resp.Header.Get("X-Backend-Header") != "kept" {
				t.Errorf("response %d %q %v", resp.StatusCode, rb, resp.Header)
			}
			if resp.Header.Get("Keep-Alive") != "" {
				t.Errorf("hop-by-hop response header Keep-Alive forwarded")
			}
			if resp.Header.Get(HeaderBackend) != ts.URL {
				t.Errorf("%s = %q", HeaderBackend, resp.Header.Get(HeaderBackend))
			}
		})
	}
}

// No backend reachable: 502 in the OpenAI error shape, after trying each backend once.
func TestNoBackendReachable(t *testing.T) {
	dead := func() string {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		a := ln.Addr().String()
		ln.Close()
		return "http://" + a
	}
	s, url := startProxy(t, "round-robin", []string{dead(), dead()}, nil)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 502 || e.Error.Message == "" || e.Error.Code != "prefixlb_502" {
		t.Errorf("got %d %+v, want 502 with an OpenAI-shaped error", resp.StatusCode, e)
	}
	waitInFlightZero(t, s)
}

// A backend that refuses connections, or answers 503, is retried once on another backend.
func TestRetryBeforeFirstByte(t *testing.T) {
	var okHits atomic.Int32
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		okHits.Add(1)
		_, _ = w.Write([]byte("fine"))
	}))
	defer ok.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(503)
	}))
	defer busy.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	for _, other := range []string{dead, busy.URL} {
		t.Run(other, func(t *testing.T) {
			s, url := startProxy(t, "round-robin", []string{other, ok.URL}, nil)
			for i := 0; i < 6; i++ {
				resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(b) != "fine" {
					t.Fatalf("request %d: %d %q, want 200 from the healthy backend", i, resp.StatusCode, b)
				}
			}
			waitInFlightZero(t, s)
		})
	}
}

// In-flight returns to 0 after normal, failed (500, reset mid-body) and cancelled requests.
func TestInFlightAccounting(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fail":
			w.WriteHeader(500)
		case "/reset":
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(200)
			_, _ = w.Write([]byte("short"))
			w.(http.Flusher).Flush()
			hj, _, _ := w.(http.Hijacker).Hijack()
			hj.Close()
		case "/hold":
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-release
		default:
			_, _ = w.Write([]byte("ok"))
		}
	}))
	defer ts.Close()
	defer close(release)
	s, url := startProxy(t, "least-load", []string{ts.URL}, nil)
	for _, p := range []string{"/ok", "/fail", "/reset"} {
		resp, err := http.Get(url + p)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	waitInFlightZero(t, s)
	// Held requests count while they run.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/hold", nil)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Backends()[0].InFlight() != 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := s.Backends()[0].InFlight(); got != 3 {
		t.Errorf("in-flight %d with 3 held requests, want 3", got)
	}
	cancel()
	wg.Wait()
	waitInFlightZero(t, s)
}

// Round-robin spreads evenly; least-load sends to the backend with fewest in-flight and does
// not favour the first backend on ties.
func TestDistribution(t *testing.T) {
	var hits [3]atomic.Int32
	var urls []string
	for i := range hits {
		i := i
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits[i].Add(1) }))
		defer ts.Close()
		urls = append(urls, ts.URL)
	}
	for _, mode := range []string{"round-robin", "least-load"} {
		t.Run(mode, func(t *testing.T) {
			for i := range hits {
				hits[i].Store(0)
			}
			_, url := startProxy(t, mode, urls, nil)
			for i := 0; i < 30; i++ {
				resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"same"}`))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			for i := range hits {
				if h := hits[i].Load(); h != 10 {
					t.Errorf("backend %d got %d of 30 sequential requests, want 10", i, h)
				}
			}
		})
	}
}

func TestLeastLoadPicksIdleBackend(t *testing.T) {
	bs := make([]*backend.Backend, 3)
	for i := range bs {
		bs[i], _ = backend.New(fmt.Sprintf("http://127.0.0.1:%d", 9000+i), 0, 1)
	}
	var l0, l1 backend.Lease
	l0.Begin(bs[0], 0)
	l1.Begin(bs[2], 0)
	defer l0.Release()
	defer l1.Release()
	pol, _ := NewPolicy(&configs.Config{Mode: "least-load"})
	for i := 0; i < 5; i++ {
		if d := pol.Pick(nil, bs); d.Backend != bs[1] {
			t.Fatalf("pick %d: %s, want the idle backend %s", i, d.Backend.Name, bs[1].Name)
		}
	}
}

// SIGTERM-style shutdown lets an in-flight stream finish.
func TestGracefulShutdownDrainsStreams(t *testing.T) {
	be := &sseBackend{n: 4, gap: 150 * time.Millisecond}
	ts := httptest.NewServer(be)
	defer ts.Close()
	s, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
	done := make(chan int, 1)
	go func() {
		arr, _, _ := readEvents(t, url)
		done <- len(arr)
	}()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n := <-done; n != 4 {
		t.Errorf("stream got %d of 4 events across shutdown", n)
	}
}

// A backend that dies mid-stream ends the client's stream with a visible error (the chunked
// body is cut without its terminator), is not retried, and is counted.
func TestBackendDiesMidStream(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond)
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	}))
	defer ts.Close()
	s, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Errorf("client read a complete body %q from a stream whose backend died", b)
	}
	if !strings.Contains(string(b), `{"i":0}`) {
		t.Errorf("the event sent before the failure was lost: %q", b)
	}
	waitInFlightZero(t, s)
	if got := s.m.streamErrors.Get(); got != 1 {
		t.Errorf("prefixlb_stream_errors_total = %d, want 1", got)
	}
	if got := s.Backends()[0].Served(); got != 1 {
		t.Errorf("backend served %d requests, want 1 (no retry mid-stream)", got)
	}
}

// In mode prefix, the turns of one conversation follow its prefix to one backend and say so
// in x-prefixlb-route; different conversations spread.
func TestPrefixModeRoutesConversationsByPrefix(t *testing.T) {
	var urls []string
	for i := 0; i < 3; i++ {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"ok"}}]}`)
		}))
		defer ts.Close()
		urls = append(urls, ts.URL)
	}
	s, url := startProxy(t, "prefix", urls, nil)
	used := map[string]bool{}
	for conv := 0; conv < 6; conv++ {
		system := strings.Repeat(fmt.Sprintf("You are assistant number %d. Follow the policy. ", conv), 60)
		msgs := fmt.Sprintf(`{"role":"system","content":%q}`, system)
		var first string
		for turn := 0; turn < 3; turn++ {
			msgs += fmt.Sprintf(`,{"role":"user","content":"question %d of conversation %d"}`, turn, conv)
			body := `{"model":"m","messages":[` + msgs + `]}`
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			be, route := resp.Header.Get(HeaderBackend), resp.Header.Get(HeaderRoute)
			if turn == 0 {
				first = be
				used[be] = true
				if !strings.HasPrefix(route, "cold") {
					t.Errorf("conversation %d turn 0: route %q, want cold", conv, route)
				}
				continue
			}
			if be != first {
				t.Errorf("conversation %d turn %d went to %s, turn 0 to %s", conv, turn, be, first)
			}
			if !strings.HasPrefix(route, "match") {
				t.Errorf("conversation %d turn %d: route %q, want match", conv, turn, route)
			}
			msgs += `,{"role":"assistant","content":"ok"}`
		}
	}
	if len(used) < 2 {
		t.Errorf("6 conversations all placed on %v", used)
	}
	waitInFlightZero(t, s)
}
