package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/workload"
)

// TestReadStream pins what the client reads from each API's event stream: the reply, the
// content events (as ITL gaps), token counts and the error reason, over SSE framing (blank,
// empty and comment lines, CRLF), usage reported or not, and streams that fail or end early.
func TestReadStream(t *testing.T) {
	const (
		chatStart  = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
		chatUsage  = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
		msgStart   = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":2,\"cache_read_input_tokens\":5,\"cache_creation_input_tokens\":1,\"output_tokens\":0}}}\n\n"
		msgDelta   = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":9}}\n\n"
		msgStop    = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
		msgBlock   = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
		msgPing    = "event: ping\ndata: {\"type\":\"ping\"}\n\n"
		msgBlockOn = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
	)
	chat := func(s string) string { return "data: {\"choices\":[{\"delta\":{\"content\":\"" + s + "\"}}]}\n\n" }
	text := func(s string) string { return "data: {\"choices\":[{\"text\":\"" + s + "\"}]}\n\n" }
	msg := func(s string) string {
		return "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + s + "\"}}\n\n"
	}
	type want struct {
		err                    string
		reply                  string
		events                 int // content events: ITL gaps + 1
		prompt, output, cached int
		usage                  bool
	}
	cases := []struct {
		name     string
		messages bool
		maxReply int
		stream   string
		want     want
	}{
		{"chat usage", false, 0, chatStart + chat("a") + chat("b") + chat("c") + chatUsage + "data: [DONE]\n\n",
			want{reply: "abc", events: 3, prompt: 7, output: 3, cached: 4, usage: true}},
		{"chat no usage", false, 0, chat("a") + chat("b") + "data: [DONE]\n\n",
			want{reply: "ab", events: 2, output: 2}},
		{"chat framing", false, 0, ": keep-alive\r\n\r\ndata:\n\ndata:   \n\n" + "data:{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\n" +
			"event: ignored\nid: 1\n\n" + "data:  " + chat("y")[len("data: "):] + "data:  [DONE]  \r\n",
			want{reply: "xy", events: 2, output: 2}},
		{"completions", false, 0, text("p") + text("") + text("q") + "data: [DONE]",
			want{reply: "pq", events: 2, output: 2}},
		{"chat null error", false, 0, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"error\":null}\n\ndata: [DONE]\n\n",
			want{reply: "a", events: 1, output: 1}},
		{"chat error event", false, 0, chat("a") + "data: {\"error\":{\"message\":\"boom\"}}\n\n",
			want{err: "stream error", events: 1}},
		{"chat bad chunk", false, 0, chat("a") + "data: {nope\n\n" + chat("b") + "data: [DONE]\n\n",
			want{err: "bad chunk", events: 1}},
		{"chat truncated", false, 0, chat("a") + chat("b"),
			want{err: "truncated stream", reply: "ab", events: 2, output: 2}},
		{"chat truncated after usage", false, 0, chat("a") + chatUsage,
			want{err: "truncated stream", reply: "a", events: 1, prompt: 7, output: 3, cached: 4, usage: true}},
		{"chat no content", false, 0, chatStart + chatUsage + "data: [DONE]\n\n",
			want{err: "no content", prompt: 7, output: 3, cached: 4, usage: true}},
		{"chat after done", false, 0, chat("a") + "data: [DONE]\n\n" + chat("b"),
			want{reply: "a", events: 1, output: 1}},
		{"chat reply cap", false, 2, chat("ab") + chat("cd") + chat("ef") + "data: [DONE]\n\n",
			want{reply: "ab", events: 3, output: 3}},
		{"messages", true, 0, msgStart + msgBlock + msg("a") + msgPing + msg("b") + msgBlockOn + msgDelta + msgStop,
			want{reply: "ab", events: 2, prompt: 8, output: 9, cached: 5, usage: true}},
		{"messages no delta usage", true, 0, msgStart + msg("a") + msg("") + msg("b") + msg("c") + msgStop,
			want{reply: "abc", events: 3, prompt: 8, output: 3, cached: 5, usage: true}},
		{"messages framing", true, 0, ": ping\r\n\r\ndata:\n\n" + msg("x") + "data:" + msgStop[len("event: message_stop\ndata: "):len(msgStop)-2] + "\r\n",
			want{reply: "x", events: 1, output: 1}},
		{"messages error", true, 0, msgStart + msg("a") + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n",
			want{err: "stream error", events: 1, prompt: 8, cached: 5, usage: true}},
		{"messages bad chunk", true, 0, msg("a") + "data: [DONE]\n\n",
			want{err: "bad chunk", events: 1}},
		{"messages truncated", true, 0, msgStart + msg("a") + msg("b"),
			want{err: "truncated stream", reply: "ab", events: 2, prompt: 8, output: 2, cached: 5, usage: true}},
		{"messages no content", true, 0, msgStart + msgDelta + msgStop,
			want{err: "no content", prompt: 8, output: 9, cached: 5, usage: true}},
		{"messages reply cap", true, 1, msg("ab") + msg("c") + msgStop,
			want{reply: "ab", events: 2, output: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, tc.stream)
			}))
			defer srv.Close()
			c := newTestClient(srv.URL)
			c.MaxReplyBytes = tc.maxReply
			if tc.messages {
				c.API = MessagesAPI
			}
			start := time.Now()
			res := c.Do(context.Background(), Request{API: workload.Chat, MaxTokens: 3,
				Messages: []workload.Message{{Role: "user", Content: "x"}}}, start)
			events := 0
			if res.TTFT > 0 {
				events = len(res.ITL) + 1
			}
			got := want{err: res.Err, reply: res.Reply, events: events, prompt: res.PromptTokens,
				output: res.OutputTokens, cached: res.CachedTokens, usage: res.UsageSeen}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
