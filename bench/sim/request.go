package sim

import (
	"fmt"
	"slices"

	"github.com/valyala/fastjson"
)

// apiRequest is what the sim takes from a request body.
type apiRequest struct {
	chat         bool
	model        string
	stream       bool
	includeUsage bool
	maxTokens    int
	seed         uint64
	tokens       []uint32
}

// apiError is a client error with its HTTP status.
type apiError struct {
	status int
	typ    string
	code   string
	param  string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: 400, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

var parserPool fastjson.ParserPool

// endpoint is the API a generate request came in on.
type endpoint uint8

const (
	epCompletions endpoint = iota // /v1/completions
	epChat                        // /v1/chat/completions
	epMessages                    // /v1/messages (messages.go)
)

// parseRequest decodes a /v1/chat/completions, /v1/completions or /v1/messages body. scratch
// is a reusable render buffer; the returned request owns its token slice.
func parseRequest(body []byte, ep endpoint, cfg *Config, scratch *[]byte) (*apiRequest, *apiError) {
	chat := ep != epCompletions
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, badRequest("", "invalid JSON body: %v", err)
	}
	if v.Type() != fastjson.TypeObject {
		return nil, badRequest("", "request body must be a JSON object")
	}
	req := &apiRequest{chat: chat, model: cfg.Model, maxTokens: cfg.DefaultMaxTokens}

	if m := v.Get("model"); m != nil && m.Type() != fastjson.TypeNull {
		s, err := m.StringBytes()
		if err != nil {
			return nil, badRequest("model", "model must be a string")
		}
		if string(s) != cfg.Model && !slices.Contains(cfg.Adapters, string(s)) {
			return nil, &apiError{status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model",
				msg: fmt.Sprintf("The model `%s` does not exist.", s)}
		}
		req.model = string(s)
	}
	if s := v.Get("stream"); s != nil && s.Type() != fastjson.TypeNull {
		b, err := s.Bool()
		if err != nil {
			return nil, badRequest("stream", "stream must be a boolean")
		}
		req.stream = b
	}
	if so := v.Get("stream_options"); so != nil && so.Type() != fastjson.TypeNull {
		if so.Type() != fastjson.TypeObject {
			return nil, badRequest("stream_options", "stream_options must be an object")
		}
		if iu := so.Get("include_usage"); iu != nil && iu.Type() != fastjson.TypeNull {
			b, err := iu.Bool()
			if err != nil {
				return nil, badRequest("stream_options.include_usage", "include_usage must be a boolean")
			}
			req.includeUsage = b
		}
	}
	// max_completion_tokens wins over the deprecated max_tokens, as in vLLM.
	for _, key := range []string{"max_tokens", "max_completion_tokens"} {
		mt := v.Get(key)
		if mt == nil || mt.Type() == fastjson.TypeNull {
			continue
		}
		n, err := mt.Int()
		if err != nil || n < 1 {
			return nil, badRequest(key, "%s must be an integer >= 1", key)
		}
		req.maxTokens = n
	}
	if nv := v.Get("n"); nv != nil && nv.Type() != fastjson.TypeNull {
		if n, err := nv.Int(); err != nil || n != 1 {
			return nil, badRequest("n", "the sim supports only n=1")
		}
	}
	salt := ""
	if cs := v.Get("cache_salt"); cs != nil && cs.Type() != fastjson.TypeNull {
		s, err := cs.StringBytes()
		if err != nil || len(s) == 0 {
			return nil, badRequest("cache_salt", "cache_salt must be a non-empty string")
		}
		salt = string(s)
	}
	req.seed = ChainSeed(req.model, salt) // an adapter's cache is its own

	if chat {
		render := renderChat
		if ep == epMessages {
			render = renderMessages
		}
		buf, aerr := render((*scratch)[:0], v)
		*scratch = buf
		if aerr != nil {
			return nil, aerr
		}
		req.tokens = Tokenize(make([]uint32, 0, len(buf)/3+8), buf)
	} else {
		toks, aerr := promptTokens(v.Get("prompt"))
		if aerr != nil {
			return nil, aerr
		}
		req.tokens = toks
	}
	if len(req.tokens) == 0 {
		return nil, badRequest("prompt", "the prompt is empty")
	}
	return req, nil
}

// promptTokens reads a completions prompt: a string, a list of token ids (used as they are), or
// a one-element list of either.
func promptTokens(p *fastjson.Value) ([]uint32, *apiError) {
	if p == nil || p.Type() == fastjson.TypeNull {
		return nil, badRequest("prompt", "prompt is required")
	}
	switch p.Type() {
	case fastjson.TypeString:
		s, _ := p.StringBytes()
		return Tokenize(make([]uint32, 0, len(s)/3+8), s), nil
	case fastjson.TypeArray:
		arr, _ := p.Array()
		if len(arr) == 0 {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		if t := arr[0].Type(); t == fastjson.TypeString || t == fastjson.TypeArray {
			if len(arr) != 1 {
				return nil, badRequest("prompt", "the sim supports one prompt per request, got %d", len(arr))
			}
			return promptTokens(arr[0])
		}
		ids := make([]uint32, 0, len(arr))
		for _, x := range arr {
			n, err := x.Int64()
			if err != nil || n < 0 || n > 1<<32-1 {
				return nil, badRequest("prompt", "prompt token ids must be integers in [0, 2^32)")
			}
			ids = append(ids, uint32(n))
		}
		return ids, nil
	}
	return nil, badRequest("prompt", "prompt must be a string or a list of token ids")
}

// renderChat appends the templated conversation (template.go) of a chat request to dst.
func renderChat(dst []byte, v *fastjson.Value) ([]byte, *apiError) {
	t := chatTemplate{b: dst}
	if tools := v.Get("tools"); tools != nil && tools.Type() != fastjson.TypeNull {
		if tools.Type() != fastjson.TypeArray {
			return t.b, badRequest("tools", "tools must be a list")
		}
		t.toolsOpen()
		t.b = tools.MarshalTo(t.b)
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
		if len(role) == 0 {
			return t.b, badRequest("messages", "messages[%d].role must be a non-empty string", i)
		}
		t.message(role, m.GetStringBytes("name"), m.GetStringBytes("tool_call_id"))
		if aerr := t.chatContent(m.Get("content"), i); aerr != nil {
			return t.b, aerr
		}
		if calls := m.Get("tool_calls"); calls != nil && calls.Type() == fastjson.TypeArray {
			list, _ := calls.Array()
			for _, c := range list {
				t.toolCallOpen(c.GetStringBytes("function", "name"))
				t.text(c.GetStringBytes("function", "arguments"))
				t.toolCallEnd()
			}
		}
		t.end()
	}
	t.generationPrompt()
	return t.b, nil
}

// chatContent renders the content c of message i: absent or null nothing, a string as it is,
// a list part by part.
func (t *chatTemplate) chatContent(c *fastjson.Value, i int) *apiError {
	if c == nil {
		return nil
	}
	switch c.Type() {
	case fastjson.TypeNull:
		return nil
	case fastjson.TypeString:
		s, _ := c.StringBytes()
		t.text(s)
		return nil
	case fastjson.TypeArray:
		parts, _ := c.Array()
		for j, p := range parts {
			switch t.part(p) {
			case partNotObject:
				return badRequest("messages", "messages[%d].content[%d] must be an object", i, j)
			case partTextNotString:
				return badRequest("messages", "messages[%d].content[%d].text must be a string", i, j)
			case partNoType:
				return badRequest("messages", "messages[%d].content[%d].type is required", i, j)
			}
		}
		return nil
	}
	return badRequest("messages", "messages[%d].content must be a string, a list of parts or null", i)
}
