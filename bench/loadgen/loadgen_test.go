package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/bench/workload"
)

// fakeServer is a tiny OpenAI-style SSE server on 127.0.0.1. Each reply is "r<n> " repeated
// max_tokens times (one content chunk each), after a role-only chunk, then a usage chunk.
type fakeServer struct {
	mu       sync.Mutex
	bodies   []map[string]any
	raw      [][]byte       // the exact body bytes received, in arrival order
	inFlight map[string]int // conversation marker → in-flight count
	overlap  atomic.Bool
	n        atomic.Int64
	mode     string // "", "503", "truncate", "error-event", "huge-line"
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.raw = append(f.raw, raw)
	mark := firstUser(body)
	if f.inFlight == nil {
		f.inFlight = map[string]int{}
	}
	f.inFlight[mark]++
	if f.inFlight[mark] > 1 {
		f.overlap.Store(true)
	}
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.inFlight[mark]--; f.mu.Unlock() }()

	n := f.n.Add(1)
	if f.mode == "503" {
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set(BackendHeader, fmt.Sprintf("http://b%d", n%2))
	w.Header().Set(RouteHeader, "match;chunks=3")
	fl := w.(http.Flusher)
	fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n")
	fl.Flush()
	maxTok := int(body["max_tokens"].(float64))
	for i := 0; i < maxTok; i++ {
		time.Sleep(time.Millisecond) // the point: a token a millisecond, a stream with an inter-token latency to measure
		if f.mode == "truncate" && i == 1 {
			return // no [DONE]
		}
		if f.mode == "error-event" && i == 1 {
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"boom\"}}\n\n")
			fl.Flush()
			return
		}
		content := fmt.Sprintf("r%d ", n)
		if f.mode == "huge-line" && i == 0 {
			content = strings.Repeat("x", 200<<10)
		}
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"delta": map[string]any{"content": content}}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":40}}}\n\n", maxTok)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func firstUser(body map[string]any) string {
	if p, ok := body["prompt"].(string); ok {
		return p
	}
	ms, _ := body["messages"].([]any)
	for _, m := range ms {
		mm := m.(map[string]any)
		if mm["role"] == "user" {
			return mm["content"].(string)
		}
	}
	return ""
}

func newTestClient(url string) *Client {
	return &Client{Base: url, Model: "m", IgnoreEOS: true, HTTP: NewHTTPClient(4)}
}

func TestDoExtractsTimingsAndUsage(t *testing.T) {
	f := &fakeServer{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := newTestClient(srv.URL)
	start := time.Now()
	res := c.Do(context.Background(), Request{API: workload.Chat, MaxTokens: 5,
		Messages: []workload.Message{{Role: "user", Content: "hi"}}}, start)
	if !res.OK() {
		t.Fatalf("err %q", res.Err)
	}
	if res.TTFT <= 0 || res.E2E < res.TTFT {
		t.Fatalf("ttft %v e2e %v", res.TTFT, res.E2E)
	}
	if len(res.ITL) != 4 {
		t.Fatalf("%d ITL gaps, want 4 (5 content events; the role-only chunk is not content)", len(res.ITL))
	}
	if !res.UsageSeen || res.PromptTokens != 100 || res.CachedTokens != 40 || res.OutputTokens != 5 {
		t.Fatalf("usage %+v", res)
	}
	if res.Backend != "http://b1" || res.Route != "match;chunks=3" || res.Status != 200 {
		t.Fatalf("backend %q route %q status %d", res.Backend, res.Route, res.Status)
	}
	if res.Reply != strings.Repeat("r1 ", 5) {
		t.Fatalf("reply %q", res.Reply)
	}
	b := f.bodies[0]
	if b["stream"] != true || b["ignore_eos"] != true || b["stream_options"].(map[string]any)["include_usage"] != true {
		t.Fatalf("request body %v", b)
	}
}

func TestDoCompletions(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			http.Error(w, "wrong path", 404)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	res := newTestClient(srv.URL).Do(context.Background(), Request{API: workload.Completions, Prompt: "p", MaxTokens: 2}, time.Now())
	if !res.OK() || res.Reply != "ab" || len(res.ITL) != 1 || res.OutputTokens != 2 || res.UsageSeen {
		t.Fatalf("%+v", res)
	}
}

func TestErrorsCounted(t *testing.T) {
	for mode, want := range map[string]string{"503": "status 503", "truncate": "truncated stream", "error-event": "stream error"} {
		f := &fakeServer{mode: mode}
		srv := httptest.NewServer(f)
		res := newTestClient(srv.URL).Do(context.Background(), Request{API: workload.Chat, MaxTokens: 3,
			Messages: []workload.Message{{Role: "user", Content: "x"}}}, time.Now())
		srv.Close()
		if res.Err != want {
			t.Errorf("mode %s: err %q, want %q", mode, res.Err, want)
		}
	}
	// Connection refused: a port that was just closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	res := newTestClient("http://"+addr).Do(context.Background(), Request{API: workload.Chat, MaxTokens: 1}, time.Now())
	if res.Err != "connection refused" {
		t.Errorf("err %q, want connection refused", res.Err)
	}
}

func TestLongSSELine(t *testing.T) {
	srv := httptest.NewServer(&fakeServer{mode: "huge-line"})
	defer srv.Close()
	res := newTestClient(srv.URL).Do(context.Background(), Request{API: workload.Chat, MaxTokens: 2}, time.Now())
	if !res.OK() || len(res.Reply) < 200<<10 {
		t.Fatalf("err %q, reply %d bytes", res.Err, len(res.Reply))
	}
}

func multiTurn(t *testing.T) *workload.Workload {
	t.Helper()
	p := workload.PublicMultiTurn()
	p.Conversations, p.Turns, p.DocTokens, p.OutputTokens, p.Users = 5, 3, 20, 2, 3
	p.ThinkMin, p.ThinkMax = time.Millisecond, 3*time.Millisecond
	w, err := workload.MultiTurn(p)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestClosedLoopCarriesReplies(t *testing.T) {
	f := &fakeServer{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	w := multiTurn(t)
	var got atomic.Int64
	out, err := Run(context.Background(), w, Options{Client: newTestClient(srv.URL), OnResult: func(Result) { got.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Results) != 15 || got.Load() != 15 {
		t.Fatalf("%d results, %d callbacks", len(out.Results), got.Load())
	}
	for _, r := range out.Results {
		if !r.OK() {
			t.Fatalf("error %q", r.Err)
		}
	}
	if f.overlap.Load() {
		t.Fatal("two turns of one conversation were in flight at once")
	}
	// Every request of turn k carries k earlier user turns, each followed by the reply the
	// server actually sent for it.
	replies := map[string]bool{}
	for i := 1; i <= 15; i++ {
		replies[strings.Repeat(fmt.Sprintf("r%d ", i), 2)] = true
	}
	for _, b := range f.bodies {
		ms := b["messages"].([]any)
		if len(ms)%2 != 1 {
			t.Fatalf("%d messages", len(ms))
		}
		for i, m := range ms {
			mm := m.(map[string]any)
			wantRole := "user"
			if i%2 == 1 {
				wantRole = "assistant"
				if !replies[mm["content"].(string)] {
					t.Fatalf("assistant message %q is not a reply the server sent", mm["content"])
				}
			}
			if mm["role"] != wantRole {
				t.Fatalf("message %d role %v", i, mm["role"])
			}
		}
	}
	// The third turn of conversation 0 contains its first two user turns verbatim.
	c0 := w.Conversations[0]
	found := false
	for _, b := range f.bodies {
		ms := b["messages"].([]any)
		if len(ms) == 5 && ms[0].(map[string]any)["content"] == c0.Turns[0].User {
			found = ms[2].(map[string]any)["content"] == c0.Turns[1].User &&
				ms[4].(map[string]any)["content"] == c0.Turns[2].User
		}
	}
	if !found {
		t.Fatal("turn 3 of conversation 0 does not carry its earlier turns")
	}
}

func TestOpenLoop(t *testing.T) {
	f := &fakeServer{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	p := workload.SharedPrefixParams{Groups: 2, PromptsPerGroup: 5, SystemTokens: 10, QuestionTokens: 3, OutputTokens: 2, Rate: 1000, Seed: 1}
	w, err := workload.SharedPrefix(p)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Run(context.Background(), w, Options{Client: newTestClient(srv.URL), Speedup: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Results) != 10 {
		t.Fatalf("%d results", len(out.Results))
	}
	for _, b := range f.bodies {
		ms := b["messages"].([]any)
		if len(ms) != 2 || ms[0].(map[string]any)["role"] != "system" {
			t.Fatalf("messages %v", ms)
		}
	}
}

// TestOpenLoopRecordsSchedule: the outcome's schedule is every conversation in start order
// with its arrival offset scaled by Speedup, exactly as the workload set it.
func TestOpenLoopRecordsSchedule(t *testing.T) {
	srv := httptest.NewServer(&fakeServer{})
	defer srv.Close()
	w, err := workload.SharedPrefix(workload.SharedPrefixParams{Groups: 2, PromptsPerGroup: 3, SystemTokens: 10,
		QuestionTokens: 3, OutputTokens: 2, Rate: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	const speedup = 4
	out, err := Run(context.Background(), w, Options{Client: newTestClient(srv.URL), Speedup: speedup})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Schedule) != len(w.Conversations) {
		t.Fatalf("%d arrivals, want %d", len(out.Schedule), len(w.Conversations))
	}
	for i, a := range out.Schedule {
		c := w.Conversations[i]
		if want := time.Duration(float64(c.At) / speedup); a.Conversation != c.ID || a.At != want {
			t.Fatalf("arrival %d = %+v, want conversation %d at %v", i, a, c.ID, want)
		}
	}
	closed, err := Run(context.Background(), multiTurn(t), Options{Client: newTestClient(srv.URL), Speedup: 100})
	if err != nil || len(closed.Schedule) != 0 {
		t.Fatalf("closed loop: err %v, schedule %v (want none)", err, closed.Schedule)
	}
}

// TestBasesRoundRobinAndBodyHash: with several bases each request goes to the next one in
// turn, Result.Router names it, and Result.BodyHash is the xxhash of the bytes the server got.
func TestBasesRoundRobinAndBodyHash(t *testing.T) {
	const targets, requests = 3, 9
	var fs []*fakeServer
	var bases []string
	for range targets {
		f := &fakeServer{}
		srv := httptest.NewServer(f)
		defer srv.Close()
		fs, bases = append(fs, f), append(bases, srv.URL)
	}
	c := &Client{Bases: bases, Model: "m", IgnoreEOS: true, HTTP: NewHTTPClient(4)}
	for i := range requests {
		res := c.Do(context.Background(), Request{API: workload.Chat, MaxTokens: 1,
			Messages: []workload.Message{{Role: "user", Content: fmt.Sprintf("q%d", i)}}}, time.Now())
		if !res.OK() {
			t.Fatalf("request %d: %q", i, res.Err)
		}
		if want := i % targets; res.Router != want {
			t.Fatalf("request %d went to router %d, want %d", i, res.Router, want)
		}
		f := fs[res.Router]
		f.mu.Lock()
		got := f.raw[len(f.raw)-1]
		f.mu.Unlock()
		if !strings.Contains(string(got), fmt.Sprintf(`"q%d"`, i)) || res.BodyHash != xxhash.Sum64(got) {
			t.Fatalf("request %d: hash %x, server got %x of %s", i, res.BodyHash, xxhash.Sum64(got), got)
		}
	}
	for i, f := range fs {
		if n := f.n.Load(); n != requests/targets {
			t.Fatalf("target %d got %d requests, want %d", i, n, requests/targets)
		}
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	srv := httptest.NewServer(&fakeServer{})
	defer srv.Close()
	w := multiTurn(t)
	for _, c := range w.Conversations {
		for i := range c.Turns {
			c.Turns[i].Think = time.Hour
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := Run(ctx, w, Options{Client: newTestClient(srv.URL)})
	if err == nil || len(out.Results) != 0 {
		t.Fatalf("err %v, %d results", err, len(out.Results))
	}
}
