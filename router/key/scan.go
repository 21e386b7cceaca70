package key

// The fast path.
//
// fastBuild renders the canonical stream (render.go) of a body straight from its bytes,
// without a parse tree, for every routed API: chat and embeddings messages (string role, name
// and content, content parts: text, images, audio, files; tools and tool calls), completions
// prompts and embeddings inputs (a string, a list of strings, token ids or lists of them), the
// Responses API's instructions and input items, and the Messages API's tools, system and
// content blocks (scan_apis.go). A first pass validates the whole body and notes where the
// top-level fields it needs start; for chat (and the Messages API) it also indexes the first
// maxIndexedMsgs messages and unescapes their string contents into an arena (a string without
// escapes stays where it is in the body). A second pass renders the fields in canonical order (the seed needs
// "model", which may come last), re-reading what the first did not index, so long text
// reaches the chunker in one piece and is hashed in place. It reads fields, header order and
// content parts by the tables of grammar.go and renders through the renderer's productions,
// as the fastjson path (parseBuild in build.go, render_tree.go, render_messages.go) does, so
// it produces exactly that path's key; it hands anything else back to that path (TestFastPath,
// and FuzzBuild on every input, compare the two):
//
//   - a field of an unexpected type (the fastjson path rejects it, or renders the prompt it
//     can), and a completions prompt or embeddings input that is not a string or a list of
//     strings, ids or id lists;
//   - JSON that fastjson would reject, or would accept only by its own leniency (NaN, Inf);
//   - nesting deeper than maxFastDepth.
//
// The syntax accepted here is a subset of what fastjson accepts, so a body the fast path takes
// is one the fastjson path would take too (scan_json.go).
//
// Memory: the arena holds each string of the body that has escapes at most once, unescaped
// (and an object key with escapes as scratch past them), and a prompt's token ids as long as
// they take no more than their text: so it never exceeds the body. The message index is at
// most maxIndexedMsgs entries whatever the body; nothing else grows with the body but the
// key's chunk hashes (8 bytes per chunk).
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
	depthMessage       = 3 // a message (body, messages), or a Responses API input item
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
	maxPooledMsgs  = maxIndexedMsgs
	maxPooledArena = maxPooledBody
)

// maxIndexedMsgs is how many messages of a chat body the first pass indexes (scanMessage is
// 88 bytes): a coding agent's 1 MB body holds a few hundred, so its messages are read once;
// the messages past it are read again by the second pass instead (a body of 12 MB of "{}"
// messages would otherwise index 4 million, 30 times its size).
const maxIndexedMsgs = 4096

// scanTop holds the positions in the body of the routing-relevant top-level values.
type scanTop struct {
	at              [topFieldCount]int // by grammar.go's topField; 0 is absent
	end             [topFieldCount]int // the position after each value noted in at
	messagesIndexed bool               // messages (the last one) is an array indexed in scanner.messages
	promptKind      byte               // the last prompt's kind (promptField), when it is a string or a list the fast path reads
	promptBytes     []byte             // its rendering: the unescaped text, or the ids stored (emitIDs reads the rest)
}

// promptField is the top-level field that holds ep's completions-style prompt: "prompt" for
// completions, "input" for embeddings (keyed so when the body has no "messages"); topOther
// for the other APIs.
func promptField(ep API) topField {
	switch ep {
	case APICompletions:
		return topPrompt
	case APIEmbeddings:
		return topInput
	}
	return topOther
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
	body []byte
	// messages indexes the first maxIndexedMsgs messages of the last "messages" array; rest
	// is the position after the last of them when the array holds more (0 when it does not),
	// from which the second pass reads the others; lastEnd is the position after the last
	// message rendered (the memo's checkpoint).
	messages []scanMessage
	rest     int
	lastEnd  int
	// Token ids in the arena (storeID): idsList is the position of the last token-id prompt
	// read, idsAt where its ids begin in the arena, idsRest the position of its first id that
	// is not there (0 when all are).
	idsList, idsAt, idsRest int
	// arena holds the strings of this body that have escapes, unescaped, and past them the
	// last object key read that had escapes (key). It only grows during a Build, so slices of
	// it stay valid; it never exceeds the body (see reserve).
	arena   []byte
	decoded [utf8.UTFMax]byte // one decoded \u escape
}

func (sc *scanner) reset() {
	sc.body = nil
	clear(sc.messages) // drop references to the body and the arena
	sc.messages = sc.messages[:0]
	sc.rest, sc.lastEnd = 0, 0
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
	if !ep.Routed() {
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
	sc.rest, sc.lastEnd, sc.idsRest = 0, 0, 0
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
	if ep == APICompletions || ep == APIEmbeddings && top.at[topMessages] == 0 {
		if top.at[promptField(ep)] == 0 || top.promptKind == 0 {
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
	switch {
	case kind != kindChat:
		if kind == kindIDs {
			if !sc.emitIDs(r, top.promptBytes) {
				return false
			}
		} else {
			r.emit(top.promptBytes)
		}
	case ep == APIResponses:
		if !sc.header(r, &top) || !sc.responsesInput(r, top.at[topInstructions], top.at[topInput]) {
			return false
		}
	case ep == APIMessages:
		if !sc.messagesTools(r, top.at[topTools]) || !sc.messagesSystem(r, top.at[topSystem]) ||
			!top.messagesIndexed || !sc.eachMessage(r, true) {
			return false
		}
	default: // chat, and embeddings with "messages"
		if top.at[topMessages] == 0 || !top.messagesIndexed {
			return false
		}
		if !resumed && !sc.header(r, &top) {
			return false
		}
		if !sc.eachMessage(r, false) {
			return false
		}
	}
	s.finish(kind, k)
	return true
}

// header renders the header fields (grammar.go's headerFields) that are present, like
// renderer.header.
func (sc *scanner) header(r *renderer, top *scanTop) bool {
	for _, hdr := range headerFields {
		if v := top.at[hdr.field]; sc.present(v) {
			r.tag(hdr.tag)
			if sc.canon(r, v) < 0 {
				return false
			}
		}
	}
	return true
}

// eachMessage renders each message of the "messages" array, as a chat message or (anthropic)
// a Messages API one: those that the first pass indexed, then the rest of the array, if it
// held more, read from sc.rest.
func (sc *scanner) eachMessage(r *renderer, anthropic bool) bool {
	for i := range sc.messages {
		if !sc.renderMessage(r, &sc.messages[i], anthropic) {
			return false
		}
		sc.lastEnd = sc.messages[i].end
	}
	if sc.rest == 0 {
		return true
	}
	for i := sc.rest; ; {
		m, got := sc.element(i, false)
		if got != stepNext {
			return got == stepEnd
		}
		var msg scanMessage
		if i = sc.indexMessage(m, &msg); i < 0 || !sc.renderMessage(r, &msg, anthropic) {
			return false
		}
		sc.lastEnd = i
	}
}

// renderMessage renders one indexed message, as a chat message or a Messages API one.
func (sc *scanner) renderMessage(r *renderer, m *scanMessage, anthropic bool) bool {
	if anthropic {
		return sc.messagesMessage(r, m)
	}
	return sc.message(r, m)
}

// top validates the whole body and notes the top-level fields in top; for chat (embeddings,
// the Messages API) it also indexes the messages.
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
	end := sc.eachMemberFrom(i, first, func(name []byte, v int) int {
		field := topFieldOf(name)
		top.at[field] = v
		after := 0 // the position after v; 0: not read yet
		switch {
		case field == topOther:
		case field == promptField(ep):
			top.promptKind, top.promptBytes, after = sc.prompt(v)
		case field == topMessages:
			top.messagesIndexed = (ep == APIChat || ep == APIEmbeddings || ep == APIMessages) && b[v] == '['
			if top.messagesIndexed {
				clear(sc.messages)
				sc.messages = sc.messages[:0]
				sc.rest = 0
				after = sc.indexMessages(v, true)
			}
		}
		if after == 0 {
			after = sc.skip(v, depthTopValue)
		}
		if after >= 0 {
			top.end[field] = after
		}
		return after
	})
	return end >= 0 && sc.ws(end) == len(b)
}

// indexMessages validates the messages array from i (its '[' when first, else the position
// after a message) and appends each message's fields to sc.messages, the first
// maxIndexedMsgs of them; past those it only validates, and notes in sc.rest where the
// second pass reads on. It returns the position after the array, or badPos.
func (sc *scanner) indexMessages(i int, first bool) int {
	for ; ; first = false {
		m, got := sc.element(i, first)
		if got != stepNext {
			if got == stepBad {
				return badPos
			}
			return m
		}
		if len(sc.messages) == maxIndexedMsgs {
			if sc.rest == 0 {
				sc.rest = i
			}
			i = sc.skip(m, depthMessage)
		} else {
			var msg scanMessage
			i = sc.indexMessage(m, &msg)
			sc.messages = append(sc.messages, msg)
		}
		if i < 0 {
			return badPos
		}
	}
}

// indexMessage validates the message at m and fills msg with its fields (its string content
// unescaped). It returns the position after the message, or badPos (also when it is not an
// object: the fastjson path rejects that).
func (sc *scanner) indexMessage(m int, msg *scanMessage) int {
	b := sc.body
	if b[m] != '{' {
		return badPos
	}
	end := sc.eachMember(m, func(name []byte, value int) int {
		field := messageFieldOf(name)
		msg.at[field] = value
		if field == messageContent && b[value] == '"' {
			var after int
			msg.text, after = sc.str(value)
			return after
		}
		return sc.skip(value, depthMessageValue)
	})
	if end >= 0 {
		msg.end = end
	}
	return end
}
