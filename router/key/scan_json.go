package key

// The fast path's JSON reader: it steps through objects and arrays, validates and skips
// values, and unescapes strings, accepting a subset of what fastjson accepts (so that a body
// the fast path takes is one the fastjson path would take too): whitespace is space, \t, \n,
// \r; a number is a run of [0-9.eE+-] (not a lone sign) as fastjson reads it, and renders as
// that text; a string ends at the first quote preceded by an even number of backslashes; an
// object key has no escapes; a string escape is one that fastjson decodes.

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// step is what member and element found. Callers test got != stepNext first, so that the
// common case costs one branch.
type step int

const (
	stepBad  step = -1 // a syntax error (or an escaped key)
	stepNext step = 0  // the next member or element
	stepEnd  step = 1  // the end of the object or array
)

// The JSON literals.
const (
	litTrue  = "true"
	litFalse = "false"
	litNull  = "null"
)

// ws returns the position of the first non-whitespace byte at or after i.
func (sc *scanner) ws(i int) int {
	b := sc.body
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// member steps through an object: i is the position of its '{' (first) or just after a
// member's value. It returns the next member's name and the position of its value
// (stepNext), or the position after the closing '}' (stepEnd), or stepBad.
func (sc *scanner) member(i int, first bool) (name []byte, v int, got step) {
	b := sc.body
	if first {
		i = sc.ws(i + 1)
		if i < len(b) && b[i] == '}' {
			return nil, i + 1, stepEnd
		}
	} else {
		i = sc.ws(i)
		if i >= len(b) {
			return nil, 0, stepBad
		}
		if b[i] == '}' {
			return nil, i + 1, stepEnd
		}
		if b[i] != ',' {
			return nil, 0, stepBad
		}
		i = sc.ws(i + 1)
	}
	if i >= len(b) || b[i] != '"' {
		return nil, 0, stepBad
	}
	i++
	j := i
	for j < len(b) && b[j] != '"' && b[j] != '\\' {
		j++
	}
	if j >= len(b) || b[j] != '"' {
		return nil, 0, stepBad // unterminated, or an escaped key: left to fastjson
	}
	name = b[i:j]
	i = sc.ws(j + 1)
	if i >= len(b) || b[i] != ':' {
		return nil, 0, stepBad
	}
	i = sc.ws(i + 1)
	if i >= len(b) {
		return nil, 0, stepBad
	}
	return name, i, stepNext
}

// element steps through an array like member: the next element's position (stepNext), the
// position after ']' (stepEnd), or stepBad.
func (sc *scanner) element(i int, first bool) (v int, got step) {
	b := sc.body
	if first {
		i = sc.ws(i + 1)
		if i < len(b) && b[i] == ']' {
			return i + 1, stepEnd
		}
	} else {
		i = sc.ws(i)
		if i >= len(b) {
			return 0, stepBad
		}
		if b[i] == ']' {
			return i + 1, stepEnd
		}
		if b[i] != ',' {
			return 0, stepBad
		}
		i = sc.ws(i + 1)
	}
	if i >= len(b) {
		return 0, stepBad
	}
	return i, stepNext
}

// skip validates the value at i, of the given depth, and returns the position after it, or
// badPos.
func (sc *scanner) skip(i, depth int) int {
	b := sc.body
	switch b[i] {
	case '"':
		return sc.strEnd(i)
	case '{':
		if depth > maxFastDepth {
			return badPos
		}
		for first := true; ; first = false {
			_, v, got := sc.member(i, first)
			if got != stepNext {
				if got == stepBad {
					return badPos
				}
				return v
			}
			if i = sc.skip(v, depth+1); i < 0 {
				return badPos
			}
		}
	case '[':
		if depth > maxFastDepth {
			return badPos
		}
		for first := true; ; first = false {
			v, got := sc.element(i, first)
			if got != stepNext {
				if got == stepBad {
					return badPos
				}
				return v
			}
			if i = sc.skip(v, depth+1); i < 0 {
				return badPos
			}
		}
	case 't':
		return sc.literal(i, litTrue)
	case 'f':
		return sc.literal(i, litFalse)
	case 'n':
		return sc.literal(i, litNull) // "nan" is left to fastjson
	}
	return sc.number(i)
}

func (sc *scanner) literal(i int, lit string) int {
	if !bytes.HasPrefix(sc.body[i:], []byte(lit)) {
		return badPos
	}
	return i + len(lit)
}

// number returns the position after the number at i, read as fastjson reads it: a run of
// [0-9.eE+-] that is not empty nor a lone sign (those are NaN, Inf or errors). badPos
// otherwise, also at the end of the body (no valid body ends in a number).
func (sc *scanner) number(i int) int {
	b := sc.body
	j := i
	for j < len(b) && numByte[b[j]] {
		j++
	}
	if j == len(b) || j == i || j == i+1 && (b[i] == '-' || b[i] == '+') {
		return badPos
	}
	return j
}

// numByte reports the bytes that fastjson reads as part of a number.
var numByte = [256]bool{'0': true, '1': true, '2': true, '3': true, '4': true, '5': true, '6': true,
	'7': true, '8': true, '9': true, '.': true, '-': true, '+': true, 'e': true, 'E': true}

// strEnd returns the position after the string whose opening quote is at i: past the first
// quote preceded by an even number of backslashes (as fastjson finds it), or badPos.
func (sc *scanner) strEnd(i int) int {
	b := sc.body
	j := i + 1
	for {
		n := bytes.IndexByte(b[j:], '"')
		if n < 0 {
			return badPos
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

// str returns the unescaped bytes of the string at v (a slice of the body, or of the arena
// when it has escapes) and the position after it; badPos for an escape that fastjson would not
// decode.
func (sc *scanner) str(v int) ([]byte, int) {
	b := sc.body
	i := v + 1
	q := bytes.IndexByte(b[i:], '"')
	if q < 0 {
		return nil, badPos
	}
	q += i
	n := bytes.IndexByte(b[i:q], '\\')
	if n < 0 {
		return b[i:q], q + 1
	}
	return sc.unescapeStr(i, i+n, q)
}

// unescapeStr appends the unescaped string that starts at i, whose first backslash is at p
// and whose first quote (perhaps an escaped one) is at q, to the arena and returns it with the
// position after its closing quote (badPos as for str).
//
// It decodes escapes in order, so the first '"' or '\\' after an escape ends the run of
// plain bytes, and a '"' there ends the string. Runs are found with bytes.IndexByte, the
// quote search reused until the scan passes it, and copied whole; common one-byte escapes are
// decoded inline. (Checking the next 8 bytes in one word before searching, or copying 8 bytes
// at a time, measured no faster on escape-dense text: the per-escape cost dominates.)
func (sc *scanner) unescapeStr(i, p, q int) ([]byte, int) {
	b := sc.body
	start := len(sc.arena)
	dst := append(sc.arena, b[i:p]...)
	i = p
	for {
		// b[i] == '\\'
		if i+1 < len(b) && unescapeByte[b[i+1]] != 0 {
			dst = append(dst, unescapeByte[b[i+1]])
			i += 2
		} else {
			d, w := sc.unescapeU(b[i:])
			if w == 0 {
				return nil, badPos
			}
			dst = append(dst, d...)
			i += w
		}
		if q < i { // the quote at q was escaped: find the next one
			n := bytes.IndexByte(b[i:], '"')
			if n < 0 {
				return nil, badPos
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
			sc.arena = dst
			return dst[start:], i + 1
		}
	}
}

// unescapeByte maps the character after a backslash to the byte it stands for, for the
// one-byte escapes; 0 for the others (\u, and invalid ones). fastjson decodes the same.
var unescapeByte = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// Lengths in the body of a \u escape and of a surrogate pair of them.
const (
	uEscapeLen     = len(`\u0000`)
	uEscapePairLen = 2 * uEscapeLen
)

// unescapeU decodes the \u escape at the start of s (s[0] == '\\') and returns its UTF-8
// bytes and its length in s: uEscapeLen, or uEscapePairLen for a surrogate pair. It decodes
// what fastjson decodes and returns length 0 for what fastjson keeps verbatim or replaces by
// U+FFFD: another escape (the one-byte ones are decoded by the caller; the rest are invalid),
// a bad \u, a lone or reversed surrogate.
func (sc *scanner) unescapeU(s []byte) ([]byte, int) {
	if len(s) < uEscapeLen || s[1] != 'u' {
		return nil, 0
	}
	x, ok := hex4(s[2:])
	if !ok {
		return nil, 0
	}
	if !utf16.IsSurrogate(x) {
		return sc.decoded[:utf8.EncodeRune(sc.decoded[:], x)], uEscapeLen
	}
	if len(s) < uEscapePairLen || s[uEscapeLen] != '\\' || s[uEscapeLen+1] != 'u' {
		return nil, 0
	}
	y, ok := hex4(s[uEscapeLen+2:])
	if !ok {
		return nil, 0
	}
	pair := utf16.DecodeRune(x, y) // U+FFFD unless x is a high surrogate and y a low one
	if pair == utf8.RuneError {
		return nil, 0
	}
	return sc.decoded[:utf8.EncodeRune(sc.decoded[:], pair)], uEscapePairLen
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
