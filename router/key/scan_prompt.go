package key

// The fast path's completions prompt (and embeddings "input"): read while the body is
// validated, rendered once the seed is known.

import (
	"encoding/binary"
	"math"
)

// The class of a prompt list's element, by its first byte: the elements of a list must all
// have the first one's class (completionsPrompt in render_tree.go).
const (
	classString = '"'
	classList   = '['
	classNumber = '0' // anything else: a token id, or a value the fast path hands back
)

// prompt reads a completions "prompt" at v like completionsPrompt (render_tree.go): a string
// is unescaped (text), a list of strings yields its first (text), a list of token ids (or the
// first list of a list of lists) is validated and its ids appended to the arena as
// little-endian uint32s (ids: what the arena holds of them; see storeID), to be rendered by
// emitIDs. It returns kind 0 for anything else, and the position after the value (badPos if
// invalid).
func (sc *scanner) prompt(v int) (kind byte, text []byte, end int) {
	b := sc.body
	switch b[v] {
	case '"':
		text, end = sc.str(v)
		return kindText, text, end
	case '[':
	default:
		return 0, nil, sc.skip(v, depthTopValue)
	}
	var firstClass byte
	kind = kindText
	ids := len(sc.arena)
	sc.idsRest, sc.idsList, sc.idsAt = 0, v, ids
	for i, first := v, true; ; first = false {
		elem, got := sc.element(i, first)
		if got != stepNext {
			if got == stepBad {
				return 0, nil, badPos
			}
			if kind == kindIDs {
				text = sc.arena[ids:]
			}
			return kind, text, elem
		}
		class := b[elem]
		if class != classString && class != classList {
			class = classNumber
		}
		if first {
			firstClass = class
		} else if class != firstClass {
			return 0, nil, sc.skip(v, depthTopValue) // mixed: the fastjson path rejects it
		}
		switch {
		case class == classString && first:
			text, i = sc.str(elem)
		case class == classList && first:
			kind = kindIDs
			i = sc.ids(elem)
		case class == classNumber:
			kind = kindIDs
			i = sc.storeID(elem)
		default:
			i = sc.skip(elem, depthPromptElement)
		}
		if i < 0 {
			return 0, nil, badPos
		}
	}
}

// ids validates the token ids of the list at v, appending them to the arena (storeID), and
// returns the position after the list, or badPos (also for an element that is not an id).
func (sc *scanner) ids(v int) int {
	for i, first := v, true; ; first = false {
		elem, got := sc.element(i, first)
		if got != stepNext {
			if got == stepBad {
				return badPos
			}
			return elem
		}
		if i = sc.storeID(elem); i < 0 {
			return badPos
		}
	}
}

// storeID validates the token id at v and appends it to the arena while the ids stored take
// no more than the bytes of the prompt read so far (from sc.idsList), so that the arena stays
// within the body's length: a list of short ids ("1,": 2 bytes a 4-byte id) would outgrow it,
// so from the first id that does not fit, sc.idsRest notes where emitIDs reads the rest from
// the body instead. It returns the position after the id, or badPos.
func (sc *scanner) storeID(v int) int {
	x, end := sc.id(v)
	if end < 0 || sc.idsRest != 0 {
		return end
	}
	switch n := len(sc.arena) + tokenIDBytes; {
	case n-sc.idsAt > end-sc.idsList:
		sc.idsRest = v
	case n > cap(sc.arena):
		sc.arena = sc.reserve(sc.arena, n)
		fallthrough
	default:
		sc.arena = binary.LittleEndian.AppendUint32(sc.arena, x)
	}
	return end
}

// emitIDs renders a token-id prompt: the ids that prompt stored, then, from sc.idsRest, the
// ones it did not, read from the body as the fastjson path renders them (len(r.idBuf) bytes a
// batch). False if one of those is not an id after all.
func (sc *scanner) emitIDs(r *renderer, stored []byte) bool {
	r.emit(stored)
	if sc.idsRest == 0 {
		return true
	}
	n := 0
	for v := sc.idsRest; ; {
		id, end := sc.id(v)
		if end < 0 {
			return false
		}
		binary.LittleEndian.PutUint32(r.idBuf[n:], id)
		if n += tokenIDBytes; n == len(r.idBuf) {
			r.emit(r.idBuf[:n])
			n = 0
		}
		next, got := sc.element(end, false)
		if got != stepNext {
			r.emit(r.idBuf[:n])
			return got == stepEnd
		}
		v = next
	}
}

// id reads the token id at v and returns it with the position after it; badPos for anything
// but a run of digits worth at most math.MaxUint32 (what fastjson's Value.Uint64 reads, within
// range) ended by a byte that does not continue a number.
func (sc *scanner) id(v int) (uint32, int) {
	b := sc.body
	var x uint64
	j := v
	for ; j < len(b); j++ {
		c := b[j] - '0'
		if c > 9 {
			break
		}
		if x = x*10 + uint64(c); x > math.MaxUint32 {
			return 0, badPos
		}
	}
	if j == v || j == len(b) || numByte[b[j]] {
		return 0, badPos // not an id (a sign, a fraction, an exponent), or the body ends
	}
	return uint32(x), j
}
