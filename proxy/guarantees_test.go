package proxy

// Guarantees of docs/operating.md proven through the real proxy on loopback: a failure
// before the first byte is retried once (and only once), nothing to route to is a 503, each
// request logs one line that never carries the prompt, and a SIGTERM-style shutdown drains
// streams.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

// openAIError is the error body the proxy writes (writeError).
type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// decodeError reads an OpenAI-shaped error body, failing the test if it is not one.
func decodeError(t *testing.T, r io.Reader) openAIError {
	t.Helper()
	var e openAIError
	if err := json.NewDecoder(r).Decode(&e); err != nil {
		t.Fatalf("error body is not JSON: %v", err)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Errorf("error body %+v lacks message, type or code", e)
	}
	return e
}

// No backend reachable: 502 in the OpenAI error shape, after trying each backend once (one
// retry).
func TestNoBackendReachable(t *testing.T) {
	s, url := startProxy(t, "round-robin", []string{deadURL(t), deadURL(t)}, nil)
	resp, err := testClient().Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	e := decodeError(t, resp.Body)
	if resp.StatusCode != 502 || e.Error.Code != "prefixlb_502" {
		t.Errorf("got %d %+v, want 502 with an OpenAI-shaped error", resp.StatusCode, e)
	}
	waitInFlightZero(t, s)
	if got := s.m.retries.Get(); got != 1 {
		t.Errorf("prefixlb_retries_total = %d, want 1: each of the two backends tried once", got)
	}
}

// A backend that refuses connections, or answers 503 or 502 before any byte reached the
// client, is retried on the other backend: every client gets the healthy backend's answer,
// the failing backend was really tried (its hits, prefixlb_retries_total), and the healthy
// one served each request once.
func TestRetryBeforeFirstByte(t *testing.T) {
	const requests = 6
	for _, tc := range []struct {
		name   string
		status int // 0: the backend refuses connections
	}{{"connect-refused", 0}, {"503", 503}, {"502", 502}} {
		t.Run(tc.name, func(t *testing.T) {
			ok, okHits := statusBackend(t, 200, "fine")
			bad, badHits := deadURL(t), (*atomic.Int32)(nil)
			if tc.status != 0 {
				var ts *httptest.Server
				ts, badHits = statusBackend(t, tc.status, "not now")
				bad = ts.URL
			}
			s, url := startProxy(t, "round-robin", []string{bad, ok.URL}, nil)
			c := testClient()
			for i := 0; i < requests; i++ {
				resp, err := c.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
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
			retries := s.m.retries.Get()
			if retries == 0 {
				t.Fatalf("prefixlb_retries_total = 0: the failing backend was never tried")
			}
			if badHits != nil && uint64(badHits.Load()) != retries {
				t.Errorf("the %d backend got %d requests, prefixlb_retries_total %d: want one retry per failed attempt", tc.status, badHits.Load(), retries)
			}
			if okHits.Load() != requests {
				t.Errorf("the healthy backend got %d requests for %d clients", okHits.Load(), requests)
			}
		})
	}
}

// A retry happens once: with three backends, two of them answering 503, a request whose
// first attempt gets 503 is retried on one other backend and no further; when that one
// answers 503 too, the client gets the 503. So no request reaches more than two backends,
// and some clients see 503 (with unlimited retries every client would get 200).
func TestRetryHappensOnce(t *testing.T) {
	const requests = 30
	busyA, hitsA := statusBackend(t, 503, `{"error":"busy a"}`)
	busyB, hitsB := statusBackend(t, 503, `{"error":"busy b"}`)
	ok, okHits := statusBackend(t, 200, "fine")
	s, url := startProxy(t, "round-robin", []string{busyA.URL, busyB.URL, ok.URL}, nil)
	c := testClient()
	total := func() int32 { return hitsA.Load() + hitsB.Load() + okHits.Load() }
	var saw503, twice int
	for i := 0; i < requests; i++ {
		before := total()
		resp, err := c.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		n := total() - before
		switch {
		case n < 1 || n > 2:
			t.Errorf("request %d reached %d backends, want 1 or 2 (one retry at most)", i, n)
		case n == 2:
			twice++
		}
		switch resp.StatusCode {
		case 503:
			saw503++
			if n != 2 {
				t.Errorf("request %d: 503 after %d attempts, want 2", i, n)
			}
		case 200:
		default:
			t.Errorf("request %d: status %d", i, resp.StatusCode)
		}
	}
	waitInFlightZero(t, s)
	t.Logf("%d requests: %d retried, %d got 503", requests, twice, saw503)
	if saw503 == 0 {
		t.Errorf("no client saw 503 although two of three backends answer 503: retried more than once")
	}
	if got := s.m.retries.Get(); got != uint64(twice) {
		t.Errorf("prefixlb_retries_total = %d, want %d (one per retried request)", got, twice)
	}
}

// Nothing to route to (no backend configured, discovery found none): 503 with an OpenAI
// error, counted in prefixlb_no_backend_total.
func TestNoBackendGets503(t *testing.T) {
	s, url := startProxy(t, "prefix", nil, nil)
	c := testClient()
	resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	e := decodeError(t, resp.Body)
	if resp.StatusCode != 503 || e.Error.Code != "prefixlb_503" || e.Error.Type != "service_unavailable" {
		t.Errorf("got %d %+v, want 503 service_unavailable", resp.StatusCode, e)
	}
	if got := s.m.noBackend.Get(); got != 1 {
		t.Errorf("prefixlb_no_backend_total = %d, want 1", got)
	}
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	mresp, err := c.Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(string(m), "\nprefixlb_no_backend_total 1\n") {
		t.Errorf("/metrics lacks prefixlb_no_backend_total 1")
	}
}

// secretPrompt is prompt text that must never appear in a log entry.
const secretPrompt = "SECRET-PROMPT-7f3a9c"

// One structured log line per request, with method, path, backend, status, reason, TTFT,
// duration and bytes; the prompt never appears in any entry at any level, whether the
// request succeeds, does not parse, is refused for its size, or finds no backend.
func TestRequestLogLine(t *testing.T) {
	log, logs := recordingLogger()
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer be.Close()
	s, url := startProxy(t, "prefix", []string{be.URL}, func(o *Options) { o.MaxRequestBodyBytes, o.Log = 64<<10, log })
	dead := deadURL(t)
	_, deadProxy := startProxy(t, "round-robin", []string{dead}, func(o *Options) { o.Log = log.With(zap.String("proxy", "dead")) })

	long := strings.Repeat(secretPrompt+" and more words. ", 40)
	chat := func(stream bool) string {
		return fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, long)
	}
	cases := []struct {
		name, base, path, body string
		status                 int
		reason, backend        string // reason "": as the route header says
	}{
		{"stream", url, "/v1/chat/completions", chat(true), 200, "", be.URL},
		{"again", url, "/v1/chat/completions", chat(false), 200, "", be.URL},
		{"unparseable", url, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + long, 200, "parse-fallback", be.URL},
		{"no-backend-reachable", deadProxy, "/v1/completions", `{"model":"m","prompt":"` + long + `"}`, 502, "round-robin", dead},
	}
	c := testClient()
	var seen []logEntry // every entry, for the prompt check at the end
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seen = append(seen, logs.Take()...)
			req, _ := http.NewRequest("POST", tc.base+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer sk-"+secretPrompt)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %.200s", resp.StatusCode, tc.status, got)
			}
			var lines []map[string]any
			eventually(t, 5*time.Second, "the request's log line", func() bool {
				lines = lines[:0]
				for _, e := range logs.WithMessage("request") {
					lines = append(lines, e.Fields)
				}
				return len(lines) > 0
			})
			if len(lines) != 1 {
				t.Fatalf("%d request lines for one request: %v", len(lines), lines)
			}
			l := lines[0]
			for _, f := range []string{"method", "path", "backend", "status", "reason", "ttft", "duration", "bytes"} {
				if _, ok := l[f]; !ok {
					t.Errorf("request line lacks %q: %v", f, l)
				}
			}
			if l["method"] != "POST" || l["path"] != tc.path || l["backend"] != tc.backend || l["status"] != int64(tc.status) {
				t.Errorf("request line %v, want POST %s backend %q status %d", l, tc.path, tc.backend, tc.status)
			}
			reason := tc.reason
			if reason == "" {
				reason, _, _ = strings.Cut(resp.Header.Get(HeaderRoute), ";")
			}
			if l["reason"] != reason {
				t.Errorf("reason %v, want %s", l["reason"], reason)
			}
			if tc.status == 200 {
				ttft, _ := l["ttft"].(time.Duration)
				dur, _ := l["duration"].(time.Duration)
				if ttft <= 0 || dur < ttft || l["bytes"] != int64(len(got)) {
					t.Errorf("ttft %v, duration %v, bytes %v: want 0 < ttft <= duration and the %d bytes relayed", l["ttft"], l["duration"], l["bytes"], len(got))
				}
			}
		})
	}
	// Over the size limit: refused before routing, one "rejected request" line.
	seen = append(seen, logs.Take()...)
	resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chat(false)+strings.Repeat(" ", 64<<10)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Errorf("oversized body: %d, want 413", resp.StatusCode)
	}
	eventually(t, 5*time.Second, "the 413's log line", func() bool { return len(logs.WithMessage("rejected request")) == 1 })
	waitInFlightZero(t, s)
	for _, e := range append(seen, logs.Take()...) {
		if txt := e.Text(); strings.Contains(txt, secretPrompt) {
			t.Errorf("a log entry carries the prompt or the Authorization header: %.300s", txt)
		}
	}
}

// SIGTERM-style shutdown lets an in-flight stream finish: Shutdown, started once the
// backend has written the stream's first event, returns only after the client got every
// event and [DONE].
func TestGracefulShutdownDrainsStreams(t *testing.T) {
	be := &sseBackend{n: 4, gap: 150 * time.Millisecond}
	ts := httptest.NewServer(be)
	defer ts.Close()
	s, url := startProxy(t, "round-robin", []string{ts.URL}, nil)
	type result struct {
		events int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		arr, _, _, err := readEvents(testClient(), url)
		done <- result{len(arr), err}
	}()
	eventually(t, testTimeout, "the stream is in flight, its first event written", func() bool {
		be.mu.Lock()
		defer be.mu.Unlock()
		return len(be.at) > 0 && s.Backends()[0].InFlight() == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	be.mu.Lock()
	written := len(be.at)
	be.mu.Unlock()
	if written != be.n {
		t.Errorf("Shutdown returned when the backend had written %d of %d events: it did not wait for the stream", written, be.n)
	}
	if r := recvWithin(t, done, testTimeout, "the stream's client returns"); r.err != nil || r.events != be.n {
		t.Errorf("stream got %d of %d events across shutdown: %v", r.events, be.n, r.err)
	}
}
