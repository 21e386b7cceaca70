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
// input_file's file_data, file_id or file_url: the table partRuleOf in grammar.go); a part of
// another type, or one without that field, by the hash of its whole canonical encoding. A
// string content renders like a list holding one text part.
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
// Messages API requests (/v1/messages) render like chat too, with productions of their own
// for tool_use, tool_result and media blocks (render_messages.go); embeddings requests render
// their "input" as a completions prompt, or their "messages" as chat.
//
// Completions prompts are not framed: a text prompt renders as its UTF-8 bytes (so a prompt
// that extends another shares its chunks), a token-id prompt as one little-endian uint32 per
// id. The kind is mixed into the seed instead.
//
// Chat framing adds a few bytes per message (tag, role, lengths), close to the few tokens a
// chat template adds per message, and is counted in PromptTokens like the text.

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Tags of the stream (see the grammar above).
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

// Tags of canon, the canonical encoding of a JSON value.
const (
	canonObject    = '{'
	canonObjectEnd = '}'
	canonArray     = '['
	canonArrayEnd  = ']'
	canonString    = '"' // a string value, and an object key
	canonNumber    = '#'
	canonTrue      = 't'
	canonFalse     = 'f'
	canonNull      = 'n'
)

// Tags of the seed, which is not part of the stream (see renderer.seed).
const (
	seedModel = 'm'
	seedSalt  = 's'
)

// textEnd terminates a text item.
const textEnd = 0

var (
	roleSystem    = []byte("system")
	roleUser      = []byte("user")
	roleAssistant = []byte("assistant")
	roleTool      = []byte("tool")
)

// renderer writes the canonical stream to the chunker, or, while toSide is set, to the side
// digest (used to hash a media part down to 8 bytes). Both paths render through it: its
// methods are the productions of the grammar.
type renderer struct {
	out     *chunker
	side    xxhash.Digest
	toSide  bool
	number  []byte                              // a number's text (fastjson path)
	scratch [1 + binary.MaxVarintLen64 + 8]byte // a tag and a length, or a hash
	idBuf   [256]byte                           // token ids as little-endian uint32s (fastjson path)
}

func (r *renderer) reset() {
	r.out = nil
	r.toSide = false
}

func (r *renderer) emit(p []byte) {
	if r.toSide {
		_, _ = r.side.Write(p)
		return
	}
	r.out.write(p)
}

func (r *renderer) tag(t byte) {
	r.scratch[0] = t
	r.emit(r.scratch[:1])
}

// str emits tag, uvarint(len(b)), b.
func (r *renderer) str(t byte, b []byte) {
	r.scratch[0] = t
	n := binary.PutUvarint(r.scratch[1:], uint64(len(b)))
	r.emit(r.scratch[:1+n])
	r.emit(b)
}

// text emits tag, b, 0x00. Text is not length-framed, unlike other strings: a message whose
// text extends another's (a document followed by a question, a growing completion-style chat
// prompt) must share its leading chunks, as it shares the engine's KV blocks. The terminator
// keeps "ab"+"c" apart from "a"+"bc"; text holding NUL (\u0000) can make two renderings
// collide, which costs at most one misrouted request, never a wrong answer.
func (r *renderer) text(b []byte) {
	r.scratch[0] = tagText
	r.emit(r.scratch[:1])
	r.emit(b)
	r.scratch[0] = textEnd
	r.emit(r.scratch[:1])
}

// media emits a media part: 'I' str(part type) u64(h).
func (r *renderer) media(typ []byte, h uint64) {
	r.str(tagMedia, typ)
	binary.LittleEndian.PutUint64(r.scratch[:8], h)
	r.emit(r.scratch[:8])
}

// messageRole begins a message: 'M' str(role); messageName follows when it has a name.
// (Two productions, not one with a flag, so that each inlines.) An assistant message that
// begins within the head chunks, after the first, sets Key.ShortFirstTurn.
func (r *renderer) messageRole(role []byte) {
	if k := r.out.out; len(k.Chunks) >= 1 && len(k.Chunks) < HeadChunks && string(role) == "assistant" {
		k.ShortFirstTurn = true
	}
	r.str(tagMessage, role)
}

// messageName emits a message's name: 'N' str(name).
func (r *renderer) messageName(name []byte) { r.str(tagName, name) }

// callID ends a message that answers a tool call: 'D' str(id).
func (r *renderer) callID(id []byte) { r.str(tagCallID, id) }

// functionName begins a call: 'F' str(name); its arguments follow (stringArgs, or canon).
func (r *renderer) functionName(name []byte) { r.str(tagCall, name) }

// stringArgs emits arguments that are a JSON string (or absent: nil): 'A' str(args).
func (r *renderer) stringArgs(args []byte) { r.str(tagArgs, args) }

// seed hashes the key-format version, the prompt kind, the model and the cache salt.
func (r *renderer) seed(kind byte, model, salt []byte) uint64 {
	r.side.Reset()
	_, _ = r.side.WriteString(seedDomain)
	r.toSide = true
	r.tag(kind)
	r.str(seedModel, model)
	r.str(seedSalt, salt)
	r.toSide = false
	return r.side.Sum64()
}

// sideBegin diverts the stream to the side digest, to hash a value down to 8 bytes;
// sideEnd returns that hash and resumes the stream. They do not nest.
func (r *renderer) sideBegin() {
	r.side.Reset()
	r.toSide = true
}

func (r *renderer) sideEnd() uint64 {
	r.toSide = false
	return r.side.Sum64()
}
