package key

// The fast path's rendering: the canonical stream (render.go) of the messages that top and
// indexMessages (scan.go) found in the body, field by field as render_tree.go renders them
// from a parse tree, by the same tables (grammar.go) and productions (renderer).

import "github.com/cespare/xxhash/v2"

// message renders one message like renderer.message.
func (sc *scanner) message(r *renderer, m *scanMessage) bool {
	role, _, ok := sc.field(m.at[messageRole])
	if !ok {
		return false
	}
	name, hasName, ok := sc.field(m.at[messageName])
	if !ok {
		return false
	}
	id, hasID, ok := sc.field(m.at[messageToolCallID])
	if !ok {
		return false
	}
	r.messageRole(role)
	if hasName {
		r.messageName(name)
	}
	if content := m.at[messageContent]; sc.present(content) {
		switch sc.body[content] {
		case '"':
			r.text(m.text)
		case '[':
			if !sc.parts(r, content) {
				return false
			}
		default:
			return false
		}
	}
	if calls := m.at[messageToolCalls]; sc.present(calls) {
		if sc.body[calls] != '[' {
			return false
		}
		for i, first := calls, true; ; first = false {
			call, got := sc.element(i, first)
			if got != stepNext {
				if got == stepBad {
					return false
				}
				break
			}
			if i = sc.toolCall(r, call); i < 0 {
				return false
			}
		}
	}
	if fcall := m.at[messageFunctionCall]; sc.present(fcall) && sc.function(r, fcall) < 0 {
		return false
	}
	if hasID {
		r.callID(id)
	}
	return true
}

// text renders the string at v as a text item: tag, unescaped bytes, NUL.
func (sc *scanner) text(r *renderer, v int) bool {
	s, end := sc.str(v)
	if end < 0 {
		return false
	}
	r.text(s)
	return true
}

// parts renders an array of content parts like renderer.part: by its type's partRule, a text
// part as text, any other part as its type and a hash of its payload, or of its canonical
// encoding.
func (sc *scanner) parts(r *renderer, v int) bool {
	b := sc.body
	for i, first := v, true; ; first = false {
		p, got := sc.element(i, first)
		if got != stepNext {
			if got == stepBad {
				return false
			}
			return true
		}
		if b[p] != '{' {
			return false
		}
		var fields [partFieldCount]int
		if i = objectFields(sc, p, depthPartValue, fields[:], partFieldOf); i < 0 {
			return false
		}
		typ, _, ok := sc.field(fields[partType])
		if !ok {
			return false
		}
		rule := partRuleOf(typ)
		if rule.text != partOther {
			text := fields[rule.text]
			if text == 0 || b[text] != '"' || !sc.text(r, text) {
				return false
			}
			continue
		}
		payload := 0 // the string whose hash stands for the part; 0: none
		for _, src := range rule.media {
			if payload = sc.mediaPayload(fields[src.field], src); payload != 0 {
				break
			}
		}
		if payload < 0 {
			return false
		}
		// typ may be in the arena; it stays valid while more strings are unescaped.
		var h uint64
		if payload > 0 {
			s, end := sc.str(payload)
			if end < 0 {
				return false
			}
			h = xxhash.Sum64(s)
		} else {
			r.sideBegin()
			end := sc.canon(r, p)
			h = r.sideEnd()
			if end < 0 {
				return false
			}
		}
		r.media(typ, h)
	}
}

// mediaPayload is render_tree.go's mediaPayload on positions: v (the value of src.field)
// itself when it is a string, else its string field src.sub (the last of duplicates) when v
// is an object and sub is not empty; 0 when there is none, badPos on a syntax error.
func (sc *scanner) mediaPayload(v int, src mediaSource) int {
	if v == 0 {
		return 0
	}
	switch sc.body[v] {
	case '"':
		return v
	case '{':
		if src.sub == "" {
			return 0
		}
	default:
		return 0
	}
	found, end := sc.lastMember(v, depthNestedValue, src.sub)
	if end < 0 {
		return badPos
	}
	if found != 0 && sc.body[found] == '"' {
		return found
	}
	return 0
}

// toolCall renders one element of tool_calls at v and returns the position after it, or
// badPos.
func (sc *scanner) toolCall(r *renderer, v int) int {
	if sc.body[v] != '{' {
		return badPos
	}
	fn, end := sc.lastMember(v, depthCallValue, callFunctionField)
	if end < 0 {
		return badPos
	}
	if !sc.present(fn) {
		r.tag(tagCallOther)
		return sc.canon(r, v)
	}
	if sc.function(r, fn) < 0 {
		return badPos
	}
	return end
}

// function renders a {name, arguments} object at v like renderer.function and returns the
// position after it, or badPos.
func (sc *scanner) function(r *renderer, v int) int {
	if sc.body[v] != '{' {
		return badPos
	}
	var fields [functionFieldCount]int
	end := objectFields(sc, v, depthNestedValue, fields[:], functionFieldOf)
	if end < 0 {
		return badPos
	}
	if !sc.call(r, fields[functionName], fields[functionArguments]) {
		return badPos
	}
	return end
}

// call renders a call's name (the string at name) and arguments (the value at args) like
// renderer.call.
func (sc *scanner) call(r *renderer, name, args int) bool {
	nameB, _, ok := sc.field(name)
	if !ok {
		return false
	}
	r.functionName(nameB)
	switch {
	case !sc.present(args):
		r.stringArgs(nil)
	case sc.body[args] == '"':
		argsText, end := sc.str(args)
		if end < 0 {
			return false
		}
		r.stringArgs(argsText)
	default:
		if sc.canon(r, args) < 0 {
			return false
		}
	}
	return true
}

// content renders a message content at v like renderer.content: absent or null nothing, a
// string one text item, a list its parts; anything else is a type error.
func (sc *scanner) content(r *renderer, v int) bool {
	if !sc.present(v) {
		return true
	}
	switch sc.body[v] {
	case '"':
		return sc.text(r, v)
	case '[':
		return sc.parts(r, v)
	}
	return false
}

// canon emits the canonical encoding (render.go) of the value at v and returns the position
// after it, or badPos. The value was validated by top, so its depth is bounded.
func (sc *scanner) canon(r *renderer, v int) int {
	b := sc.body
	switch b[v] {
	case '{':
		r.tag(canonObject)
		end := sc.eachMember(v, func(name []byte, value int) int {
			r.str(canonString, name)
			return sc.canon(r, value)
		})
		if end >= 0 {
			r.tag(canonObjectEnd)
		}
		return end
	case '[':
		r.tag(canonArray)
		for i, first := v, true; ; first = false {
			elem, got := sc.element(i, first)
			if got != stepNext {
				if got == stepBad {
					return badPos
				}
				r.tag(canonArrayEnd)
				return elem
			}
			if i = sc.canon(r, elem); i < 0 {
				return badPos
			}
		}
	case '"':
		s, end := sc.str(v)
		if end >= 0 {
			r.str(canonString, s)
		}
		return end
	case 't':
		r.tag(canonTrue)
		return v + len(litTrue)
	case 'f':
		r.tag(canonFalse)
		return v + len(litFalse)
	case 'n':
		r.tag(canonNull)
		return v + len(litNull)
	}
	end := sc.number(v)
	if end >= 0 {
		r.str(canonNumber, b[v:end])
	}
	return end
}

// present reports whether the value at v exists and is not null.
func (sc *scanner) present(v int) bool { return v != 0 && sc.body[v] != 'n' }

// optStr reads an optional string value: absent or null is nil; a string its unescaped bytes;
// anything else ok false.
func (sc *scanner) optStr(v int) (s []byte, ok bool) {
	s, _, ok = sc.field(v)
	return s, ok
}

// field reads an optional string field like stringField: absent or null is has=false; a
// string its unescaped bytes; anything else ok false.
func (sc *scanner) field(v int) (s []byte, has, ok bool) {
	if !sc.present(v) {
		return nil, false, true
	}
	if sc.body[v] != '"' {
		return nil, false, false
	}
	s, end := sc.str(v)
	return s, true, end >= 0
}

// objectFields notes in f, at of(name), the position of each member's value of the object at
// o (the last of duplicates), validating each value at depth, and returns the position after
// the object, or badPos.
func objectFields[F ~uint8](sc *scanner, o, depth int, f []int, of func([]byte) F) int {
	return sc.eachMember(o, func(name []byte, value int) int {
		f[of(name)] = value
		return sc.skip(value, depth)
	})
}

// lastMember returns the position of the value of the last member named name of the object
// at o (0 when it has none), validating each value at depth, and the position after the
// object; end is badPos on a syntax error.
func (sc *scanner) lastMember(o, depth int, name string) (v, end int) {
	end = sc.eachMember(o, func(key []byte, value int) int {
		if string(key) == name {
			v = value
		}
		return sc.skip(value, depth)
	})
	if end < 0 {
		return 0, badPos
	}
	return v, end
}
