package loadgen

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// TestToMessagesRequest: a chat conversation with a system prompt, a tool call, its result and
// a follow-up becomes the Messages API body an agent sends.
func TestToMessagesRequest(t *testing.T) {
	tools := json.RawMessage(`[{"type":"function","function":{"name":"Read","description":"read a file","parameters":{"type":"object"}}}]`)
	msgs := []workload.Message{
		{Role: "system", Content: "be terse"},
		{Role: "user", Content: "fix a.go"},
		{Role: "assistant", Content: "reading", ToolCalls: []workload.ToolCall{{ID: "toolu_1", Type: "function", Function: workload.FunctionCall{Name: "Read", Arguments: `{"path":"a.go"}`}}}},
		{Role: "tool", ToolCallID: "toolu_1", Content: "package a"},
		{Role: "user", Content: "now fix it"},
	}
	got, err := toMessagesRequest("m", 9, true, msgs, tools)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(got)
	want := `{"model":"m","system":"be terse","tools":[{"name":"Read","description":"read a file","input_schema":{"type":"object"}}],` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"fix a.go"}]},` +
		`{"role":"assistant","content":[{"type":"text","text":"reading"},{"type":"tool_use","id":"toolu_1","name":"Read","input":{"path":"a.go"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"package a"},{"type":"text","text":"now fix it"}]}],` +
		`"max_tokens":9,"stream":true,"ignore_eos":true}`
	if string(b) != want {
		t.Errorf("body\n got %s\nwant %s", b, want)
	}
	if _, err := toMessagesRequest("m", 1, false, msgs, json.RawMessage(`{"not":"a list"}`)); err == nil {
		t.Error("tools that are not a list: no error")
	}
}

// TestAgenticOverMessages runs a small agentic workload (tool calls every turn, sub-agents)
// over /v1/messages against a real sim replica: every request succeeds with its max_tokens of
// streamed text, and every later turn of a conversation finds the previous turn's prompt in
// the replica's KV cache (cache_read_input_tokens), in whole blocks.
func TestAgenticOverMessages(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Speedup = 50
	cluster, err := sim.StartCluster(cfg, 1, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	p := workload.DefaultAgentic()
	p.Sessions, p.Rate, p.Requests, p.RequestsSigma = 2, 50, 5, 0
	p.PrefixTokens, p.FirstUserTokens, p.ContextTokens = 2000, 100, 6000
	p.Think, p.ThinkMin, p.ThinkMax = 5*time.Millisecond, time.Millisecond, 10*time.Millisecond
	p.OutputTokens, p.MaxOutput, p.SubAgentFraction = 8, 16, 0
	w, err := workload.Agentic(p)
	if err != nil {
		t.Fatal(err)
	}
	client := &Client{Base: cluster.URLs()[0], Model: cfg.Model, IgnoreEOS: true, API: MessagesAPI, HTTP: NewHTTPClient(8)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := Run(ctx, w, Options{Client: client, RequestTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Results) != w.Requests() {
		t.Fatalf("%d results, want %d", len(out.Results), w.Requests())
	}
	prompt := map[[2]int]int{}
	for _, r := range out.Results {
		if !r.OK() || !r.UsageSeen || r.TTFT <= 0 || r.OutputTokens != w.Conversations[r.Conversation].Turns[r.Turn].MaxTokens {
			t.Fatalf("conversation %d turn %d: %+v", r.Conversation, r.Turn, r)
		}
		prompt[[2]int{r.Conversation, r.Turn}] = r.PromptTokens
	}
	later := 0
	for _, r := range out.Results {
		prev, ok := prompt[[2]int{r.Conversation, r.Turn - 1}]
		if !ok {
			continue
		}
		later++
		if full := prev - prev%cfg.BlockSize; r.CachedTokens < full || r.PromptTokens <= prev {
			t.Errorf("conversation %d turn %d: %d of %d prompt tokens cached, want ≥ %d (the previous turn's)", r.Conversation, r.Turn, r.CachedTokens, r.PromptTokens, full)
		}
	}
	if later == 0 {
		t.Fatal("no later turns: the test checks nothing")
	}
}
