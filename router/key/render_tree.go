package key

// The fastjson path's rendering: the canonical stream (render.go) of a fastjson parse tree.
// It reads every shape the grammar names (chat, completions and the Responses API) and is the
// reference that the fast path (scan.go) must equal.

import (
	"encoding/binary"
	"math"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// The fastjson path's value for each field a table of grammar.go names; nil when absent.
type (
	topValues      [topFieldCount]*fastjson.Value
	messageValues  [messageFieldCount]*fastjson.Value
	functionValues [functionFieldCount]*fastjson.Value
	partValues     [partFieldCount]*fastjson.Value
	itemValues     [itemFieldCount]*fastjson.Value
)

// sideHash returns xxhash64 of the canonical encoding of v.
func (r *renderer) sideHash(v *fastjson.Value) uint64 {
	r.sideBegin()
	r.canon(v)
	return r.sideEnd()
}

// canon emits the canonical encoding of v. Depth is bounded by the parser (fastjson.MaxDepth).
func (r *renderer) canon(v *fastjson.Value) {
	switch v.Type() {
	case fastjson.TypeObject:
		r.tag(canonObject)
		o, _ := v.Object()
		o.Visit(func(name []byte, v *fastjson.Value) {
			r.str(canonString, name)
			r.canon(v)
		})
		r.tag(canonObjectEnd)
	case fastjson.TypeArray:
		r.tag(canonArray)
		a, _ := v.Array()
		for _, e := range a {
			r.canon(e)
		}
		r.tag(canonArrayEnd)
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		r.str(canonString, b)
	case fastjson.TypeNumber:
		r.number = v.MarshalTo(r.number[:0])
		r.str(canonNumber, r.number)
	case fastjson.TypeTrue:
		r.tag(canonTrue)
	case fastjson.TypeFalse:
		r.tag(canonFalse)
	default:
		r.tag(canonNull)
	}
}

func present(v *fastjson.Value) bool { return v != nil && v.Type() != fastjson.TypeNull }

func isString(v *fastjson.Value) bool { return v != nil && v.Type() == fastjson.TypeString }

// header emits the header fields (grammar.go's headerFields) that are present.
func (r *renderer) header(top *topValues) bool {
	for _, hdr := range headerFields {
		if v := top[hdr.field]; present(v) {
			r.tag(hdr.tag)
			r.canon(v)
		}
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
	var fields messageValues
	o.Visit(func(name []byte, v *fastjson.Value) {
		fields[messageFieldOf(name)] = v
	})
	role, _, ok := stringField(fields[messageRole])
	if !ok {
		return false
	}
	name, hasName, ok := stringField(fields[messageName])
	if !ok {
		return false
	}
	id, hasID, ok := stringField(fields[messageToolCallID])
	if !ok {
		return false
	}
	r.messageRole(role)
	if hasName {
		r.messageName(name)
	}
	if !r.content(fields[messageContent]) {
		return false
	}
	if calls := fields[messageToolCalls]; present(calls) {
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
	if fcall := fields[messageFunctionCall]; present(fcall) && !r.function(fcall) {
		return false
	}
	if hasID {
		r.callID(id)
	}
	return true
}

func (r *renderer) toolCall(call *fastjson.Value) bool {
	if call.Type() != fastjson.TypeObject {
		return false
	}
	o, _ := call.Object()
	var fn *fastjson.Value
	o.Visit(func(name []byte, v *fastjson.Value) {
		if string(name) == callFunctionField {
			fn = v
		}
	})
	if !present(fn) {
		r.tag(tagCallOther)
		r.canon(call)
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
	var fields functionValues
	o.Visit(func(name []byte, v *fastjson.Value) {
		fields[functionFieldOf(name)] = v
	})
	return r.call(fields[functionName], fields[functionArguments])
}

func (r *renderer) call(name, args *fastjson.Value) bool {
	nameB, _, ok := stringField(name)
	if !ok {
		return false
	}
	r.functionName(nameB)
	switch {
	case !present(args):
		r.stringArgs(nil)
	case args.Type() == fastjson.TypeString:
		b, _ := args.StringBytes()
		r.stringArgs(b)
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

// mediaPayload returns the payload that src yields from v, the value of src.field: v when it
// is a string, else its string field src.sub (the last of duplicates) when v is an object and
// sub is not empty.
func mediaPayload(v *fastjson.Value, src mediaSource) (payload []byte, found bool) {
	if v == nil {
		return nil, false
	}
	switch v.Type() {
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		return b, true
	case fastjson.TypeObject:
		if src.sub == "" {
			return nil, false
		}
		o, _ := v.Object()
		var sub *fastjson.Value
		o.Visit(func(name []byte, v *fastjson.Value) {
			if string(name) == src.sub {
				sub = v
			}
		})
		if isString(sub) {
			b, _ := sub.StringBytes()
			return b, true
		}
	}
	return nil, false
}

// part renders one content part (chat or Responses API) by its type's partRule.
func (r *renderer) part(p *fastjson.Value) bool {
	if p.Type() != fastjson.TypeObject {
		return false
	}
	o, _ := p.Object()
	var fields partValues
	o.Visit(func(name []byte, v *fastjson.Value) {
		fields[partFieldOf(name)] = v
	})
	typ, _, ok := stringField(fields[partType])
	if !ok {
		return false
	}
	rule := partRuleOf(typ)
	if rule.text != partOther {
		text := fields[rule.text]
		if !isString(text) {
			return false
		}
		b, _ := text.StringBytes()
		r.text(b)
		return true
	}
	for _, src := range rule.media {
		if payload, found := mediaPayload(fields[src.field], src); found {
			r.media(typ, xxhash.Sum64(payload))
			return true
		}
	}
	r.media(typ, r.sideHash(p))
	return true
}

// responsesInput renders "instructions" then "input"; neither present is no prompt.
func (r *renderer) responsesInput(instr, input *fastjson.Value) bool {
	instrB, hasInstr, ok := stringField(instr)
	if !ok {
		return false
	}
	if hasInstr {
		r.messageRole(roleSystem)
		r.text(instrB)
	}
	if !present(input) {
		return hasInstr
	}
	switch input.Type() {
	case fastjson.TypeString:
		b, _ := input.StringBytes()
		r.messageRole(roleUser)
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
	var fields itemValues
	o.Visit(func(name []byte, v *fastjson.Value) {
		fields[itemFieldOf(name)] = v
	})
	typ, hasType, ok := stringField(fields[itemType])
	if !ok {
		return false
	}
	switch {
	case string(typ) == itemMessage || (!hasType && fields[itemRole] != nil):
		// Same fields as a chat message (role, content), read by the chat renderer.
		return r.message(it)
	case string(typ) == itemFunctionCall:
		r.messageRole(roleAssistant)
		return r.call(fields[itemName], fields[itemArguments])
	case string(typ) == itemFunctionCallOutput:
		id, hasID, ok := stringField(fields[itemCallID])
		if !ok {
			return false
		}
		r.messageRole(roleTool)
		output := fields[itemOutput]
		if present(output) && output.Type() != fastjson.TypeString && output.Type() != fastjson.TypeArray {
			r.media(typ, r.sideHash(output))
		} else if !r.content(output) {
			return false
		}
		if hasID {
			r.callID(id)
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
		binary.LittleEndian.PutUint32(r.idBuf[n:], uint32(id))
		if n += tokenIDBytes; n == len(r.idBuf) {
			r.emit(r.idBuf[:n])
			n = 0
		}
	}
	r.emit(r.idBuf[:n])
	return true
}
