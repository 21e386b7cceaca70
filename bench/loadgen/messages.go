package loadgen

// The Messages API (/v1/messages, Anthropic's shape as vLLM and SGLang serve it): a chat
// request converted as a coding agent would send it, and its event stream read.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/bench/workload"
)

// MessagesAPI is Client.API's value that sends chat workloads to /v1/messages.
const MessagesAPI = "messages"

type messagesRequest struct {
	Model     string            `json:"model"`
	System    string            `json:"system,omitempty"`
	Tools     []messagesTool    `json:"tools,omitempty"`
	Messages  []messagesMessage `json:"messages"`
	MaxTokens int               `json:"max_tokens"`
	Stream    bool              `json:"stream"`
	IgnoreEOS bool              `json:"ignore_eos,omitempty"`
}

type messagesTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type messagesMessage struct {
	Role    string          `json:"role"`
	Content []messagesBlock `json:"content"`
}

// messagesBlock is a text, tool_use or tool_result block.
type messagesBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   string          `json:"content,omitempty"`
}

// toMessagesRequest converts a chat conversation to a Messages API body: system messages
// joined into "system", OpenAI tools to {name, description, input_schema}, an assistant's tool
// calls to tool_use blocks after its text, tool messages to tool_result blocks of a user
// message; consecutive messages of one role merge into one (the API alternates roles).
func toMessagesRequest(model string, maxTokens int, ignoreEOS bool, msgs []workload.Message, tools json.RawMessage) (*messagesRequest, error) {
	body := &messagesRequest{Model: model, MaxTokens: maxTokens, Stream: true, IgnoreEOS: ignoreEOS}
	if len(tools) > 0 {
		var oa []struct {
			Function struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(tools, &oa); err != nil {
			return nil, errors.New("tools: " + err.Error())
		}
		for _, t := range oa {
			schema := t.Function.Parameters
			if len(schema) == 0 {
				schema = json.RawMessage(`{}`)
			}
			body.Tools = append(body.Tools, messagesTool{t.Function.Name, t.Function.Description, schema})
		}
	}
	var system []string
	for _, m := range msgs {
		var role string
		var blocks []messagesBlock
		switch m.Role {
		case "system":
			system = append(system, m.Content)
			continue
		case "tool":
			role = "user"
			blocks = []messagesBlock{{Type: "tool_result", ToolUseID: m.ToolCallID, Content: m.Content}}
		case "assistant":
			role = "assistant"
			if m.Content != "" {
				blocks = append(blocks, messagesBlock{Type: "text", Text: m.Content})
			}
			for _, c := range m.ToolCalls {
				input := json.RawMessage(c.Function.Arguments)
				if !json.Valid(input) {
					input = json.RawMessage(`{}`)
				}
				blocks = append(blocks, messagesBlock{Type: "tool_use", ID: c.ID, Name: c.Function.Name, Input: input})
			}
		default:
			role = "user"
			blocks = []messagesBlock{{Type: "text", Text: m.Content}}
		}
		if len(blocks) == 0 {
			continue
		}
		if n := len(body.Messages); n > 0 && body.Messages[n-1].Role == role {
			body.Messages[n-1].Content = append(body.Messages[n-1].Content, blocks...)
		} else {
			body.Messages = append(body.Messages, messagesMessage{Role: role, Content: blocks})
		}
	}
	body.System = strings.Join(system, "\n\n")
	return body, nil
}

// messagesEvent is the part of a Messages API stream event the client reads.
type messagesEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *messagesUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Text string `json:"text"`
	} `json:"delta"`
	Usage *messagesUsage  `json:"usage"`
	Error json.RawMessage `json:"error"`
}

type messagesUsage struct {
	InputTokens   int `json:"input_tokens"`
	CacheRead     int `json:"cache_read_input_tokens"`
	CacheCreation int `json:"cache_creation_input_tokens"`
	OutputTokens  int `json:"output_tokens"`
}

// readMessagesStream reads a Messages API event stream to message_stop: TTFT and ITL from the
// content_block_delta events with text, prompt and cached tokens from message_start (prompt =
// input + cache_read + cache_creation), output tokens from message_delta.
func (c *Client) readMessagesStream(r io.Reader, res *Result, wait *patience) {
	br := bufio.NewReaderSize(r, 64<<10)
	var reply strings.Builder
	var last time.Time
	events, done := 0, false
	for !done {
		line, err := br.ReadBytes('\n')
		now := time.Now()
		line = bytes.TrimRight(line, "\r\n")
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok && len(bytes.TrimSpace(data)) > 0 {
			var ev messagesEvent
			if jerr := json.Unmarshal(bytes.TrimSpace(data), &ev); jerr != nil {
				res.Err = "bad chunk"
				return
			}
			switch ev.Type {
			case "error":
				res.Err = "stream error"
				return
			case "message_start":
				if ev.Message != nil && ev.Message.Usage != nil {
					u := ev.Message.Usage
					res.UsageSeen = true
					res.PromptTokens = u.InputTokens + u.CacheRead + u.CacheCreation
					res.CachedTokens = u.CacheRead
				}
			case "content_block_delta":
				if ev.Delta != nil && ev.Delta.Text != "" {
					if events == 0 {
						if !wait.settle() {
							return // too late: the client has left (Do marks it expired)
						}
						res.TTFT = now.Sub(res.Scheduled)
					} else {
						res.ITL = append(res.ITL, now.Sub(last))
					}
					last = now
					events++
					if c.MaxReplyBytes == 0 || reply.Len() < c.MaxReplyBytes {
						reply.WriteString(ev.Delta.Text)
					}
				}
			case "message_delta":
				if ev.Usage != nil {
					res.OutputTokens = ev.Usage.OutputTokens
				}
			case "message_stop":
				done = true
			}
		}
		if err != nil {
			if !done {
				if errors.Is(err, io.EOF) {
					res.Err = "truncated stream"
				} else {
					res.Err = transportReason(err)
				}
			}
			break
		}
	}
	res.Reply = reply.String()
	if res.Err == "" && events == 0 {
		res.Err = "no content"
	}
	if res.OutputTokens == 0 {
		res.OutputTokens = events
	}
}
