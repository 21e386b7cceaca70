package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/router/key"
)

// TestSniffUsage reads prompt and cached tokens from every usage shape the relay sees, in the
// pieces it sees them in, without allocating.
func TestSniffUsage(t *testing.T) {
	const (
		start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[],\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":2,\"cache_read_input_tokens\":96,\"output_tokens\":0}}}\n\n"
		delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\\"input_tokens\\\": 5\"}}\n\n"
		end   = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	)
	tests := []struct {
		name           string
		pieces         []string
		prompt, cached int
	}{
		{"chat usage chunk", []string{`data: {"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":96}}}`}, 120, 96},
		{"chat usage without details", []string{`{"usage":{"prompt_tokens":12,"total_tokens":13}}`}, 12, 0},
		{"messages stream, event by event", []string{start, delta, delta, end}, 128, 96},
		{"messages stream in one piece", []string{start + delta + end}, 128, 96},
		{"messages JSON response", []string{`{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"cache_read_input_tokens":54,"output_tokens":3}}`}, 64, 54},
		{"messages without cache fields (older vLLM)", []string{`{"type":"message","usage":{"input_tokens":40,"output_tokens":3}}`}, 40, 0},
		{"a later usage without the cache does not erase it", []string{start, `data: {"type":"message_delta","usage":{"input_tokens":30,"output_tokens":7}}`}, 128, 96},
		{"no usage", []string{delta, "data: [DONE]\n\n"}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f flow
			for _, p := range tt.pieces {
				f.sniffUsage([]byte(p))
			}
			if f.usagePrompt != tt.prompt || f.usageCached != tt.cached {
				t.Errorf("prompt %d cached %d, want %d %d", f.usagePrompt, f.usageCached, tt.prompt, tt.cached)
			}
		})
	}
	piece := []byte(start + delta + end)
	var f flow
	if a := testing.AllocsPerRun(100, func() { f.sniffUsage(piece) }); a != 0 {
		t.Errorf("sniffUsage: %.1f allocs per piece, want 0", a)
	}
}

// simBackends starts n simulated replicas of scfg until the test ends, and returns them and
// a backend for each with its KV capacity (a proxy's: startProxy's mutate sets o.Backends).
func simBackends(t *testing.T, scfg sim.Config, n int) (*sim.Cluster, []*backend.Backend) {
	t.Helper()
	cluster, err := sim.StartCluster(scfg, n, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Close(); err != nil {
			t.Errorf("sim cluster: %v", err)
		}
	})
	var bs []*backend.Backend
	for _, u := range cluster.URLs() {
		b, err := backend.New(u, int64(scfg.KVCacheTokens()), 0)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	return cluster, bs
}

// metricSum is the sum of the /metrics samples whose name (with labels) starts with prefix.
func metricSum(t *testing.T, s *Server, prefix string) float64 {
	t.Helper()
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	resp, err := testClient().Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

type anthropicUsage struct {
	InputTokens int `json:"input_tokens"`
	CacheRead   int `json:"cache_read_input_tokens"`
}

// TestMessagesThroughProxy: /v1/messages is prefix-routed end to end over simulated replicas.
// A streamed turn's Anthropic events arrive in order through the relay; the next turn (not
// streamed) extends the conversation with a tool_use and its tool_result, is routed to the
// replica that holds the prefix ("match"), finds it in its KV cache, and the proxy's prompt and
// cached-token counters equal what the client was told.
func TestMessagesThroughProxy(t *testing.T) {
	scfg := sim.DefaultConfig()
	scfg.Speedup = 100
	_, bs := simBackends(t, scfg, 2)
	s, url := startProxy(t, "prefix", nil, func(o *Options) { o.Backends = bs })
	c := testClient()
	system := strings.Repeat("You are a careful coding agent working in a Go repository. ", 30)
	turn1 := `{"model":"` + sim.DefaultModel + `","max_tokens":5,"system":[{"type":"text","text":"` + system + `","cache_control":{"type":"ephemeral"}}],` +
		`"messages":[{"role":"user","content":"Read main.go"}]`

	resp, err := c.Post(url+"/v1/messages", "application/json", strings.NewReader(turn1+`,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	var reply strings.Builder
	var u1 anthropicUsage
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			events = append(events, name)
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			var ev struct {
				Type    string `json:"type"`
				Message struct {
					Usage anthropicUsage `json:"usage"`
				} `json:"message"`
				Delta struct {
					Text string `json:"text"`
				} `json:"delta"`
			}
			if err := json.Unmarshal([]byte(d), &ev); err != nil {
				t.Fatalf("event data %q: %v", d, err)
			}
			if ev.Type == "message_start" {
				u1 = ev.Message.Usage
			}
			reply.WriteString(ev.Delta.Text)
		}
	}
	resp.Body.Close()
	backend1 := resp.Header.Get(HeaderBackend)
	if resp.StatusCode != 200 || len(events) != 10 || events[0] != "message_start" || events[2] != "content_block_delta" || events[9] != "message_stop" {
		t.Fatalf("streamed: status %d, events %v", resp.StatusCode, events)
	}
	if u1.InputTokens < 100 || u1.CacheRead != 0 {
		t.Errorf("turn 1 usage %+v, want a cold prompt of > 100 tokens", u1)
	}

	turn2 := strings.TrimSuffix(turn1, `]`) + `,{"role":"assistant","content":[{"type":"text","text":"` + reply.String() + `"},` +
		`{"type":"tool_use","id":"toolu_1","name":"Read","input":{"path":"main.go"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"package main","cache_control":{"type":"ephemeral"}}]}]}`
	resp, err = c.Post(url+"/v1/messages", "application/json", strings.NewReader(turn2))
	if err != nil {
		t.Fatal(err)
	}
	var msg struct {
		Type  string         `json:"type"`
		Usage anthropicUsage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || resp.StatusCode != 200 || msg.Type != "message" {
		t.Fatalf("turn 2: status %d, %+v, %v", resp.StatusCode, msg, err)
	}
	resp.Body.Close()
	if got := resp.Header.Get(HeaderBackend); got != backend1 || !strings.HasPrefix(resp.Header.Get(HeaderRoute), "match") {
		t.Errorf("turn 2 went to %s (%s), want %s by match", got, resp.Header.Get(HeaderRoute), backend1)
	}
	// The KV cache holds whole blocks: all of turn 1's prompt but its last partial block.
	if full := u1.InputTokens - u1.InputTokens%sim.DefaultConfig().BlockSize; msg.Usage.CacheRead < full {
		t.Errorf("turn 2 usage %+v: want turn 1's %d prompt tokens in full blocks read from the cache", msg.Usage, full)
	}
	waitInFlightZero(t, s)
	wantPrompt := u1.InputTokens + u1.CacheRead + msg.Usage.InputTokens + msg.Usage.CacheRead
	if got := metricSum(t, s, "prefixlb_backend_prompt_tokens_total"); int(got) != wantPrompt {
		t.Errorf("prefixlb_backend_prompt_tokens_total = %v, want %d", got, wantPrompt)
	}
	if got := metricSum(t, s, "prefixlb_backend_cached_tokens_total"); int(got) != u1.CacheRead+msg.Usage.CacheRead {
		t.Errorf("prefixlb_backend_cached_tokens_total = %v, want %d", got, u1.CacheRead+msg.Usage.CacheRead)
	}
}

// TestMessagesTTFTAtFirstToken: a Messages API server that sends message_start at once and its
// first token hold later: the proxy's TTFT is at the token, not at message_start (a lower
// bound, which holds however slow the machine is). Not streamed, the first byte is the TTFT.
func TestMessagesTTFTAtFirstToken(t *testing.T) {
	const hold = 300 * time.Millisecond
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":8,\"cache_read_input_tokens\":0}}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(hold) // the point: the first token comes hold after message_start
		_, _ = io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n")
		_, _ = io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}))
	defer be.Close()
	s, url := startProxy(t, "round-robin", []string{be.URL}, nil)
	resp, err := testClient().Post(url+"/v1/messages", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "message_start") || !strings.Contains(string(b), "text_delta") {
		t.Fatalf("relayed body %q", b)
	}
	waitInFlightZero(t, s)
	if n := metricSum(t, s, "prefixlb_ttft_seconds_count"); n != 1 {
		t.Fatalf("prefixlb_ttft_seconds_count = %v, want 1", n)
	}
	if ttft := metricSum(t, s, "prefixlb_ttft_seconds_sum"); ttft < hold.Seconds() {
		t.Errorf("TTFT %.3fs < the %v before the first token: measured at message_start", ttft, hold)
	}
}

// TestTokenAt: only a streamed /v1/messages waits for a token event.
func TestTokenAt(t *testing.T) {
	tests := []struct {
		api    key.API
		stream bool
		piece  string
		want   bool
	}{
		{key.APIChat, true, "data: {}", true},
		{key.APIMessages, false, `{"type":"message"}`, true},
		{key.APIMessages, true, "event: message_start\ndata: {}\n\n", false},
		{key.APIMessages, true, "event: ping\ndata: {}\n\n", false},
		{key.APIMessages, true, "event: content_block_delta\ndata: {}\n\n", true},
		{key.APIMessages, true, "event: message_delta\ndata: {}\n\n", true},
	}
	for _, tt := range tests {
		var f flow
		f.k.API, f.k.Stream = tt.api, tt.stream
		if got := f.tokenAt([]byte(tt.piece)); got != tt.want {
			t.Errorf("%v stream=%v %q: tokenAt = %v, want %v", tt.api, tt.stream, tt.piece, got, tt.want)
		}
	}
}
