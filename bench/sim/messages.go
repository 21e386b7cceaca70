package sim

// The Messages API (/v1/messages), in Anthropic's shape as vLLM serves it: the request is
// converted to the chat conversation vLLM would build from it and rendered by the sim's chat
// template (request.go), so a conversation sent through either API is the same prompt and
// shares the same cached blocks:
//
//	tools (name, description, input_schema)  -> <|tools|> [{"type":"function","function":{name, description, parameters}}]
//	system (a string or text blocks)         -> a system message
//	user content: tool_result blocks          -> one tool message each (<|tool id=TOOL_USE_ID|>), then
//	              the other blocks            -> a user message with them
//	assistant content: text, tool_use blocks  -> an assistant message, tool_use as <|tool_call|>NAME INPUT
//
// image and other non-text blocks become <|media:HASH|> of their JSON, as chat parts do.
// Responses are Anthropic's: a message object with text content and usage (input_tokens the
// prompt tokens not read from the cache, cache_read_input_tokens those read, output_tokens),
// or, streamed, the events message_start … content_block_delta … message_delta, message_stop.

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/valyala/fastjson"
)

func endpointOf(path string) endpoint {
	switch path {
	case "/v1/chat/completions":
		return epChat
	case "/v1/messages":
		return epMessages
	}
	return epCompletions
}

// renderMessages appends the templated conversation (template.go) of a Messages API request to
// dst, converted as the header describes.
func renderMessages(dst []byte, v *fastjson.Value) ([]byte, *apiError) {
	t := chatTemplate{b: dst}
	if tools := v.Get("tools"); tools != nil && tools.Type() != fastjson.TypeNull {
		if tools.Type() != fastjson.TypeArray {
			return t.b, badRequest("tools", "tools must be a list")
		}
		list, _ := tools.Array()
		t.toolsOpen()
		t.b = append(t.b, '[')
		for i, tool := range list {
			if tool.Type() != fastjson.TypeObject {
				return t.b, badRequest("tools", "tools[%d] must be an object", i)
			}
			if i > 0 {
				t.b = append(t.b, ',')
			}
			t.b = append(t.b, `{"type":"function","function":{"name":`...)
			t.b = appendJSONString(t.b, tool.GetStringBytes("name"))
			t.b = append(t.b, `,"description":`...)
			t.b = appendJSONString(t.b, tool.GetStringBytes("description"))
			t.b = append(t.b, `,"parameters":`...)
			if s := tool.Get("input_schema"); s != nil {
				t.b = s.MarshalTo(t.b)
			} else {
				t.b = append(t.b, "{}"...)
			}
			t.b = append(t.b, "}}"...)
		}
		t.b = append(t.b, ']')
		t.end()
	}
	if sys := v.Get("system"); sys != nil && sys.Type() != fastjson.TypeNull {
		t.message([]byte("system"), nil, nil)
		if aerr := t.blocks(sys, "system"); aerr != nil {
			return t.b, aerr
		}
		t.end()
	}
	msgs := v.Get("messages")
	if msgs == nil || msgs.Type() != fastjson.TypeArray {
		return t.b, badRequest("messages", "messages must be a non-empty list")
	}
	arr, _ := msgs.Array()
	if len(arr) == 0 {
		return t.b, badRequest("messages", "messages must be a non-empty list")
	}
	for i, m := range arr {
		if m.Type() != fastjson.TypeObject {
			return t.b, badRequest("messages", "messages[%d] must be an object", i)
		}
		role := m.GetStringBytes("role")
		if string(role) != "user" && string(role) != "assistant" {
			return t.b, badRequest("messages", "messages[%d].role must be user or assistant", i)
		}
		c := m.Get("content")
		if c == nil || (c.Type() != fastjson.TypeString && c.Type() != fastjson.TypeArray) {
			return t.b, badRequest("messages", "messages[%d].content must be a string or a list of blocks", i)
		}
		if aerr := t.turn(role, c, i); aerr != nil {
			return t.b, aerr
		}
	}
	t.generationPrompt()
	return t.b, nil
}

// turn renders one message: its tool_result blocks as tool messages, then its other blocks as
// a message of its role (omitted when there are none, as vLLM omits it).
func (t *chatTemplate) turn(role []byte, c *fastjson.Value, i int) *apiError {
	if c.Type() == fastjson.TypeString {
		s, _ := c.StringBytes()
		t.message(role, nil, nil)
		t.text(s)
		t.end()
		return nil
	}
	blocks, _ := c.Array()
	others := 0
	for j, b := range blocks {
		if b.Type() != fastjson.TypeObject {
			return badRequest("messages", "messages[%d].content[%d] must be an object", i, j)
		}
		if string(b.GetStringBytes("type")) != "tool_result" {
			others++
			continue
		}
		t.toolResult(b.GetStringBytes("tool_use_id"))
		if rc := b.Get("content"); rc != nil && rc.Type() != fastjson.TypeNull {
			if aerr := t.blocks(rc, "messages"); aerr != nil {
				return aerr
			}
		}
		t.end()
	}
	if others == 0 {
		return nil
	}
	t.message(role, nil, nil)
	for _, b := range blocks {
		switch string(b.GetStringBytes("type")) {
		case "tool_result":
		case "tool_use":
			t.toolCallOpen(b.GetStringBytes("name"))
			if in := b.Get("input"); in != nil {
				t.b = in.MarshalTo(t.b)
			} else {
				t.b = append(t.b, "{}"...)
			}
			t.toolCallEnd()
		default:
			if aerr := t.block(b, "messages"); aerr != nil {
				return aerr
			}
		}
	}
	t.end()
	return nil
}

// blocks renders a string, or a list of text and media blocks.
func (t *chatTemplate) blocks(c *fastjson.Value, param string) *apiError {
	switch c.Type() {
	case fastjson.TypeString:
		s, _ := c.StringBytes()
		t.text(s)
		return nil
	case fastjson.TypeArray:
		list, _ := c.Array()
		for _, b := range list {
			if aerr := t.block(b, param); aerr != nil {
				return aerr
			}
		}
		return nil
	}
	return badRequest(param, "%s must be a string or a list of blocks", param)
}

// block renders a content block as a chat content part: a text block as its text, any other
// block as <|media:HASH|>.
func (t *chatTemplate) block(b *fastjson.Value, param string) *apiError {
	switch t.part(b) {
	case partNotObject:
		return badRequest(param, "content blocks must be objects")
	case partTextNotString:
		return badRequest(param, "a text block's text must be a string")
	case partNoType:
		return badRequest(param, "a content block's type is required")
	}
	return nil
}

func appendJSONString(dst, s []byte) []byte {
	q, _ := json.Marshal(string(s))
	return append(dst, q...)
}

// appendMessagesUsage appends Anthropic's usage object for rq after completion output tokens.
func appendMessagesUsage(b []byte, rq *Request, completion int) []byte {
	cached := rq.CachedTokens()
	b = append(b, `"usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(rq.promptLen-cached), 10)
	b = append(b, `,"cache_creation_input_tokens":0,"cache_read_input_tokens":`...)
	b = strconv.AppendInt(b, int64(cached), 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	return append(b, '}')
}

// appendMessageHead appends a message object up to its "content" value.
func (r *Replica) appendMessageHead(b, id []byte) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","type":"message","role":"assistant","model":`...)
	b = append(b, r.modelJSON...)
	return append(b, `,"content":`...)
}

// streamMessages writes the response as Anthropic's server-sent events, one
// content_block_delta per token. message_start goes out with the first token, as vLLM sends
// it (its usage carries the prompt and cached tokens), message_delta with the output tokens at
// the end.
func (r *Replica) streamMessages(w http.ResponseWriter, req *http.Request, rq *Request, id []byte, bp *[]byte) {
	r.streamEvents(w, req, rq, bp, func(b []byte, sent int) []byte {
		if sent == 0 {
			b = append(b, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":"...)
			b = r.appendMessageHead(b, id)
			b = append(b, `[],"stop_reason":null,"stop_sequence":null,`...)
			b = appendMessagesUsage(b, rq, 0)
			b = append(b, "}}\n\n"...)
			b = append(b, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
		}
		b = append(b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""...)
		b = append(b, rq.OutputWord(sent)...)
		return append(b, "\"}}\n\n"...)
	}, func(b []byte, sent int) []byte {
		b = append(b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
		b = append(b, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":"...)
		b = strconv.AppendInt(b, int64(sent), 10)
		b = append(b, "}}\n\n"...)
		return append(b, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
	})
}

// respondMessages waits for the whole generation and writes one message object.
func (r *Replica) respondMessages(w http.ResponseWriter, req *http.Request, rq *Request, id []byte, bp *[]byte) {
	ctx := req.Context()
	for !rq.Done() {
		select {
		case <-rq.Ready():
		case <-ctx.Done():
			return
		case <-r.quit:
			return
		}
	}
	n := rq.Generated()
	if n < rq.maxTokens {
		writeAPIError(w, epMessages, &apiError{status: 503, typ: "api_error", msg: "request aborted"})
		return
	}
	b := r.appendMessageHead((*bp)[:0], id)
	b = append(b, `[{"type":"text","text":"`...)
	for i := range n {
		b = append(b, rq.OutputWord(i)...)
	}
	b = append(b, `"}],"stop_reason":"max_tokens","stop_sequence":null,`...)
	b = appendMessagesUsage(b, rq, n)
	b = append(b, '}')
	*bp = b
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// writeAPIError writes e in the shape of the endpoint's API: Anthropic's
// {"type":"error","error":{"type","message"}} for /v1/messages, OpenAI's otherwise.
func writeAPIError(w http.ResponseWriter, ep endpoint, e *apiError) {
	if ep != epMessages {
		writeError(w, e)
		return
	}
	out, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": e.typ, "message": e.msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_, _ = w.Write(out)
}
