package key

// The fast path's completions prompt: read and rendered while the body is validated.

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

// prompt reads a completions "prompt" at v like completionsPrompt (render_tree.go) and
// renders it: a string to its unescaped bytes, a list of token ids (or the first of a list of
// lists) to little-endian uint32s in the arena, a list of strings to its first. It returns
// kind 0 for anything else, and the position after the value (badPos if invalid).
func (sc *scanner) prompt(v int) (kind byte, out []byte, end int) {
	b := sc.body
	switch b[v] {
	case '"':
		out, end = sc.str(v)
		return kindText, out, end
	case '[':
	default:
		return 0, nil, sc.skip(v, depthTopValue)
	}
	var firstClass byte
	kind = kindText
	ids := len(sc.arena)
	for i, first := v, true; ; first = false {
		elem, got := sc.element(i, first)
		if got != stepNext {
			if got == stepBad {
				return 0, nil, badPos
			}
			if firstClass == classNumber {
				out = sc.arena[ids:]
			}
			return kind, out, elem
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
			out, i = sc.str(elem)
		case class == classList && first:
			kind = kindIDs
			ids = len(sc.arena)
			i = sc.ids(elem)
			out = sc.arena[ids:]
		case class == classNumber:
			kind = kindIDs
			i = sc.id(elem)
		default:
			i = sc.skip(elem, depthPromptElement)
		}
		if i < 0 {
			return 0, nil, badPos
		}
	}
}

// ids appends the token ids of the list at v to the arena and returns the position after it,
// or badPos (also for an element that is not an id).
func (sc *scanner) ids(v int) int {
	for i, first := v, true; ; first = false {
		elem, got := sc.element(i, first)
		if got != stepNext {
			if got == stepBad {
				return badPos
			}
			return elem
		}
		if i = sc.id(elem); i < 0 {
			return badPos
		}
	}
}

// id appends the token id at v, a little-endian uint32, to the arena and returns the position
// after it; badPos for anything but a run of digits worth at most math.MaxUint32 (what
// fastjson's Value.Uint64 reads, within range) ended by a byte that does not continue a number.
func (sc *scanner) id(v int) int {
	b := sc.body
	var x uint64
	j := v
	for ; j < len(b); j++ {
		c := b[j] - '0'
		if c > 9 {
			break
		}
		if x = x*10 + uint64(c); x > math.MaxUint32 {
			return badPos
		}
	}
	if j == v || j == len(b) || numByte[b[j]] {
		return badPos // not an id (a sign, a fraction, an exponent), or the body ends
	}
	sc.arena = binary.LittleEndian.AppendUint32(sc.arena, uint32(x))
	return j
}
