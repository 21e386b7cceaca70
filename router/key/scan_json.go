package key

// The fast path's JSON reader: it steps through objects and arrays, validates and skips
// values, and unescapes strings, accepting a subset of what fastjson accepts (so that a body
// the fast path takes is one the fastjson path would take too): whitespace is space, \t, \n,
// \r; a number is a run of [0-9.eE+-] (not a lone sign) as fastjson reads it, and renders as
// that text; a string ends at the first quote preceded by an even number of backslashes; a
// string (an object key too) is unescaped exactly as fastjson unescapes it, decoding what it
// decodes and keeping or replacing what it keeps or replaces (its "best effort": an unknown
// escape, a short or bad \u, a lone surrogate).

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
	switch {
	case j >= len(b):
		return nil, 0, stepBad // unterminated
	case b[j] == '"':
		name, j = b[i:j], j+1
	default:
		if name, j = sc.key(i, j); j < 0 {
			return nil, 0, stepBad
		}
	}
	i = sc.ws(j)
	if i >= len(b) || b[i] != ':' {
		return nil, 0, stepBad
	}
	i = sc.ws(i + 1)
	if i >= len(b) {
		return nil, 0, stepBad
	}
	return name, i, stepNext
}

// eachMember steps through the object at o (its '{'), calling fn with each member's name and
// the position of its value, in order; fn returns the position after that value, or badPos to
// stop. It returns the position after the object, or badPos on a syntax error or when fn
// stopped. name may be scratch (see key): fn uses it before it reads another string.
func (sc *scanner) eachMember(o int, fn func(name []byte, v int) int) int {
	return sc.eachMemberFrom(o, true, fn)
}

// eachMemberFrom is eachMember from i: the object's '{' when first, else the position after
// one of its members' values.
func (sc *scanner) eachMemberFrom(i int, first bool, fn func(name []byte, v int) int) int {
	for ; ; first = false {
		name, v, got := sc.member(i, first)
		if got != stepNext {
			if got == stepBad {
				return badPos
			}
			return v
		}
		if i = fn(name, v); i < 0 {
			return badPos
		}
	}
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
		return sc.eachMember(i, func(_ []byte, v int) int { return sc.skip(v, depth+1) })
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
// when it has escapes) and the position after it; badPos when it is unterminated.
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
	start := len(sc.arena)
	dst, end := sc.unescape(sc.arena, i, i+n, q)
	if end < 0 {
		return nil, badPos
	}
	sc.arena = dst
	return dst[start:], end
}

// key unescapes the object key whose first byte is at i and whose first backslash is at p
// into the arena's free tail, and returns it with the position after its closing quote
// (badPos when it is unterminated). The key is scratch, not kept: the next string or key read
// overwrites it, and every caller of member uses a name before it reads on. So keys take no
// room of their own: what the arena keeps and the key being read come from different bytes
// of the body.
func (sc *scanner) key(i, p int) ([]byte, int) {
	q := bytes.IndexByte(sc.body[p:], '"')
	if q < 0 {
		return nil, badPos
	}
	start := len(sc.arena)
	dst, end := sc.unescape(sc.arena, i, p, p+q)
	if end < 0 {
		return nil, badPos
	}
	sc.arena = dst[:start]
	return dst[start:], end
}

// reserve returns the arena dst with room for need bytes in all (its length included): when
// it has not, it is grown at once to the body's length (need when that is more), which the
// strings of one build never exceed: each string is unescaped once, and unescaping never
// lengthens one. So a body with escapes costs one allocation of its size, as the pooled arena
// of a small body does.
func (sc *scanner) reserve(dst []byte, need int) []byte {
	if need <= cap(dst) {
		return dst
	}
	grown := make([]byte, len(dst), max(need, len(sc.body)))
	copy(grown, dst)
	return grown
}

// unescape appends to dst the unescaped string whose first byte is at i, whose first
// backslash is at p and whose first quote (perhaps an escaped one) is at q, and returns dst
// with the position after the closing quote (badPos when the string is unterminated). dst is
// the arena, grown by reserve.
//
// It decodes escapes in order, so the first '"' or '\\' after an escape ends the run of
// plain bytes, and a '"' there ends the string. Runs are found with bytes.IndexByte, the
// quote search reused until the scan passes it, and copied whole; common one-byte escapes are
// decoded inline (word-at-a-time checks or copies gain nothing on escape-dense text: the
// per-escape cost dominates). An escape that fastjson does not decode (unescapeU) hands the
// rest of the string to bestEffort, which unescapes it as fastjson does. The unescaped string
// is never longer than the raw one, so dst is grown (reserve) when a quote is found, to hold
// what precedes it, never per byte.
func (sc *scanner) unescape(dst []byte, i, p, q int) ([]byte, int) {
	b := sc.body
	dst = sc.reserve(dst, len(dst)+q-i) // what is read up to q takes at most its length
	dst = append(dst, b[i:p]...)
	i = p
	for {
		// b[i] == '\\'
		if i+1 < len(b) && unescapeByte[b[i+1]] != 0 {
			dst = append(dst, unescapeByte[b[i+1]])
			i += 2
		} else {
			d, w := sc.unescapeU(b[i:])
			if w == 0 {
				return sc.bestEffort(dst, i)
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
			dst = sc.reserve(dst, len(dst)+q-i)
		}
		k := q // the next '"' or '\\'
		if n := bytes.IndexByte(b[i:q], '\\'); n >= 0 {
			k = i + n
		}
		dst = append(dst, b[i:k]...)
		i = k
		if b[i] == '"' {
			return dst, i + 1
		}
	}
}

// bestEffort finishes unescape from the escape at p that fastjson does not decode (dst holds
// the string before p, unescaped), exactly as
// fastjson's unescapeStringBestEffort does: an unknown escape is kept as it is, a \u without
// four hex digits becomes "\u" and what follows is read on, a surrogate not followed by a \u
// escape with four hex digits is kept as its escape, and any other pair of \u escapes
// starting with a surrogate is one rune (U+FFFD unless they form a valid pair). It returns
// dst and the position after the closing quote, found as fastjson finds it.
func (sc *scanner) bestEffort(dst []byte, p int) ([]byte, int) {
	b := sc.body
	// strEnd from p-1 counts the backslashes before a quote from p on: any before p are pairs
	// (escaped backslashes, \\), which keep the count's parity.
	end := sc.strEnd(p - 1)
	if end < 0 {
		return nil, badPos
	}
	dst = sc.reserve(dst, len(dst)+end-1-p)
	s := b[p+1 : end-1] // after the backslash at p, up to the closing quote
	for len(s) > 0 {
		ch := s[0]
		s = s[1:]
		switch {
		case unescapeByte[ch] != 0:
			dst = append(dst, unescapeByte[ch])
		case ch != 'u':
			dst = append(dst, '\\', ch)
		case len(s) < 4:
			dst = append(dst, `\u`...)
		default:
			x, ok := hex4(s)
			if !ok {
				dst = append(dst, `\u`...)
				break
			}
			xs := s[:4]
			s = s[4:]
			if !utf16.IsSurrogate(x) {
				dst = utf8.AppendRune(dst, x)
				break
			}
			var y rune
			if len(s) >= uEscapeLen && s[0] == '\\' && s[1] == 'u' {
				y, ok = hex4(s[2:])
			} else {
				ok = false
			}
			if !ok {
				dst = append(append(dst, `\u`...), xs...)
				break
			}
			dst = utf8.AppendRune(dst, utf16.DecodeRune(x, y))
			s = s[uEscapeLen:]
		}
		n := bytes.IndexByte(s, '\\')
		if n < 0 {
			return append(dst, s...), end
		}
		dst = append(dst, s[:n]...)
		s = s[n+1:]
	}
	return dst, end
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
// bytes and its length in s: uEscapeLen, or uEscapePairLen for a surrogate pair. It returns
// length 0 for what fastjson keeps verbatim or replaces by U+FFFD (bestEffort reads those):
// another escape (the one-byte ones are decoded by the caller; the rest are unknown), a bad
// \u, a lone or reversed surrogate.
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
