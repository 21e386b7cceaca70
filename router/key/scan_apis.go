package key

// The fast path's rendering of the Responses API's input and the Messages API's tools,
// system, messages and content blocks, on positions in the body, production for production
// as render_tree.go and render_messages.go render them from a parse tree. The Messages API's
// messages are indexed by the first pass as chat's are; the rest is read where it is.

import "github.com/cespare/xxhash/v2"

// responsesInput renders "instructions" (the string at instr) then "input" (the value at
// input) like renderer.responsesInput; neither present is no prompt.
func (sc *scanner) responsesInput(r *renderer, instr, input int) bool {
	instrB, hasInstr, ok := sc.field(instr)
	if !ok {
		return false
	}
	if hasInstr {
		r.messageRole(roleSystem)
		r.text(instrB)
	}
	if !sc.present(input) {
		return hasInstr
	}
	switch sc.body[input] {
	case '"':
		r.messageRole(roleUser)
		return sc.text(r, input)
	case '[':
		for i, first := input, true; ; first = false {
			it, got := sc.element(i, first)
			if got != stepNext {
				return got == stepEnd
			}
			if i = sc.item(r, it); i < 0 {
				return false
			}
		}
	}
	return false
}

// item renders one Responses API input item at it like renderer.item and returns the
// position after it, or badPos.
func (sc *scanner) item(r *renderer, it int) int {
	b := sc.body
	if b[it] != '{' {
		return badPos
	}
	var f [itemFieldCount]int
	end := objectFields(sc, it, depthMessageValue, f[:], itemFieldOf)
	if end < 0 {
		return badPos
	}
	typ, hasType, ok := sc.field(f[itemType])
	if !ok {
		return badPos
	}
	switch {
	case string(typ) == itemMessage || (!hasType && f[itemRole] != 0):
		// Same fields as a chat message (role, content), read by the chat renderer.
		var msg scanMessage
		if sc.indexMessage(it, &msg) < 0 || !sc.message(r, &msg) {
			return badPos
		}
		return end
	case string(typ) == itemFunctionCall:
		r.messageRole(roleAssistant)
		if !sc.call(r, f[itemName], f[itemArguments]) {
			return badPos
		}
		return end
	case string(typ) == itemFunctionCallOutput:
		id, hasID, ok := sc.field(f[itemCallID])
		if !ok {
			return badPos
		}
		r.messageRole(roleTool)
		// typ may be in the arena; it stays valid while more strings are unescaped.
		if output := f[itemOutput]; sc.present(output) && b[output] != '"' && b[output] != '[' {
			r.sideBegin()
			ok := sc.canon(r, output) >= 0
			h := r.sideEnd()
			if !ok {
				return badPos
			}
			r.media(typ, h)
		} else if !sc.content(r, output) {
			return badPos
		}
		if hasID {
			r.callID(id)
		}
		return end
	}
	r.tag(tagItem)
	return sc.canon(r, it)
}

// messagesTools renders the Messages API's "tools" at v like renderer.messagesTools: 'W' and
// the list, each tool's top-level cache_control dropped.
func (sc *scanner) messagesTools(r *renderer, v int) bool {
	if !sc.present(v) {
		return true
	}
	if sc.body[v] != '[' {
		return false
	}
	r.tag(tagTools)
	r.tag(canonArray)
	for i, first := v, true; ; first = false {
		t, got := sc.element(i, first)
		if got != stepNext {
			if got == stepBad {
				return false
			}
			break
		}
		if sc.body[t] != '{' {
			return false
		}
		if i = sc.canonWithout(r, t, cacheControlID); i < 0 {
			return false
		}
	}
	r.tag(canonArrayEnd)
	return true
}

// canonWithout emits the canonical encoding of the object at o without its members named
// skip, like renderer.canonWithout, and returns the position after it, or badPos.
func (sc *scanner) canonWithout(r *renderer, o int, skip string) int {
	r.tag(canonObject)
	end := sc.eachMember(o, func(name []byte, value int) int {
		if string(name) == skip {
			return sc.skip(value, depthNestedValue)
		}
		r.str(canonString, name)
		return sc.canon(r, value)
	})
	if end >= 0 {
		r.tag(canonObjectEnd)
	}
	return end
}

// messagesSystem renders "system" at v (a string or a list of blocks) as a system message,
// like renderer.messagesSystem.
func (sc *scanner) messagesSystem(r *renderer, v int) bool {
	if !sc.present(v) {
		return true
	}
	r.messageRole(roleSystem)
	return sc.blocks(r, v)
}

// messagesMessage renders one message of the Messages API's "messages" (indexed as chat's:
// role, content) like renderer.messagesList does each element.
func (sc *scanner) messagesMessage(r *renderer, m *scanMessage) bool {
	role, _, ok := sc.field(m.at[messageRole])
	if !ok {
		return false
	}
	r.messageRole(role)
	content := m.at[messageContent]
	switch {
	case !sc.present(content):
		return true
	case sc.body[content] == '"':
		r.text(m.text)
		return true
	}
	return sc.blocks(r, content)
}

// blocks renders a content value at v like renderer.blocks: a string as one text block, a
// list block by block; anything else is a type error.
func (sc *scanner) blocks(r *renderer, v int) bool {
	switch sc.body[v] {
	case '"':
		return sc.text(r, v)
	case '[':
		for i, first := v, true; ; first = false {
			bl, got := sc.element(i, first)
			if got != stepNext {
				return got == stepEnd
			}
			if i = sc.block(r, bl); i < 0 {
				return false
			}
		}
	}
	return false
}

// block renders the content block at v by its type like renderer.block and returns the
// position after it, or badPos.
func (sc *scanner) block(r *renderer, v int) int {
	b := sc.body
	if b[v] != '{' {
		return badPos
	}
	var f [blockFieldCount]int
	var text []byte // the last "text", when a string: unescaped while stepping over it
	end := sc.eachMember(v, func(name []byte, value int) int {
		field := blockFieldOf(name)
		f[field] = value
		if field == blockText && b[value] == '"' {
			var after int
			text, after = sc.str(value)
			return after
		}
		return sc.skip(value, depthPartValue)
	})
	if end < 0 {
		return badPos
	}
	typ, _, ok := sc.field(f[blockType])
	if !ok {
		return badPos
	}
	// typ may be in the arena; it stays valid while more strings are unescaped.
	switch {
	case string(typ) == blockTypeText:
		if t := f[blockText]; t == 0 || b[t] != '"' {
			return badPos
		}
		r.text(text)
	case isMediaBlock(typ):
		src := f[blockSource]
		if src == 0 || b[src] != '{' {
			return badPos
		}
		h, ok := sc.sourceHash(r, src)
		if !ok {
			return badPos
		}
		r.media(typ, h)
	case string(typ) == blockTypeToolUse:
		id, _, ok1 := sc.field(f[blockID])
		name, _, ok2 := sc.field(f[blockName])
		if !ok1 || !ok2 {
			return badPos
		}
		r.str(tagToolUse, id)
		r.functionName(name)
		if in := f[blockInput]; sc.present(in) {
			if sc.canon(r, in) < 0 {
				return badPos
			}
		} else {
			r.stringArgs(nil)
		}
	case string(typ) == blockTypeToolResult:
		id, _, ok := sc.field(f[blockToolUseID])
		if !ok {
			return badPos
		}
		r.str(tagToolResult, id)
		if e := f[blockIsError]; e != 0 && b[e] == 't' {
			r.tag(tagToolError)
		}
		if c := f[blockContent]; sc.present(c) && !sc.blocks(r, c) {
			return badPos
		}
		r.tag(tagToolResEnd)
	default:
		r.sideBegin()
		ok := sc.canonWithout(r, v, cacheControlID) >= 0
		h := r.sideEnd()
		if !ok {
			return badPos
		}
		r.media(typ, h)
	}
	return end
}

// sourceHash is renderer.sourceHash on the media block source object at src: xxhash64 of
// its first string field of mediaSourceFields (the last of duplicates), else of its
// canonical encoding; ok false on a syntax error.
func (sc *scanner) sourceHash(r *renderer, src int) (uint64, bool) {
	for _, name := range mediaSourceFields {
		v, end := sc.lastMember(src, depthNestedValue, name)
		if end < 0 {
			return 0, false
		}
		if v != 0 && sc.body[v] == '"' {
			s, end := sc.str(v)
			return xxhash.Sum64(s), end >= 0
		}
	}
	r.sideBegin()
	ok := sc.canon(r, src) >= 0
	return r.sideEnd(), ok
}
