package key

// The fast path.
//
// Most bodies are chat requests whose messages hold string role, name and content (or content
// parts: text, images, audio, files), maybe with tools and tool calls, or completions requests with a string or token-id
// prompt. For those, fastBuild renders the canonical stream (render.go) straight from the
// body, without a parse tree. A first pass validates the whole body, notes where the fields it
// needs start, and unescapes message contents and completions prompts into an arena (a string
// without escapes stays where it is in the body). A second renders the fields in canonical
// order, so long text reaches the chunker in one piece and is hashed in place. It produces
// exactly the key that the fastjson path (parseBuild in build.go, rendering in render.go)
// produces, and hands anything else back to that path (TestFastPath, and FuzzBuild on every
// input, compare the two):
//
//   - the Responses API, and other shapes: a field of an unexpected type, a completions
//     prompt that is not a string or a list of strings, ids or id lists: the fastjson path
//     renders or rejects them;
//   - JSON that fastjson would reject, or would accept only by its own leniency (NaN, Inf),
//     and string escapes that it keeps or replaces rather than decodes (an unknown escape, a
//     lone surrogate): its "best effort" result is the reference, so it computes it;
//   - escaped object keys, and nesting deeper than maxFastDepth.
//
// The syntax accepted here is a subset of what fastjson accepts, so a body the fast path takes
// is one the fastjson path would take too: whitespace is space, \t, \n, \r; a number is a run
// of [0-9.eE+-] (not a lone sign) as fastjson reads it, and renders as that text; a string
// ends at the first quote preceded by an even number of backslashes.

import (
	"bytes"
	"encoding/binary"
	"math"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// maxFastDepth bounds the nesting, counted as fastjson does (the body's object is 1), that the
// fast path handles; deeper bodies go to the fastjson path (fastjson.MaxDepth = 300).
const maxFastDepth = 64

// Pooled scratch limits: a scanner keeps at most this many message entries, and an arena of
// at most this many bytes (the size of the largest pooled body; see scanner.esc).
const (
	maxPooledMsgs = 4096
	maxPooledEsc  = maxPooledBody
)

// fastTop holds the positions in the body of the routing-relevant top-level values (their
// first byte); 0 means absent (position 0 is the body's '{').
type fastTop struct {
	model, salt, stream          int
	messages                     int
	tools, functions, respFormat int
	msgsIndexed                  bool   // messages (the last one) is an array indexed in scanner.msgs
	prompt                       int    // completions: the last "prompt"
	promptKind                   byte   // its kind, when it is a string or a list the fast path reads
	promptBytes                  []byte // its rendering: the unescaped text, or the ids as little-endian uint32s
}

// fastMsg holds the positions of a chat message's fields (the last of duplicates); 0 = absent.
// A string content is also unescaped while the body is validated, into text.
type fastMsg struct {
	role, name, content, calls, callID, fcall int
	text                                      []byte
}

// scanner reads one body for the fast path.
type scanner struct {
	b    []byte
	msgs []fastMsg
	// esc is an arena for the bytes of this body that are not in the body itself: strings that
	// have escapes, unescaped, and token ids as little-endian uint32s. It only grows during a
	// Build, so slices of it stay valid; it never exceeds twice the body.
	esc []byte
	dec [4]byte // one decoded escape
}

func (s *scanner) reset() {
	s.b = nil
	clear(s.msgs) // drop references to the body and the arena
	s.msgs = s.msgs[:0]
	if cap(s.msgs) > maxPooledMsgs {
		s.msgs = nil
	}
	if cap(s.esc) > maxPooledEsc {
		s.esc = nil
	}
}

// fastBuild fills k from body when the fast path handles it (see above) and reports whether it
// did. When it returns false, k and the chunker are left dirty; the caller resets them.
func (s *state) fastBuild(ep endpoint, chunkTokens int, body []byte, k *Key) bool {
	if ep != epChat && ep != epCompletions {
		return false
	}
	f := &s.f
	f.b = body
	f.esc = f.esc[:0]
	var t fastTop
	if !f.top(ep, &t) {
		return false
	}
	if t.stream != 0 && body[t.stream] == 't' {
		k.Stream = true
	}
	model, ok := f.optStr(t.model)
	if !ok {
		return false
	}
	k.Model = append(k.Model[:0], model...)
	salt, ok := f.optStr(t.salt)
	if !ok {
		return false
	}
	kind := byte(kindChat)
	if ep == epCompletions {
		if t.prompt == 0 || t.promptKind == 0 {
			return false
		}
		kind = t.promptKind
	}
	r := &s.r
	r.c = &s.c
	s.c.start(chunkTokens*BytesPerToken, r.seed(kind, model, salt), k)
	if ep == epCompletions {
		r.emit(t.promptBytes)
	} else {
		if t.messages == 0 || !t.msgsIndexed {
			return false
		}
		for _, h := range [...]struct {
			tag byte
			v   int
		}{{tagTools, t.tools}, {tagFunctions, t.functions}, {tagRespFmt, t.respFormat}} {
			if f.present(h.v) {
				r.tag(h.tag)
				if f.canon(r, h.v) < 0 {
					return false
				}
			}
		}
		for i := range f.msgs {
			if !f.message(r, &f.msgs[i]) {
				return false
			}
		}
	}
	k.OK = true
	if kind == kindIDs {
		k.PromptTokens = s.c.n / 4 // 4 bytes per uint32 id: the exact count
	} else {
		k.PromptTokens = s.c.n / BytesPerToken
	}
	return true
}

// top validates the whole body and notes the top-level fields in t; for chat it also indexes
// the messages.
func (f *scanner) top(ep endpoint, t *fastTop) bool {
	b := f.b
	i := f.ws(0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	for first := true; ; first = false {
		key, v, st := f.member(i, first)
		if st < 0 {
			return false
		}
		if st > 0 {
			i = v
			break
		}
		e := 0
		switch string(key) {
		case "model":
			t.model = v
		case "cache_salt":
			t.salt = v
		case "stream":
			t.stream = v
		case "prompt":
			t.prompt, t.promptKind, t.promptBytes = v, 0, nil
			if ep == epCompletions {
				t.promptKind, t.promptBytes, e = f.prompt(v)
			}
		case "tools":
			t.tools = v
		case "functions":
			t.functions = v
		case "response_format":
			t.respFormat = v
		case "messages":
			t.messages = v
			t.msgsIndexed = ep == epChat && b[v] == '['
			if t.msgsIndexed {
				e = f.indexMessages(v)
			}
		}
		if e == 0 {
			e = f.skip(v, 2)
		}
		if e < 0 {
			return false
		}
		i = e
	}
	return f.ws(i) == len(b)
}

// indexMessages validates the messages array at v (depth 2) and records each message's fields
// in f.msgs. It returns the position after the array, or -1.
func (f *scanner) indexMessages(v int) int {
	b := f.b
	clear(f.msgs)
	f.msgs = f.msgs[:0]
	i := v
	for first := true; ; first = false {
		m, st := f.element(i, first)
		if st < 0 {
			return -1
		}
		if st > 0 {
			return m
		}
		if b[m] != '{' {
			return -1 // not an object: the fastjson path rejects it
		}
		var msg fastMsg
		i = m
		for first := true; ; first = false {
			key, fv, st := f.member(i, first)
			if st < 0 {
				return -1
			}
			if st > 0 {
				i = fv
				break
			}
			switch string(key) {
			case "role":
				msg.role = fv
			case "name":
				msg.name = fv
			case "content":
				msg.content = fv
			case "tool_calls":
				msg.calls = fv
			case "tool_call_id":
				msg.callID = fv
			case "function_call":
				msg.fcall = fv
			}
			if string(key) == "content" && b[fv] == '"' {
				msg.text, i = f.str(fv)
			} else {
				i = f.skip(fv, 4)
			}
			if i < 0 {
				return -1
			}
		}
		f.msgs = append(f.msgs, msg)
	}
}

// message renders one message like renderer.message.
func (f *scanner) message(r *renderer, m *fastMsg) bool {
	role, _, ok := f.field(m.role)
	if !ok {
		return false
	}
	r.str(tagMessage, role)
	name, has, ok := f.field(m.name)
	if !ok {
		return false
	}
	if has {
		r.str(tagName, name)
	}
	if f.present(m.content) {
		switch f.b[m.content] {
		case '"':
			r.text(m.text)
		case '[':
			if !f.parts(r, m.content) {
				return false
			}
		default:
			return false
		}
	}
	if f.present(m.calls) {
		if f.b[m.calls] != '[' {
			return false
		}
		for i, first := m.calls, true; ; first = false {
			c, st := f.element(i, first)
			if st < 0 {
				return false
			}
			if st > 0 {
				break
			}
			if i = f.toolCall(r, c); i < 0 {
				return false
			}
		}
	}
	if f.present(m.fcall) && f.function(r, m.fcall) < 0 {
		return false
	}
	id, has, ok := f.field(m.callID)
	if !ok {
		return false
	}
	if has {
		r.str(tagCallID, id)
	}
	return true
}

// text renders the string at v as a text item: tag, unescaped bytes, NUL.
func (f *scanner) text(r *renderer, v int) bool {
	s, e := f.str(v)
	if e < 0 {
		return false
	}
	r.text(s)
	return true
}

// parts renders an array of content parts like renderer.part: text parts as text, any other
// part as its type and a hash of its URL or data, or of its canonical encoding.
func (f *scanner) parts(r *renderer, v int) bool {
	b := f.b
	for i, first := v, true; ; first = false {
		p, st := f.element(i, first)
		if st < 0 {
			return false
		}
		if st > 0 {
			return true
		}
		if b[p] != '{' {
			return false
		}
		var typ, text, refusal, imageURL, audio, file, videoURL, audioURL, fileID, fileData, fileURL int
		i = p
		for first := true; ; first = false {
			key, fv, st := f.member(i, first)
			if st < 0 {
				return false
			}
			if st > 0 {
				i = fv
				break
			}
			switch string(key) {
			case "type":
				typ = fv
			case "text":
				text = fv
			case "refusal":
				refusal = fv
			case "image_url":
				imageURL = fv
			case "input_audio":
				audio = fv
			case "file":
				file = fv
			case "video_url":
				videoURL = fv
			case "audio_url":
				audioURL = fv
			case "file_id":
				fileID = fv
			case "file_data":
				fileData = fv
			case "file_url":
				fileURL = fv
			}
			if i = f.skip(fv, 6); i < 0 {
				return false
			}
		}
		typB, _, ok := f.field(typ)
		if !ok {
			return false
		}
		var payload int // the string whose hash stands for the part; 0: none
		switch string(typB) {
		case "text", "input_text", "output_text":
			if text == 0 || b[text] != '"' || !f.text(r, text) {
				return false
			}
			continue
		case "refusal":
			if refusal == 0 || b[refusal] != '"' || !f.text(r, refusal) {
				return false
			}
			continue
		case "image_url":
			payload = f.urlOrString(imageURL, "url")
		case "video_url":
			payload = f.urlOrString(videoURL, "url")
		case "audio_url":
			payload = f.urlOrString(audioURL, "url")
		case "input_audio":
			payload = f.urlOrString(audio, "data")
		case "file":
			if payload = f.urlOrString(file, "file_data"); payload == 0 {
				payload = f.urlOrString(file, "file_id")
			}
		case "input_image":
			payload = f.firstString(imageURL, fileID)
		case "input_file":
			payload = f.firstString(fileData, fileID, fileURL)
		}
		if payload < 0 {
			return false
		}
		// typB may be in the arena; it stays valid while more strings are unescaped.
		var h uint64
		if payload > 0 {
			s, e := f.str(payload)
			if e < 0 {
				return false
			}
			h = xxhash.Sum64(s)
		} else {
			r.side.Reset()
			r.toSide = true
			e := f.canon(r, p)
			r.toSide = false
			if e < 0 {
				return false
			}
			h = r.side.Sum64()
		}
		r.media(typB, h)
	}
}

// urlOrString is renderer's urlOrString on positions: v itself when it is a string, else its
// string field "field" (the last of duplicates); 0 when there is none, -1 on a syntax error.
func (f *scanner) urlOrString(v int, field string) int {
	if v == 0 {
		return 0
	}
	switch f.b[v] {
	case '"':
		return v
	case '{':
	default:
		return 0
	}
	found := 0
	for i, first := v, true; ; first = false {
		key, fv, st := f.member(i, first)
		if st < 0 {
			return -1
		}
		if st > 0 {
			break
		}
		if string(key) == field {
			found = fv
		}
		if i = f.skip(fv, 8); i < 0 {
			return -1
		}
	}
	if found != 0 && f.b[found] == '"' {
		return found
	}
	return 0
}

// firstString returns the first of vs that is a string, or 0.
func (f *scanner) firstString(vs ...int) int {
	for _, v := range vs {
		if v != 0 && f.b[v] == '"' {
			return v
		}
	}
	return 0
}

// toolCall renders one element of tool_calls at v and returns the position after it, or -1.
func (f *scanner) toolCall(r *renderer, v int) int {
	if f.b[v] != '{' {
		return -1
	}
	fn, end := 0, 0
	for i, first := v, true; ; first = false {
		key, fv, st := f.member(i, first)
		if st < 0 {
			return -1
		}
		if st > 0 {
			end = fv
			break
		}
		if string(key) == "function" {
			fn = fv
		}
		if i = f.skip(fv, 6); i < 0 {
			return -1
		}
	}
	if !f.present(fn) {
		r.tag(tagCallOther)
		return f.canon(r, v)
	}
	if f.function(r, fn) < 0 {
		return -1
	}
	return end
}

// function renders a {name, arguments} object at v like renderer.function and returns the
// position after it, or -1.
func (f *scanner) function(r *renderer, v int) int {
	if f.b[v] != '{' {
		return -1
	}
	name, args, end := 0, 0, 0
	for i, first := v, true; ; first = false {
		key, fv, st := f.member(i, first)
		if st < 0 {
			return -1
		}
		if st > 0 {
			end = fv
			break
		}
		switch string(key) {
		case "name":
			name = fv
		case "arguments":
			args = fv
		}
		if i = f.skip(fv, 8); i < 0 {
			return -1
		}
	}
	nameB, _, ok := f.field(name)
	if !ok {
		return -1
	}
	r.str(tagCall, nameB)
	switch {
	case !f.present(args):
		r.str(tagArgs, nil)
	case f.b[args] == '"':
		a, e := f.str(args)
		if e < 0 {
			return -1
		}
		r.str(tagArgs, a)
	default:
		if f.canon(r, args) < 0 {
			return -1
		}
	}
	return end
}

// canon emits the canonical encoding (render.go) of the value at v and returns the position
// after it, or -1. The value was validated by top, so its depth is bounded.
func (f *scanner) canon(r *renderer, v int) int {
	b := f.b
	switch b[v] {
	case '{':
		r.tag('{')
		for i, first := v, true; ; first = false {
			key, fv, st := f.member(i, first)
			if st < 0 {
				return -1
			}
			if st > 0 {
				r.tag('}')
				return fv
			}
			r.str('"', key)
			if i = f.canon(r, fv); i < 0 {
				return -1
			}
		}
	case '[':
		r.tag('[')
		for i, first := v, true; ; first = false {
			e, st := f.element(i, first)
			if st < 0 {
				return -1
			}
			if st > 0 {
				r.tag(']')
				return e
			}
			if i = f.canon(r, e); i < 0 {
				return -1
			}
		}
	case '"':
		s, e := f.str(v)
		if e >= 0 {
			r.str('"', s)
		}
		return e
	case 't':
		r.tag('t')
		return v + len("true")
	case 'f':
		r.tag('f')
		return v + len("false")
	case 'n':
		r.tag('n')
		return v + len("null")
	}
	e := f.number(v)
	if e >= 0 {
		r.str('#', b[v:e])
	}
	return e
}

// present reports whether the value at v exists and is not null.
func (f *scanner) present(v int) bool { return v != 0 && f.b[v] != 'n' }

// optStr reads an optional string value: absent or null is nil; a string its unescaped bytes;
// anything else ok false.
func (f *scanner) optStr(v int) (s []byte, ok bool) {
	s, _, ok = f.field(v)
	return s, ok
}

// field reads an optional string field like stringField: absent or null is has=false; a
// string its unescaped bytes (valid until the next str); anything else ok false.
func (f *scanner) field(v int) (s []byte, has, ok bool) {
	if !f.present(v) {
		return nil, false, true
	}
	if f.b[v] != '"' {
		return nil, false, false
	}
	s, e := f.str(v)
	return s, true, e >= 0
}

// ws returns the position of the first non-whitespace byte at or after i.
func (f *scanner) ws(i int) int {
	b := f.b
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// member steps through an object: i is the position of its '{' (first) or just after a
// member's value. It returns the next member's key and the position of its value (st 0), or
// the position after the closing '}' (st 1), or st -1.
func (f *scanner) member(i int, first bool) (key []byte, v int, st int) {
	b := f.b
	if first {
		i = f.ws(i + 1)
		if i < len(b) && b[i] == '}' {
			return nil, i + 1, 1
		}
	} else {
		i = f.ws(i)
		if i >= len(b) {
			return nil, 0, -1
		}
		if b[i] == '}' {
			return nil, i + 1, 1
		}
		if b[i] != ',' {
			return nil, 0, -1
		}
		i = f.ws(i + 1)
	}
	if i >= len(b) || b[i] != '"' {
		return nil, 0, -1
	}
	i++
	j := i
	for j < len(b) && b[j] != '"' && b[j] != '\\' {
		j++
	}
	if j >= len(b) || b[j] != '"' {
		return nil, 0, -1 // unterminated, or an escaped key: left to fastjson
	}
	key = b[i:j]
	i = f.ws(j + 1)
	if i >= len(b) || b[i] != ':' {
		return nil, 0, -1
	}
	i = f.ws(i + 1)
	if i >= len(b) {
		return nil, 0, -1
	}
	return key, i, 0
}

// element steps through an array like member: the next element's position (st 0), the
// position after ']' (st 1), or st -1.
func (f *scanner) element(i int, first bool) (v int, st int) {
	b := f.b
	if first {
		i = f.ws(i + 1)
		if i < len(b) && b[i] == ']' {
			return i + 1, 1
		}
	} else {
		i = f.ws(i)
		if i >= len(b) {
			return 0, -1
		}
		if b[i] == ']' {
			return i + 1, 1
		}
		if b[i] != ',' {
			return 0, -1
		}
		i = f.ws(i + 1)
	}
	if i >= len(b) {
		return 0, -1
	}
	return i, 0
}

// skip validates the value at i, of the given depth, and returns the position after it, or -1.
func (f *scanner) skip(i, depth int) int {
	b := f.b
	switch b[i] {
	case '"':
		return f.strEnd(i)
	case '{':
		if depth > maxFastDepth {
			return -1
		}
		for first := true; ; first = false {
			_, v, st := f.member(i, first)
			if st != 0 {
				if st < 0 {
					return -1
				}
				return v
			}
			if i = f.skip(v, depth+1); i < 0 {
				return -1
			}
		}
	case '[':
		if depth > maxFastDepth {
			return -1
		}
		for first := true; ; first = false {
			v, st := f.element(i, first)
			if st != 0 {
				if st < 0 {
					return -1
				}
				return v
			}
			if i = f.skip(v, depth+1); i < 0 {
				return -1
			}
		}
	case 't':
		return f.literal(i, "true")
	case 'f':
		return f.literal(i, "false")
	case 'n':
		return f.literal(i, "null") // "nan" is left to fastjson
	}
	return f.number(i)
}

func (f *scanner) literal(i int, lit string) int {
	if !bytes.HasPrefix(f.b[i:], []byte(lit)) {
		return -1
	}
	return i + len(lit)
}

// number returns the position after the number at i, read as fastjson reads it: a run of
// [0-9.eE+-] that is not empty nor a lone sign (those are NaN, Inf or errors). -1 otherwise,
// also at the end of the body (no valid body ends in a number).
func (f *scanner) number(i int) int {
	b := f.b
	j := i
	for j < len(b) && numByte[b[j]] {
		j++
	}
	if j == len(b) || j == i || j == i+1 && (b[i] == '-' || b[i] == '+') {
		return -1
	}
	return j
}

// numByte reports the bytes that fastjson reads as part of a number.
var numByte = [256]bool{'0': true, '1': true, '2': true, '3': true, '4': true, '5': true, '6': true,
	'7': true, '8': true, '9': true, '.': true, '-': true, '+': true, 'e': true, 'E': true}

// strEnd returns the position after the string whose opening quote is at i: past the first
// quote preceded by an even number of backslashes (as fastjson finds it), or -1.
func (f *scanner) strEnd(i int) int {
	b := f.b
	j := i + 1
	for {
		n := bytes.IndexByte(b[j:], '"')
		if n < 0 {
			return -1
		}
		q := j + n
		k := q
		for k > i+1 && b[k-1] == '\\' {
			k--
		}
		if (q-k)%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// str returns the unescaped bytes of the string at v (a slice of the body, or of the arena when
// it has escapes) and the position after it; -1 for an escape that fastjson would not decode.
func (f *scanner) str(v int) ([]byte, int) {
	b := f.b
	i := v + 1
	q := bytes.IndexByte(b[i:], '"')
	if q < 0 {
		return nil, -1
	}
	q += i
	n := bytes.IndexByte(b[i:q], '\\')
	if n < 0 {
		return b[i:q], q + 1
	}
	return f.unescapeStr(i, i+n, q)
}

// unescapeStr appends the unescaped string that starts at i, whose first backslash is at p
// and whose first quote (perhaps an escaped one) is at q, to the arena and returns it with the
// position after its closing quote (-1 as for str).
//
// It decodes escapes in order, so the first '"' or '\\' after an escape ends the run of
// plain bytes, and a '"' there ends the string. Runs are found with bytes.IndexByte, the
// quote search reused until the scan passes it, and copied whole; common one-byte escapes are
// decoded inline. (Checking the next 8 bytes in one word before searching, or copying 8 bytes
// at a time, measured no faster on escape-dense text: the per-escape cost dominates.)
func (f *scanner) unescapeStr(i, p, q int) ([]byte, int) {
	b := f.b
	start := len(f.esc)
	dst := append(f.esc, b[i:p]...)
	i = p
	for {
		// b[i] == '\\'
		if i+1 < len(b) && unescapeByte[b[i+1]] != 0 {
			dst = append(dst, unescapeByte[b[i+1]])
			i += 2
		} else {
			d, w := f.unescapeU(b[i:])
			if w == 0 {
				return nil, -1
			}
			dst = append(dst, d...)
			i += w
		}
		if q < i { // the quote at q was escaped: find the next one
			n := bytes.IndexByte(b[i:], '"')
			if n < 0 {
				return nil, -1
			}
			q = i + n
		}
		k := q // the next '"' or '\\'
		if n := bytes.IndexByte(b[i:q], '\\'); n >= 0 {
			k = i + n
		}
		dst = append(dst, b[i:k]...)
		i = k
		if b[i] == '"' {
			f.esc = dst
			return dst[start:], i + 1
		}
	}
}

// unescapeByte maps the character after a backslash to the byte it stands for, for the
// one-byte escapes; 0 for the others (\u, and invalid ones). fastjson decodes the same.
var unescapeByte = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// unescapeU decodes the \u escape at the start of s (s[0] == '\\') and returns its UTF-8
// bytes and its length in s: 6, or 12 for a surrogate pair. It decodes what fastjson decodes
// and returns length 0 for what fastjson keeps verbatim or replaces by U+FFFD: another escape
// (the one-byte ones are decoded by the caller; the rest are invalid), a bad \u, a lone or
// reversed surrogate.
func (f *scanner) unescapeU(s []byte) ([]byte, int) {
	if len(s) < 6 || s[1] != 'u' {
		return nil, 0
	}
	x, ok := hex4(s[2:])
	if !ok {
		return nil, 0
	}
	if x < 0xd800 || x > 0xdfff {
		return f.dec[:utf8.EncodeRune(f.dec[:], x)], 6
	}
	if x >= 0xdc00 || len(s) < 12 || s[6] != '\\' || s[7] != 'u' {
		return nil, 0
	}
	y, ok := hex4(s[8:])
	if !ok || y < 0xdc00 || y > 0xdfff {
		return nil, 0
	}
	return f.dec[:utf8.EncodeRune(f.dec[:], 0x10000+(x-0xd800)<<10+(y-0xdc00))], 12
}

// hex4 parses four hex digits at the start of s.
func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var x rune
	for _, c := range s[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		x = x<<4 | rune(c)
	}
	return x, true
}

// prompt reads a completions "prompt" at v like completionsPrompt (render.go) and renders it:
// a string to its unescaped bytes, a list of token ids (or the first of a list of lists) to
// little-endian uint32s in the arena, a list of strings to its first. It returns kind 0 for
// anything else, and the position after the value (-1 if invalid).
func (f *scanner) prompt(v int) (kind byte, out []byte, end int) {
	b := f.b
	switch b[v] {
	case '"':
		out, end = f.str(v)
		return kindText, out, end
	case '[':
	default:
		return 0, nil, f.skip(v, 2)
	}
	var first byte // class of the first element: '"', '[' or '0' (number)
	kind = kindText
	ids := len(f.esc)
	for i, firstEl := v, true; ; firstEl = false {
		e, st := f.element(i, firstEl)
		if st < 0 {
			return 0, nil, -1
		}
		if st > 0 {
			if first == '0' {
				out = f.esc[ids:]
			}
			return kind, out, e
		}
		c := b[e]
		if c != '"' && c != '[' {
			c = '0'
		}
		if firstEl {
			first = c
		} else if c != first {
			return 0, nil, f.skip(v, 2) // mixed: the fastjson path rejects it
		}
		switch {
		case c == '"' && firstEl:
			out, i = f.str(e)
		case c == '[' && firstEl:
			kind = kindIDs
			ids = len(f.esc)
			i = f.ids(e)
			out = f.esc[ids:]
		case c == '0':
			kind = kindIDs
			i = f.id(e)
		default:
			i = f.skip(e, 3)
		}
		if i < 0 {
			return 0, nil, -1
		}
	}
}

// ids appends the token ids of the list at v to the arena and returns the position after it,
// or -1 (also for an element that is not an id).
func (f *scanner) ids(v int) int {
	for i, first := v, true; ; first = false {
		e, st := f.element(i, first)
		if st != 0 {
			if st < 0 {
				return -1
			}
			return e
		}
		if i = f.id(e); i < 0 {
			return -1
		}
	}
}

// id appends the token id at v, a little-endian uint32, to the arena and returns the position
// after it; -1 for anything but a run of digits worth at most math.MaxUint32 (what fastjson's
// Value.Uint64 reads, within range) ended by a byte that does not continue a number.
func (f *scanner) id(v int) int {
	b := f.b
	var x uint64
	j := v
	for ; j < len(b); j++ {
		c := b[j] - '0'
		if c > 9 {
			break
		}
		if x = x*10 + uint64(c); x > math.MaxUint32 {
			return -1
		}
	}
	if j == v || j == len(b) || numByte[b[j]] {
		return -1 // not an id (a sign, a fraction, an exponent), or the body ends
	}
	f.esc = binary.LittleEndian.AppendUint32(f.esc, uint32(x))
	return j
}
