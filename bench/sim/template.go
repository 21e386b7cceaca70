package sim

import (
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// The sim's chat template (its own, in the spirit of vLLM applying a model's Jinja template).
// A conversation renders as
//
//	<|tools|>\n{tools JSON}<|end|>\n              only when "tools" is present
//	<|ROLE|>\n{content}<|end|>\n                  per message; <|ROLE name=NAME|> with a name
//	<|assistant|>\n                               the generation prompt
//
// Content is a string or a list of parts: text parts are copied, other parts (image_url,
// input_audio, …) become <|media:HASH|> of their JSON. An assistant message's tool_calls follow
// its content as <|tool_call|>NAME ARGUMENTS\n, a tool message's tool_call_id goes in the role tag.
// Rendering turn n of a conversation is a prefix of rendering turn n+1 up to the generation
// prompt, which turn n+1 continues with the assistant's answer, so multi-turn chats share cached
// prefixes as on vLLM.
//
// chatTemplate writes these productions; renderChat (request.go) and renderMessages
// (messages.go) read their API's request and render it through them, so a conversation sent
// through either API is the same prompt.

// chatTemplate appends the template's productions to b.
type chatTemplate struct{ b []byte }

// toolsOpen opens the tools section; the tools' JSON follows, then end.
func (t *chatTemplate) toolsOpen() { t.b = append(t.b, "<|tools|>\n"...) }

// message opens a message: <|ROLE|>, with " name=NAME" and " id=ID" when they are not empty,
// then a newline; its content follows, then end.
func (t *chatTemplate) message(role, name, id []byte) {
	t.b = append(t.b, "<|"...)
	t.b = append(t.b, role...)
	if len(name) > 0 {
		t.b = append(t.b, " name="...)
		t.b = append(t.b, name...)
	}
	if len(id) > 0 {
		t.b = append(t.b, " id="...)
		t.b = append(t.b, id...)
	}
	t.b = append(t.b, "|>\n"...)
}

// toolResult opens the tool message of a Messages API tool_result: <|tool id=ID|> and a
// newline, the id written even when it is empty (a chat tool message without a tool_call_id
// has none).
func (t *chatTemplate) toolResult(id []byte) {
	t.b = append(t.b, "<|tool id="...)
	t.b = append(t.b, id...)
	t.b = append(t.b, "|>\n"...)
}

// end closes the tools section or a message.
func (t *chatTemplate) end() { t.b = append(t.b, "<|end|>\n"...) }

// text appends content text as it is.
func (t *chatTemplate) text(s []byte) { t.b = append(t.b, s...) }

// toolCallOpen opens a tool call, "<|tool_call|>NAME "; its arguments follow, then toolCallEnd.
func (t *chatTemplate) toolCallOpen(name []byte) {
	t.b = append(t.b, "<|tool_call|>"...)
	t.b = append(t.b, name...)
	t.b = append(t.b, ' ')
}

// toolCallEnd closes a tool call.
func (t *chatTemplate) toolCallEnd() { t.b = append(t.b, '\n') }

// generationPrompt appends the prompt for the assistant's answer, which ends the conversation.
func (t *chatTemplate) generationPrompt() { t.b = append(t.b, "<|assistant|>\n"...) }

// partFault is why a content part (chat) or block (Messages API) cannot be rendered.
type partFault uint8

const (
	partOK            partFault = iota
	partNotObject               // the part is not an object
	partTextNotString           // a text part whose "text" is not a string
	partNoType                  // a part without a "type"
)

// part appends a content part: a text part's text, any other part as <|media:HASH|>, the
// xxhash64 (hex) of its JSON.
func (t *chatTemplate) part(p *fastjson.Value) partFault {
	if p.Type() != fastjson.TypeObject {
		return partNotObject
	}
	typ := p.GetStringBytes("type")
	if string(typ) == "text" {
		s := p.Get("text")
		if s == nil || s.Type() != fastjson.TypeString {
			return partTextNotString
		}
		text, _ := s.StringBytes()
		t.text(text)
		return partOK
	}
	if len(typ) == 0 {
		return partNoType
	}
	var tmp [64]byte
	h := xxhash.Sum64(p.MarshalTo(tmp[:0]))
	t.b = append(t.b, "<|media:"...)
	t.b = strconv.AppendUint(t.b, h, 16)
	t.b = append(t.b, "|>"...)
	return partOK
}
