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

	"github.com/cespare/xxhash/v2"
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

// renderMessages appends the templated conversation of a Messages API request to dst.
func renderMessages(dst []byte, v *fastjson.Value) ([]byte, *apiError) {
	if tools := v.Get("tools"); tools != nil && tools.Type() != fastjson.TypeNull {
		if tools.Type() != fastjson.TypeArray {
			return dst, badRequest("tools", "tools must be a list")
		}
		list, _ := tools.Array()
		dst = append(dst, "<|tools|>\n["...)
		for i, t := range list {
			if t.Type() != fastjson.TypeObject {
				return dst, badRequest("tools", "tools[%d] must be an object", i)
			}
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"type":"function","function":{"name":`...)
			dst = appendJSONString(dst, t.GetStringBytes("name"))
			dst = append(dst, `,"description":`...)
			dst = appendJSONString(dst, t.GetStringBytes("description"))
			dst = append(dst, `,"parameters":`...)
			if s := t.Get("input_schema"); s != nil {
				dst = s.MarshalTo(dst)
			} else {
				dst = append(dst, "{}"...)
			}
			dst = append(dst, "}}"...)
		}
		dst = append(dst, "]<|end|>\n"...)
	}
	if sys := v.Get("system"); sys != nil && sys.Type() != fastjson.TypeNull {
		dst = append(dst, "<|system|>\n"...)
		var aerr *apiError
		if dst, aerr = renderBlocks(dst, sys, "system"); aerr != nil {
			return dst, aerr
		}
		dst = append(dst, "<|end|>\n"...)
	}
	msgs := v.Get("messages")
	if msgs == nil || msgs.Type() != fastjson.TypeArray {
		return dst, badRequest("messages", "messages must be a non-empty list")
	}
	arr, _ := msgs.Array()
	if len(arr) == 0 {
		return dst, badRequest("messages", "messages must be a non-empty list")
	}
	for i, m := range arr {
		if m.Type() != fastjson.TypeObject {
			return dst, badRequest("messages", "messages[%d] must be an object", i)
		}
		role := m.GetStringBytes("role")
		if string(role) != "user" && string(role) != "assistant" {
			return dst, badRequest("messages", "messages[%d].role must be user or assistant", i)
		}
		c := m.Get("content")
		if c == nil || (c.Type() != fastjson.TypeString && c.Type() != fastjson.TypeArray) {
			return dst, badRequest("messages", "messages[%d].content must be a string or a list of blocks", i)
		}
		var aerr *apiError
		if dst, aerr = renderTurn(dst, role, c, i); aerr != nil {
			return dst, aerr
		}
	}
	dst = append(dst, "<|assistant|>\n"...)
	return dst, nil
}

// renderTurn renders one message: its tool_result blocks as tool messages, then its other
// blocks as a message of its role (omitted when there are none, as vLLM omits it).
func renderTurn(dst, role []byte, c *fastjson.Value, i int) ([]byte, *apiError) {
	if c.Type() == fastjson.TypeString {
		s, _ := c.StringBytes()
		dst = appendRole(dst, role)
		dst = append(dst, s...)
		return append(dst, "<|end|>\n"...), nil
	}
	blocks, _ := c.Array()
	others := 0
	for j, b := range blocks {
		if b.Type() != fastjson.TypeObject {
			return dst, badRequest("messages", "messages[%d].content[%d] must be an object", i, j)
		}
		if string(b.GetStringBytes("type")) != "tool_result" {
			others++
			continue
		}
		dst = append(dst, "<|tool id="...)
		dst = append(dst, b.GetStringBytes("tool_use_id")...)
		dst = append(dst, "|>\n"...)
		if rc := b.Get("content"); rc != nil && rc.Type() != fastjson.TypeNull {
			var aerr *apiError
			if dst, aerr = renderBlocks(dst, rc, "messages"); aerr != nil {
				return dst, aerr
			}
		}
		dst = append(dst, "<|end|>\n"...)
	}
	if others == 0 {
		return dst, nil
	}
	dst = appendRole(dst, role)
	for _, b := range blocks {
		switch string(b.GetStringBytes("type")) {
		case "tool_result":
		case "tool_use":
			dst = append(dst, "<|tool_call|>"...)
			dst = append(dst, b.GetStringBytes("name")...)
			dst = append(dst, ' ')
			if in := b.Get("input"); in != nil {
				dst = in.MarshalTo(dst)
			} else {
				dst = append(dst, "{}"...)
			}
			dst = append(dst, '\n')
		default:
			var aerr *apiError
			if dst, aerr = renderBlock(dst, b, "messages"); aerr != nil {
				return dst, aerr
			}
		}
	}
	return append(dst, "<|end|>\n"...), nil
}

func appendRole(dst, role []byte) []byte {
	dst = append(dst, "<|"...)
	dst = append(dst, role...)
	return append(dst, "|>\n"...)
}

// renderBlocks renders a string, or a list of text and media blocks.
func renderBlocks(dst []byte, c *fastjson.Value, param string) ([]byte, *apiError) {
	switch c.Type() {
	case fastjson.TypeString:
		s, _ := c.StringBytes()
		return append(dst, s...), nil
	case fastjson.TypeArray:
		list, _ := c.Array()
		for _, b := range list {
			var aerr *apiError
			if dst, aerr = renderBlock(dst, b, param); aerr != nil {
				return dst, aerr
			}
		}
		return dst, nil
	}
	return dst, badRequest(param, "%s must be a string or a list of blocks", param)
}

// renderBlock renders a text block as its text, any other block as <|media:HASH|>.
func renderBlock(dst []byte, b *fastjson.Value, param string) ([]byte, *apiError) {
	if b.Type() != fastjson.TypeObject {
		return dst, badRequest(param, "content blocks must be objects")
	}
	typ := b.GetStringBytes("type")
	if string(typ) == "text" {
		t := b.Get("text")
		if t == nil || t.Type() != fastjson.TypeString {
			return dst, badRequest(param, "a text block's text must be a string")
		}
		s, _ := t.StringBytes()
		return append(dst, s...), nil
	}
	if len(typ) == 0 {
		return dst, badRequest(param, "a content block's type is required")
	}
	var tmp [64]byte
	h := xxhash.Sum64(b.MarshalTo(tmp[:0]))
	dst = append(dst, "<|media:"...)
	dst = strconv.AppendUint(dst, h, 16)
	return append(dst, "|>"...), nil
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
