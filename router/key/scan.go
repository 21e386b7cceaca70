package key

// The fast path.
//
// Most bodies are chat requests whose messages hold string role, name and content (or content
// parts: text, images, audio, files), maybe with tools and tool calls, or completions requests
// with a string or token-id prompt. For those, fastBuild renders the canonical stream
// (render.go) straight from the body, without a parse tree. A first pass validates the whole
// body, notes where the fields it needs start, and unescapes message contents and completions
// prompts into an arena (a string without escapes stays where it is in the body). A second
// renders the fields in canonical order, so long text reaches the chunker in one piece and is
// hashed in place. It reads fields, header order and content parts by the tables of
// grammar.go and renders through the renderer's productions, as the fastjson path
// (parseBuild in build.go, render_tree.go) does, so it produces exactly that path's key; it
// hands anything else back to that path (TestFastPath, and FuzzBuild on every input, compare
// the two):
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
// is one the fastjson path would take too (scan_json.go).
//
// Positions: a value is named by the position of its first byte in the body; 0 means absent
// (position 0 is the body's '{', never a field's value), and functions that return the
// position after a value return badPos (negative) on a syntax error or a shape handed back.

import "unicode/utf8"

// maxFastDepth bounds the nesting, counted as fastjson does (the body's object is 1), that the
// fast path handles; deeper bodies go to the fastjson path (fastjson.MaxDepth = 300).
const maxFastDepth = 64

// Nesting depths, counted as for maxFastDepth, of the values that the fast path validates or
// steps over. Values below the messages are validated once, at their own depth, while the
// messages are indexed; the later walks of a function or media object pass an upper bound of
// theirs, which can only hand a body back, never accept one the first pass did not.
const (
	depthTopValue      = 2 // a top-level field's value
	depthPromptElement = 3 // an element of a completions prompt list
	depthMessageValue  = 4 // a message field's value (body, messages, message)
	depthPartValue     = 6 // a content part's field value (… content, part)
	depthCallValue     = 6 // a tool call's field value (… tool_calls, call)
	depthNestedValue   = 8 // a field of a function or of a media object, at most
)

// badPos is returned for a position after a value when there is none: the body is invalid
// there, or the fast path does not read that shape.
const badPos = -1

// Pooled scratch limits: a scanner keeps at most this many message entries, and an arena of
// at most this many bytes (the size of the largest pooled body; see scanner.arena).
const (
	maxPooledMsgs  = 4096
	maxPooledArena = maxPooledBody
)

// scanTop holds the positions in the body of the routing-relevant top-level values.
type scanTop struct {
	at              [topFieldCount]int // by grammar.go's topField; 0 is absent
	end             [topFieldCount]int // the position after each value noted in at
	messagesIndexed bool               // messages (the last one) is an array indexed in scanner.messages
	promptKind      byte               // the last "prompt"'s kind, when it is a string or a list the fast path reads
	promptBytes     []byte             // its rendering: the unescaped text, or the ids as little-endian uint32s
}

// scanMessage holds the positions of a chat message's fields (the last of duplicates); 0 is
// absent. A string content is also unescaped while the body is validated, into text.
type scanMessage struct {
	at   [messageFieldCount]int // by grammar.go's messageField
	end  int                    // the position after the message's '}'
	text []byte
}

// scanner reads one body for the fast path.
type scanner struct {
	body     []byte
	messages []scanMessage
	// arena holds the bytes of this body that are not in the body itself: strings that have
	// escapes, unescaped, and token ids as little-endian uint32s. It only grows during a
	// Build, so slices of it stay valid; it never exceeds twice the body.
	arena   []byte
	decoded [utf8.UTFMax]byte // one decoded \u escape
}

func (sc *scanner) reset() {
	sc.body = nil
	clear(sc.messages) // drop references to the body and the arena
	sc.messages = sc.messages[:0]
	if cap(sc.messages) > maxPooledMsgs {
		sc.messages = nil
	}
	if cap(sc.arena) > maxPooledArena {
		sc.arena = nil
	}
}

// fastBuild fills k from body when the fast path handles it (see above) and reports whether it
// did. When it returns false, k and the chunker are left dirty; the caller resets them. With
// s.hit set (memo.go), body[:s.hit.end] is the prefix of a body built before, and the build
// resumes from the state that body left there when what follows allows it.
func (s *state) fastBuild(ep API, chunkTokens int, body []byte, k *Key) bool {
	if ep != APIChat && ep != APICompletions {
		return false
	}
	sc := &s.scanner
	sc.body = body
	if cap(sc.arena) < len(body) && len(body) <= maxPooledArena {
		// Unescaped strings take at most the body's length (escapes only shrink), so this
		// one allocation, kept by the pool, serves every later body up to this size: growing
		// by append instead overshoots maxPooledArena near 1 MiB and is dropped every time.
		sc.arena = make([]byte, 0, len(body))
	}
	sc.arena = sc.arena[:0]
	var top scanTop
	s.resumed = false
	resumed := s.hit.end > 0
	if resumed {
		if !s.resumeTop(ep, &top) {
			return false
		}
		if !s.hit.allows(body, &top) { // a field the remembered state depends on differs
			s.hit.end = 0
			k.Reset()
			k.Routed = true
			return s.fastBuild(ep, chunkTokens, body, k)
		}
		s.resumed = true
	} else if !sc.top(ep, &top) {
		return false
	}
	s.top = top
	if stream := top.at[topStream]; stream != 0 && body[stream] == 't' {
		k.Stream = true
	}
	model, ok := sc.optStr(top.at[topModel])
	if !ok {
		return false
	}
	k.Model = append(k.Model[:0], model...)
	salt, ok := sc.optStr(top.at[topCacheSalt])
	if !ok {
		return false
	}
	kind := byte(kindChat)
	if ep == APICompletions {
		if top.at[topPrompt] == 0 || top.promptKind == 0 {
			return false
		}
		kind = top.promptKind
	}
	r := &s.renderer
	if resumed {
		s.hit.restore(s, chunkTokens, k)
	} else {
		s.begin(kind, model, salt, chunkTokens, k)
	}
	if ep == APICompletions {
		r.emit(top.promptBytes)
	} else {
		if top.at[topMessages] == 0 || !top.messagesIndexed {
			return false
		}
		if !resumed {
			for _, hdr := range headerFields {
				if v := top.at[hdr.field]; sc.present(v) {
					r.tag(hdr.tag)
					if sc.canon(r, v) < 0 {
						return false
					}
				}
			}
		}
		for i := range sc.messages {
			if !sc.message(r, &sc.messages[i]) {
				return false
			}
		}
	}
	s.finish(kind, k)
	return true
}

// top validates the whole body and notes the top-level fields in top; for chat it also
// indexes the messages.
func (sc *scanner) top(ep API, top *scanTop) bool {
	i := sc.ws(0)
	if i >= len(sc.body) || sc.body[i] != '{' {
		return false
	}
	return sc.members(ep, top, i, true)
}

// members validates the top-level object's members from i (its '{' when first, else the
// position after a member's value) to the end of the body and notes them in top.
func (sc *scanner) members(ep API, top *scanTop, i int, first bool) bool {
	b := sc.body
	for ; ; first = false {
		name, v, got := sc.member(i, first)
		if got != stepNext {
			if got == stepBad {
				return false
			}
			i = v
			break
		}
		field := topFieldOf(name)
		top.at[field] = v
		end := 0 // 0: not read yet
		switch field {
		case topPrompt:
			top.promptKind, top.promptBytes = 0, nil
			if ep == APICompletions {
				top.promptKind, top.promptBytes, end = sc.prompt(v)
			}
		case topMessages:
			top.messagesIndexed = ep == APIChat && b[v] == '['
			if top.messagesIndexed {
				clear(sc.messages)
				sc.messages = sc.messages[:0]
				end = sc.indexMessages(v, true)
			}
		}
		if end == 0 {
			end = sc.skip(v, depthTopValue)
		}
		if end < 0 {
			return false
		}
		top.end[field] = end
		i = end
	}
	return sc.ws(i) == len(b)
}

// indexMessages validates the messages array from i (its '[' when first, else the position
// after a message) and appends each message's fields to sc.messages. It returns the position
// after the array, or badPos.
func (sc *scanner) indexMessages(i int, first bool) int {
	b := sc.body
	for ; ; first = false {
		m, got := sc.element(i, first)
		if got != stepNext {
			if got == stepBad {
				return badPos
			}
			return m
		}
		if b[m] != '{' {
			return badPos // not an object: the fastjson path rejects it
		}
		var msg scanMessage
		i = m
		for first := true; ; first = false {
			name, value, got := sc.member(i, first)
			if got != stepNext {
				if got == stepBad {
					return badPos
				}
				i = value
				msg.end = value
				break
			}
			field := messageFieldOf(name)
			msg.at[field] = value
			if field == messageContent && b[value] == '"' {
				msg.text, i = sc.str(value)
			} else {
				i = sc.skip(value, depthMessageValue)
			}
			if i < 0 {
				return badPos
			}
		}
		sc.messages = append(sc.messages, msg)
	}
}
