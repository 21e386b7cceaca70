package key

// Canonical rendering.
//
// The prompt of a chat or Responses API request is rendered as a byte stream in which every
// variable-length item is preceded by a one-byte tag and length-framed, except message text,
// which is NUL-terminated so that a text extending another shares its chunks; so the stream
// parses back one way ("ab"+"c" never renders like "a"+"bc"):
//
//	stream  = header* item*
//	header  = 'W' canon   ; "tools"           (each only when present and not null,
//	        | 'X' canon   ; "functions"        in this fixed order)
//	        | 'Y' canon   ; "response_format"
//	item    = message | 'Z' canon              ; 'Z': an unknown Responses API input item
//	message = 'M' str(role) ['N' str(name)] content* call* ['D' str(tool_call_id)]
//	content = 'T' text 0x00                    ; string content, text/input_text/output_text/refusal parts
//	        | 'I' str(part type) u64(hash)     ; any other part: xxhash64 of its URL or data
//	call    = 'F' str(function name) args      ; tool_calls[].function, legacy function_call
//	        | 'G' canon                        ; a tool call that has no "function" object
//	args    = 'A' str(arguments) | canon       ; arguments are usually a JSON string
//	canon   = '{' ('"' str(key) canon)* '}' | '[' canon* ']' | '"' str(s) | '#' str(number text)
//	        | 't' | 'f' | 'n'
//	str(b)  = uvarint(len(b)) b
//	u64(h)  = 8 bytes little-endian
//
// Strings are hashed after JSON unescaping ("\u00e9" and "é" render alike). "canon" is a
// re-encoding of the parsed value, not the raw bytes: whitespace and escapes do not matter,
// but object key order does (a backend template renders free-form dicts such as a tool's JSON
// schema in the client's order, so keeping it can only cost a hit, never fake one). Media
// parts are replaced by the hash of their URL or data (image_url.url, input_audio.data,
// file.file_data or file_id, video_url.url, audio_url.url, input_image's image_url or file_id,
// input_file's file_data, file_id or file_url); a part of another type, or one without that
// field, by the hash of its whole canonical encoding. A string content renders like a list
// holding one text part.
//
// Responses API requests render like chat: "instructions" as a system message, a string
// "input" as a user message; input items of type "message" (or with a role and no type) as
// messages, "function_call" as an assistant message with one call, "function_call_output" as
// a tool message (output, then call_id as tool_call_id), anything else as 'Z' canon.
//
// Prefix property: nothing in the stream depends on what comes after it or on the number of
// messages (no generation prompt is appended), so the rendering of messages[0..n] is a byte
// prefix of the rendering of messages[0..n+1] and its chunk hashes a prefix of theirs.
//
// Completions prompts are not framed: a text prompt renders as its UTF-8 bytes (so a prompt
// that extends another shares its chunks), a token-id prompt as one little-endian uint32 per
// id. The kind is mixed into the seed instead.
//
// Chat framing adds a few bytes per message (tag, role, lengths), close to the few tokens a
// chat template adds per message, and is counted in PromptTokens like the text.

import (
	"encoding/binary"
	"math"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

const (
	tagTools     = 'W'
	tagFunctions = 'X'
	tagRespFmt   = 'Y'
	tagItem      = 'Z'
	tagMessage   = 'M'
	tagName      = 'N'
	tagText      = 'T'
	tagMedia     = 'I'
	tagCall      = 'F'
	tagCallOther = 'G'
	tagArgs      = 'A'
	tagCallID    = 'D'
)

var (
	roleSystem    = []byte("system")
	roleUser      = []byte("user")
	roleAssistant = []byte("assistant")
	roleTool      = []byte("tool")
)

// renderer writes the canonical stream to the chunker, or, while toSide is set, to the side
// digest (used to hash a media part down to 8 bytes).
type renderer struct {
	c      *chunker
	side   xxhash.Digest
	toSide bool
	num    []byte
	tmp    [1 + binary.MaxVarintLen64 + 8]byte
	ids    [256]byte
}

func (r *renderer) reset() {
	r.c = nil
	r.toSide = false
}

func (s *state) reset() {
	s.f.reset()
	s.r.reset()
	s.c.reset()
}

func (r *renderer) emit(p []byte) {
	if r.toSide {
		_, _ = r.side.Write(p)
		return
	}
	r.c.write(p)
}

func (r *renderer) tag(t byte) {
	r.tmp[0] = t
	r.emit(r.tmp[:1])
}

// str emits tag, uvarint(len(b)), b.
func (r *renderer) str(t byte, b []byte) {
	r.tmp[0] = t
	n := binary.PutUvarint(r.tmp[1:], uint64(len(b)))
	r.emit(r.tmp[:1+n])
	r.emit(b)
}

// text emits tag, b, 0x00. Text is not length-framed, unlike other strings: a message whose
// text extends another's (a document followed by a question, a growing completion-style chat
// prompt) must share its leading chunks, as it shares the engine's KV blocks. The terminator
// keeps "ab"+"c" apart from "a"+"bc"; text holding NUL (\u0000) can make two renderings
// collide, which costs at most one misrouted request, never a wrong answer.
func (r *renderer) text(b []byte) {
	r.tmp[0] = tagText
	r.emit(r.tmp[:1])
	r.emit(b)
	r.tmp[0] = 0
	r.emit(r.tmp[:1])
}

func (r *renderer) media(typ []byte, h uint64) {
	r.str(tagMedia, typ)
	binary.LittleEndian.PutUint64(r.tmp[:8], h)
	r.emit(r.tmp[:8])
}

// seed hashes the key-format version, the prompt kind, the model and the cache salt.
func (r *renderer) seed(kind byte, model, salt []byte) uint64 {
	r.side.Reset()
	_, _ = r.side.WriteString(seedDomain)
	r.toSide = true
	r.tag(kind)
	r.str('m', model)
	r.str('s', salt)
	r.toSide = false
	return r.side.Sum64()
}

// sideHash returns xxhash64 of the canonical encoding of v.
func (r *renderer) sideHash(v *fastjson.Value) uint64 {
	r.side.Reset()
	r.toSide = true
	r.canon(v)
	r.toSide = false
	return r.side.Sum64()
}

// canon emits the canonical encoding of v. Depth is bounded by the parser (fastjson.MaxDepth).
func (r *renderer) canon(v *fastjson.Value) {
	switch v.Type() {
	case fastjson.TypeObject:
		r.tag('{')
		o, _ := v.Object()
		o.Visit(func(key []byte, v *fastjson.Value) {
			r.str('"', key)
			r.canon(v)
		})
		r.tag('}')
	case fastjson.TypeArray:
		r.tag('[')
		a, _ := v.Array()
		for _, e := range a {
			r.canon(e)
		}
		r.tag(']')
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		r.str('"', b)
	case fastjson.TypeNumber:
		r.num = v.MarshalTo(r.num[:0])
		r.str('#', r.num)
	case fastjson.TypeTrue:
		r.tag('t')
	case fastjson.TypeFalse:
		r.tag('f')
	default:
		r.tag('n')
	}
}

func present(v *fastjson.Value) bool { return v != nil && v.Type() != fastjson.TypeNull }

// header emits tools, functions and response_format, in that order.
func (r *renderer) header(t *top) bool {
	if present(t.tools) {
		r.tag(tagTools)
		r.canon(t.tools)
	}
	if present(t.functions) {
		r.tag(tagFunctions)
		r.canon(t.functions)
	}
	if present(t.responseFormat) {
		r.tag(tagRespFmt)
		r.canon(t.responseFormat)
	}
	return true
}

// chatMessages renders a chat "messages" array; absent or not an array is no prompt.
func (r *renderer) chatMessages(v *fastjson.Value) bool {
	if v == nil || v.Type() != fastjson.TypeArray {
		return false
	}
	a, _ := v.Array()
	for _, m := range a {
		if !r.message(m) {
			return false
		}
	}
	return true
}

// stringField is an optional string: absent/null renders nothing, a string renders, anything
// else is a type error.
func stringField(v *fastjson.Value) (b []byte, has, ok bool) {
	if !present(v) {
		return nil, false, true
	}
	if v.Type() != fastjson.TypeString {
		return nil, false, false
	}
	b, _ = v.StringBytes()
	return b, true, true
}

func (r *renderer) message(m *fastjson.Value) bool {
	if m.Type() != fastjson.TypeObject {
		return false
	}
	o, _ := m.Object()
	var role, name, content, calls, callID, fcall *fastjson.Value
	o.Visit(func(key []byte, v *fastjson.Value) {
		switch string(key) {
		case "role":
			role = v
		case "name":
			name = v
		case "content":
			content = v
		case "tool_calls":
			calls = v
		case "tool_call_id":
			callID = v
		case "function_call":
			fcall = v
		}
	})
	roleB, _, ok := stringField(role)
	if !ok {
		return false
	}
	nameB, hasName, ok := stringField(name)
	if !ok {
		return false
	}
	idB, hasID, ok := stringField(callID)
	if !ok {
		return false
	}
	r.str(tagMessage, roleB)
	if hasName {
		r.str(tagName, nameB)
	}
	if !r.content(content) {
		return false
	}
	if present(calls) {
		if calls.Type() != fastjson.TypeArray {
			return false
		}
		a, _ := calls.Array()
		for _, c := range a {
			if !r.toolCall(c) {
				return false
			}
		}
	}
	if present(fcall) && !r.function(fcall) {
		return false
	}
	if hasID {
		r.str(tagCallID, idB)
	}
	return true
}

func (r *renderer) toolCall(c *fastjson.Value) bool {
	if c.Type() != fastjson.TypeObject {
		return false
	}
	o, _ := c.Object()
	var fn *fastjson.Value
	o.Visit(func(key []byte, v *fastjson.Value) {
		if string(key) == "function" {
			fn = v
		}
	})
	if !present(fn) {
		r.tag(tagCallOther)
		r.canon(c)
		return true
	}
	return r.function(fn)
}

// function renders {name, arguments}.
func (r *renderer) function(fn *fastjson.Value) bool {
	if fn.Type() != fastjson.TypeObject {
		return false
	}
	o, _ := fn.Object()
	var name, args *fastjson.Value
	o.Visit(func(key []byte, v *fastjson.Value) {
		switch string(key) {
		case "name":
			name = v
		case "arguments":
			args = v
		}
	})
	return r.call(name, args)
}

func (r *renderer) call(name, args *fastjson.Value) bool {
	nameB, _, ok := stringField(name)
	if !ok {
		return false
	}
	r.str(tagCall, nameB)
	switch {
	case !present(args):
		r.str(tagArgs, nil)
	case args.Type() == fastjson.TypeString:
		b, _ := args.StringBytes()
		r.str(tagArgs, b)
	default:
		r.canon(args)
	}
	return true
}

// content renders a message content: absent/null nothing, a string one text item, an array
// its parts; anything else is a type error.
func (r *renderer) content(v *fastjson.Value) bool {
	if !present(v) {
		return true
	}
	switch v.Type() {
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		r.text(b)
		return true
	case fastjson.TypeArray:
		a, _ := v.Array()
		for _, p := range a {
			if !r.part(p) {
				return false
			}
		}
		return true
	}
	return false
}

// urlOrString returns v itself when it is a string, else its string field "field".
func urlOrString(v *fastjson.Value, field string) []byte {
	if v == nil {
		return nil
	}
	switch v.Type() {
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		return b
	case fastjson.TypeObject:
		o, _ := v.Object()
		var f *fastjson.Value
		o.Visit(func(key []byte, v *fastjson.Value) {
			if string(key) == field {
				f = v
			}
		})
		if f != nil && f.Type() == fastjson.TypeString {
			b, _ := f.StringBytes()
			return b
		}
	}
	return nil
}

// firstString returns the first of vs that is a string (in argument order).
func firstString(vs ...*fastjson.Value) []byte {
	for _, v := range vs {
		if v != nil && v.Type() == fastjson.TypeString {
			b, _ := v.StringBytes()
			return b
		}
	}
	return nil
}

// part renders one content part (chat or Responses API).
func (r *renderer) part(p *fastjson.Value) bool {
	if p.Type() != fastjson.TypeObject {
		return false
	}
	o, _ := p.Object()
	var typ, text, refusal, imageURL, audio, file, videoURL, audioURL, fileID, fileData, fileURL *fastjson.Value
	o.Visit(func(key []byte, v *fastjson.Value) {
		switch string(key) {
		case "type":
			typ = v
		case "text":
			text = v
		case "refusal":
			refusal = v
		case "image_url":
			imageURL = v
		case "input_audio":
			audio = v
		case "file":
			file = v
		case "video_url":
			videoURL = v
		case "audio_url":
			audioURL = v
		case "file_id":
			fileID = v
		case "file_data":
			fileData = v
		case "file_url":
			fileURL = v
		}
	})
	typB, _, ok := stringField(typ)
	if !ok {
		return false
	}
	var payload []byte
	switch string(typB) {
	case "text", "input_text", "output_text":
		if text == nil || text.Type() != fastjson.TypeString {
			return false
		}
		b, _ := text.StringBytes()
		r.text(b)
		return true
	case "refusal":
		if refusal == nil || refusal.Type() != fastjson.TypeString {
			return false
		}
		b, _ := refusal.StringBytes()
		r.text(b)
		return true
	case "image_url":
		payload = urlOrString(imageURL, "url")
	case "video_url":
		payload = urlOrString(videoURL, "url")
	case "audio_url":
		payload = urlOrString(audioURL, "url")
	case "input_audio":
		payload = urlOrString(audio, "data")
	case "file":
		if payload = urlOrString(file, "file_data"); payload == nil {
			payload = urlOrString(file, "file_id")
		}
	case "input_image":
		payload = firstString(imageURL, fileID)
	case "input_file":
		payload = firstString(fileData, fileID, fileURL)
	}
	if payload != nil {
		r.media(typB, xxhash.Sum64(payload))
	} else {
		r.media(typB, r.sideHash(p))
	}
	return true
}

// responsesInput renders "instructions" then "input"; neither present is no prompt.
func (r *renderer) responsesInput(instr, input *fastjson.Value) bool {
	instrB, hasInstr, ok := stringField(instr)
	if !ok {
		return false
	}
	if hasInstr {
		r.str(tagMessage, roleSystem)
		r.text(instrB)
	}
	if !present(input) {
		return hasInstr
	}
	switch input.Type() {
	case fastjson.TypeString:
		b, _ := input.StringBytes()
		r.str(tagMessage, roleUser)
		r.text(b)
		return true
	case fastjson.TypeArray:
		a, _ := input.Array()
		for _, it := range a {
			if !r.item(it) {
				return false
			}
		}
		return true
	}
	return false
}

func (r *renderer) item(it *fastjson.Value) bool {
	if it.Type() != fastjson.TypeObject {
		return false
	}
	o, _ := it.Object()
	var typ, role, name, args, callID, output *fastjson.Value
	o.Visit(func(key []byte, v *fastjson.Value) {
		switch string(key) {
		case "type":
			typ = v
		case "role":
			role = v
		case "name":
			name = v
		case "arguments":
			args = v
		case "call_id":
			callID = v
		case "output":
			output = v
		}
	})
	typB, hasType, ok := stringField(typ)
	if !ok {
		return false
	}
	switch {
	case string(typB) == "message" || (!hasType && role != nil):
		// Same fields as a chat message (role, content), read by the chat renderer.
		return r.message(it)
	case string(typB) == "function_call":
		r.str(tagMessage, roleAssistant)
		return r.call(name, args)
	case string(typB) == "function_call_output":
		idB, hasID, ok := stringField(callID)
		if !ok {
			return false
		}
		r.str(tagMessage, roleTool)
		if present(output) && output.Type() != fastjson.TypeString && output.Type() != fastjson.TypeArray {
			r.media(typB, r.sideHash(output))
		} else if !r.content(output) {
			return false
		}
		if hasID {
			r.str(tagCallID, idB)
		}
		return true
	}
	r.tag(tagItem)
	r.canon(it)
	return true
}

// completionsPrompt classifies a completions "prompt": a string, a list of strings (the first
// is keyed: a batch is routed as one request, and its first prompt stands for it), a list of
// token ids, or a list of lists of token ids (the first list is keyed). Elements of a list must
// all have the first element's type. An empty list is a well-typed empty prompt.
func completionsPrompt(v *fastjson.Value) (kind byte, p *fastjson.Value, ok bool) {
	if v == nil {
		return 0, nil, false
	}
	switch v.Type() {
	case fastjson.TypeString:
		return kindText, v, true
	case fastjson.TypeArray:
	default:
		return 0, nil, false
	}
	a, _ := v.Array()
	if len(a) == 0 {
		return kindText, nil, true
	}
	first := a[0].Type()
	for _, e := range a[1:] {
		if e.Type() != first {
			return 0, nil, false
		}
	}
	switch first {
	case fastjson.TypeString:
		return kindText, a[0], true
	case fastjson.TypeNumber:
		return kindIDs, v, true
	case fastjson.TypeArray:
		return kindIDs, a[0], true
	}
	return 0, nil, false
}

// completionsPrompt renders the prompt chosen by completionsPrompt.
func (r *renderer) completionsPrompt(kind byte, p *fastjson.Value) bool {
	if p == nil {
		return true
	}
	if kind == kindText {
		b, _ := p.StringBytes()
		r.emit(b)
		return true
	}
	a, _ := p.Array()
	n := 0
	for _, e := range a {
		if e.Type() != fastjson.TypeNumber {
			return false
		}
		id, err := e.Uint64()
		if err != nil || id > math.MaxUint32 {
			return false
		}
		binary.LittleEndian.PutUint32(r.ids[n:], uint32(id))
		if n += 4; n == len(r.ids) {
			r.emit(r.ids[:n])
			n = 0
		}
	}
	r.emit(r.ids[:n])
	return true
}
