package key

// The Messages API (/v1/messages, Anthropic's request shape as vLLM and SGLang serve it),
// rendered from a fastjson tree (the fast path renders the same on positions: scan_apis.go).
// The stream is chat's (render.go) with three more productions, so a text-only conversation
// renders exactly like the equivalent chat request (vLLM converts a Messages request to chat
// and renders it through the same chat template, so the two share KV blocks):
//
//	stream     = ['W' tools] [system] message*
//	tools      = '[' tool* ']'                    ; each tool: canon minus its "cache_control"
//	system     = 'M' str("system") block*         ; "system": a string is one text block
//	message    = 'M' str(role) block*             ; "content": a string is one text block
//	block      = 'T' text 0x00                    ; "text"
//	           | 'I' str(type) u64(hash)          ; "image", "document": xxhash64 of source.data,
//	           |                                  ;  source.url or source.file_id, else of canon(source)
//	           | 'U' str(id) 'F' str(name) input  ; "tool_use": input canon, absent 'A' str("")
//	           | 'R' str(tool_use_id) ['E'] block* 'Q'   ; "tool_result"; 'E': is_error true
//	           | 'I' str(type) u64(hash)          ; any other type (thinking, ...): xxhash64 of
//	                                              ;  its canon minus "cache_control"
//
// "cache_control" marks (on the body, a tool, a system block or a content block) are hints to
// Anthropic's own cache and never reach a self-hosted engine's prompt, so they never change the
// key. Blocks of a tool_result are framed by 'R' … 'Q', so a text block after it does not
// render like text inside it. Every production depends only on its own block: the rendering of
// messages[0..n] is a prefix of that of messages[0..n+1].

import (
	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// Tags of the Messages API productions (see above).
const (
	tagToolUse     = 'U'
	tagToolResult  = 'R'
	tagToolError   = 'E'
	tagToolResEnd  = 'Q'
	cacheControlID = "cache_control"
)

// blockField names a field of a Messages API content block that the key reads.
type blockField uint8

const (
	blockOther blockField = iota
	blockType
	blockText
	blockSource
	blockID
	blockName
	blockInput
	blockToolUseID
	blockContent
	blockIsError
	blockFieldCount
)

func blockFieldOf(name []byte) blockField {
	switch string(name) {
	case "type":
		return blockType
	case "text":
		return blockText
	case "source":
		return blockSource
	case "id":
		return blockID
	case "name":
		return blockName
	case "input":
		return blockInput
	case "tool_use_id":
		return blockToolUseID
	case "content":
		return blockContent
	case "is_error":
		return blockIsError
	}
	return blockOther
}

// Block types with a production of their own; mediaSourceFields are the fields of a media
// block's "source" whose string stands for it, in order.
const (
	blockTypeText       = "text"
	blockTypeToolUse    = "tool_use"
	blockTypeToolResult = "tool_result"
)

var mediaSourceFields = [...]string{"data", "url", "file_id"}

func isMediaBlock(typ []byte) bool {
	return string(typ) == "image" || string(typ) == "document"
}

type blockValues [blockFieldCount]*fastjson.Value

// messagesTools renders "tools" as 'W' and the list, each tool's top-level cache_control
// dropped; absent or null renders nothing, anything but a list of objects is a type error.
func (r *renderer) messagesTools(v *fastjson.Value) bool {
	if !present(v) {
		return true
	}
	if v.Type() != fastjson.TypeArray {
		return false
	}
	r.tag(tagTools)
	r.tag(canonArray)
	a, _ := v.Array()
	for _, t := range a {
		if t.Type() != fastjson.TypeObject {
			return false
		}
		r.canonWithout(t, cacheControlID)
	}
	r.tag(canonArrayEnd)
	return true
}

// canonWithout emits the canonical encoding of the object o without its fields named skip.
func (r *renderer) canonWithout(o *fastjson.Value, skip string) {
	r.tag(canonObject)
	obj, _ := o.Object()
	obj.Visit(func(name []byte, v *fastjson.Value) {
		if string(name) == skip {
			return
		}
		r.str(canonString, name)
		r.canon(v)
	})
	r.tag(canonObjectEnd)
}

// messagesSystem renders "system" (a string or a list of blocks) as a system message;
// absent or null renders nothing.
func (r *renderer) messagesSystem(v *fastjson.Value) bool {
	if !present(v) {
		return true
	}
	r.messageRole(roleSystem)
	return r.blocks(v)
}

// messagesList renders "messages": a list of {role, content}; absent or not a list is no
// prompt.
func (r *renderer) messagesList(v *fastjson.Value) bool {
	if v == nil || v.Type() != fastjson.TypeArray {
		return false
	}
	a, _ := v.Array()
	for _, m := range a {
		if m.Type() != fastjson.TypeObject {
			return false
		}
		var role, content *fastjson.Value
		o, _ := m.Object()
		o.Visit(func(name []byte, v *fastjson.Value) {
			switch messageFieldOf(name) {
			case messageRole:
				role = v
			case messageContent:
				content = v
			}
		})
		roleB, _, ok := stringField(role)
		if !ok {
			return false
		}
		r.messageRole(roleB)
		if present(content) && !r.blocks(content) {
			return false
		}
	}
	return true
}

// blocks renders a content value: a string as one text block, a list block by block; anything
// else is a type error.
func (r *renderer) blocks(v *fastjson.Value) bool {
	switch v.Type() {
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		r.text(b)
		return true
	case fastjson.TypeArray:
		a, _ := v.Array()
		for _, b := range a {
			if !r.block(b) {
				return false
			}
		}
		return true
	}
	return false
}

// block renders one content block by its type (see the grammar above).
func (r *renderer) block(b *fastjson.Value) bool {
	if b.Type() != fastjson.TypeObject {
		return false
	}
	var f blockValues
	o, _ := b.Object()
	o.Visit(func(name []byte, v *fastjson.Value) {
		f[blockFieldOf(name)] = v
	})
	typ, _, ok := stringField(f[blockType])
	if !ok {
		return false
	}
	switch {
	case string(typ) == blockTypeText:
		if !isString(f[blockText]) {
			return false
		}
		s, _ := f[blockText].StringBytes()
		r.text(s)
	case isMediaBlock(typ):
		src := f[blockSource]
		if src == nil || src.Type() != fastjson.TypeObject {
			return false
		}
		r.media(typ, r.sourceHash(src))
	case string(typ) == blockTypeToolUse:
		id, _, ok1 := stringField(f[blockID])
		name, _, ok2 := stringField(f[blockName])
		if !ok1 || !ok2 {
			return false
		}
		r.str(tagToolUse, id)
		r.functionName(name)
		if in := f[blockInput]; present(in) {
			r.canon(in)
		} else {
			r.stringArgs(nil)
		}
	case string(typ) == blockTypeToolResult:
		id, _, ok := stringField(f[blockToolUseID])
		if !ok {
			return false
		}
		r.str(tagToolResult, id)
		if e := f[blockIsError]; e != nil && e.Type() == fastjson.TypeTrue {
			r.tag(tagToolError)
		}
		if c := f[blockContent]; present(c) && !r.blocks(c) {
			return false
		}
		r.tag(tagToolResEnd)
	default:
		r.sideBegin()
		r.canonWithout(b, cacheControlID)
		r.media(typ, r.sideEnd())
	}
	return true
}

// sourceHash is the hash that stands for a media block's source: xxhash64 of its first string
// field of mediaSourceFields (the bytes of a base64 image, its URL, its file id), else of its
// canonical encoding.
func (r *renderer) sourceHash(src *fastjson.Value) uint64 {
	for _, name := range mediaSourceFields {
		var found *fastjson.Value
		o, _ := src.Object()
		o.Visit(func(k []byte, v *fastjson.Value) {
			if string(k) == name {
				found = v
			}
		})
		if isString(found) {
			s, _ := found.StringBytes()
			return xxhash.Sum64(s)
		}
	}
	return r.sideHash(src)
}
