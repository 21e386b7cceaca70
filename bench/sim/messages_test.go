package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"
)

// The same agent conversation in both APIs: system, a tool, a tool call and its result.
const (
	chatToolConv = `{"tools":[{"type":"function","function":{"name":"Read","description":"read a file","parameters":{"type":"object"}}}],` +
		`"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"Fix a.go"},` +
		`{"role":"assistant","content":"Reading.","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"Read","arguments":"{\"path\":\"a.go\"}"}}]},` +
		`{"role":"tool","tool_call_id":"toolu_1","content":"package a"},{"role":"user","content":"Now fix it."}],"max_tokens":8}`
	messagesToolConv = `{"tools":[{"name":"Read","description":"read a file","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}],` +
		`"system":[{"type":"text","text":"You are a coding agent.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"Fix a.go"},` +
		`{"role":"assistant","content":[{"type":"text","text":"Reading."},{"type":"tool_use","id":"toolu_1","name":"Read","input":{"path":"a.go"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"package a"}]},{"type":"text","text":"Now fix it."}]}],"max_tokens":8}`
)

// TestMessagesPromptMatchesChat: a Messages API request is the prompt of its chat equivalent
// (the conversion vLLM makes), token for token, so the two APIs share cached blocks.
func TestMessagesPromptMatchesChat(t *testing.T) {
	cfg := DefaultConfig()
	var scratch []byte
	c, aerr := parseRequest([]byte(chatToolConv), epChat, &cfg, &scratch)
	if aerr != nil {
		t.Fatal(aerr)
	}
	m, aerr := parseRequest([]byte(messagesToolConv), epMessages, &cfg, &scratch)
	if aerr != nil {
		t.Fatal(aerr)
	}
	if !slices.Equal(c.tokens, m.tokens) || m.maxTokens != 8 {
		t.Errorf("messages prompt (%d tokens, max %d) differs from chat's (%d tokens)", len(m.tokens), m.maxTokens, len(c.tokens))
	}
}

// TestMessagesMultiTurnSharesPrefix: turn n+1 over the Messages API, with turn n's answer
// echoed back and a tool round added, starts with turn n's prompt and answer.
func TestMessagesMultiTurnSharesPrefix(t *testing.T) {
	cfg := DefaultConfig()
	var scratch []byte
	turn1 := `{"system":"You are terse.","messages":[{"role":"user","content":"Read a.go"}],"max_tokens":12}`
	r1, aerr := parseRequest([]byte(turn1), epMessages, &cfg, &scratch)
	if aerr != nil {
		t.Fatal(aerr)
	}
	rq := NewRequest(r1.tokens, r1.maxTokens, r1.seed, false, false)
	answer := ""
	want := slices.Clone(r1.tokens)
	for i := range rq.MaxTokens() {
		answer += rq.OutputWord(i)
		want = append(want, rq.outputID(i))
	}
	turn2 := `{"system":"You are terse.","messages":[{"role":"user","content":"Read a.go"},` +
		`{"role":"assistant","content":[{"type":"text","text":"` + answer + `"},{"type":"tool_use","id":"t1","name":"Read","input":{"path":"a.go"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"package a","is_error":false}]}]}`
	r2, aerr := parseRequest([]byte(turn2), epMessages, &cfg, &scratch)
	if aerr != nil {
		t.Fatal(aerr)
	}
	if len(r2.tokens) <= len(want) || !slices.Equal(r2.tokens[:len(want)], want) {
		t.Fatalf("turn 2 (%d tokens) does not start with turn 1 + answer (%d tokens)", len(r2.tokens), len(want))
	}
}

type messagesUsage struct {
	InputTokens   int  `json:"input_tokens"`
	CacheRead     *int `json:"cache_read_input_tokens"`
	CacheCreation *int `json:"cache_creation_input_tokens"`
	OutputTokens  int  `json:"output_tokens"`
}

type messagesEvent struct {
	name    string
	Type    string `json:"type"`
	Message *struct {
		ID    string        `json:"id"`
		Role  string        `json:"role"`
		Model string        `json:"model"`
		Usage messagesUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Type       string `json:"type"`
		Text       string `json:"text"`
		StopReason string `json:"stop_reason"`
	} `json:"delta"`
	Usage *messagesUsage `json:"usage"`
}

// readMessagesSSE decodes Anthropic's event stream: "event: NAME" then "data: JSON" per event.
func readMessagesSSE(t *testing.T, body io.Reader) []messagesEvent {
	t.Helper()
	var out []messagesEvent
	sc := bufio.NewScanner(body)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			name = n
			continue
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			ev := messagesEvent{name: name}
			if err := json.Unmarshal([]byte(d), &ev); err != nil {
				t.Fatalf("bad event data %q: %v", d, err)
			}
			if ev.Type != name {
				t.Fatalf("event %q has data type %q", name, ev.Type)
			}
			out = append(out, ev)
		}
	}
	return out
}

// TestHTTPMessages serves the Messages API streamed and not: Anthropic's events in order,
// the text of max_tokens tokens, and usage whose cache_read_input_tokens comes from the KV
// cache (the second request shares the first's prefix).
func TestHTTPMessages(t *testing.T) {
	c := startTestCluster(t, 1, 1000)
	base := c.URLs()[0]
	doc := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40)
	body := `{"model":"` + DefaultModel + `","max_tokens":6,"system":"` + doc + `","messages":[{"role":"user","content":"Q1"}]`

	resp := post(t, context.Background(), base+"/v1/messages", body+`,"stream":true}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := readMessagesSSE(t, resp.Body)
	resp.Body.Close()
	var names []string
	text := ""
	for _, ev := range evs {
		names = append(names, ev.name)
		if ev.name == "content_block_delta" {
			text += ev.Delta.Text
		}
	}
	wantNames := []string{"message_start", "content_block_start"}
	for range 6 {
		wantNames = append(wantNames, "content_block_delta")
	}
	wantNames = append(wantNames, "content_block_stop", "message_delta", "message_stop")
	if !slices.Equal(names, wantNames) {
		t.Fatalf("events %v, want %v", names, wantNames)
	}
	start, delta := evs[0].Message, evs[len(evs)-2]
	if start.Role != "assistant" || start.Model != DefaultModel || !strings.HasPrefix(start.ID, "msg_") ||
		start.Usage.InputTokens < 100 || start.Usage.CacheRead == nil || *start.Usage.CacheRead != 0 {
		t.Errorf("message_start %+v, want a cold prompt of > 100 input tokens", start)
	}
	if delta.Usage == nil || delta.Usage.OutputTokens != 6 || delta.Delta.StopReason != "max_tokens" || CountTokens(text) != 6 {
		t.Errorf("message_delta %+v, text %q; want 6 output tokens", delta, text)
	}
	prompt := start.Usage.InputTokens

	resp = post(t, context.Background(), base+"/v1/messages", body+`}`)
	var msg struct {
		Type       string `json:"type"`
		Role       string `json:"role"`
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type, Text string
		} `json:"content"`
		Usage messagesUsage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if msg.Type != "message" || msg.Role != "assistant" || msg.StopReason != "max_tokens" || len(msg.Content) != 1 ||
		msg.Content[0].Type != "text" || CountTokens(msg.Content[0].Text) != 6 || msg.Usage.OutputTokens != 6 {
		t.Errorf("message %+v", msg)
	}
	if msg.Usage.CacheRead == nil || *msg.Usage.CacheRead == 0 || msg.Usage.InputTokens+*msg.Usage.CacheRead != prompt {
		t.Errorf("second request usage %+v; want the shared prefix read from the cache, input + cache_read = %d", msg.Usage, prompt)
	}

	resp = post(t, context.Background(), base+"/v1/messages", `{"messages":[{"role":"robot","content":"x"}]}`)
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type, Message string
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 400 || e.Type != "error" ||
		e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, "role") {
		t.Errorf("bad role: status %d, %+v (%v); want 400 and Anthropic's error shape", resp.StatusCode, e, err)
	}
	resp.Body.Close()
}
