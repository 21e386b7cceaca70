package sim

// The sim's own tokenizer. It is not a real BPE and does not try to be one; it only has to be
// deterministic, cheap (no tables, no allocation besides the output), and give token counts in
// the same range as a real tokenizer on English text (about 4 characters per token), so that
// prefill costs and KV-cache occupancy are realistic. It deliberately differs from the router's
// bytes÷4 chunks: prefixlb must work without knowing the engine's tokenization.
//
// Rules, applied left to right:
//   - A run of ASCII letters, with one leading space folded in if present, is cut into pieces of
//     at most maxWordPiece bytes (" hello" is one token, " tokenization" is " token" "izatio" "n").
//   - A run of ASCII digits is cut into pieces of at most 3 digits (as Llama 3 does).
//   - One or two ASCII punctuation or symbol bytes are one token, with one leading space folded in.
//   - A run of spaces and tabs is one token, at most 8 bytes, leaving its last space to a
//     following word or symbol.
//   - A run of '\n' / '\r' is one token, at most 2 bytes.
//   - Any other byte sequence (non-ASCII) is one token per UTF-8 rune.
//
// A token's id is the 32-bit FNV-1a hash of its bytes, so equal text gives equal ids without a
// vocabulary. Measured on English prose in tokenize_test.go: about 4 bytes per token.

const (
	maxWordPiece  = 6
	maxDigitPiece = 3
	maxSpaceRun   = 8
	maxNewlineRun = 2

	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

const (
	clsOther   = iota // non-ASCII lead or continuation byte
	clsLetter         // a-z A-Z
	clsDigit          // 0-9
	clsSpace          // ' ' '\t'
	clsNewline        // '\n' '\r'
	clsPunct          // any other ASCII byte
)

var byteClass = func() (t [256]uint8) {
	for c := 0; c < 256; c++ {
		switch {
		case c >= 0x80:
			t[c] = clsOther
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			t[c] = clsLetter
		case c >= '0' && c <= '9':
			t[c] = clsDigit
		case c == ' ' || c == '\t':
			t[c] = clsSpace
		case c == '\n' || c == '\r':
			t[c] = clsNewline
		default:
			t[c] = clsPunct
		}
	}
	return t
}()

// Tokenize appends the sim's token ids of s to dst and returns it.
func Tokenize[S ~string | ~[]byte](dst []uint32, s S) []uint32 {
	n := len(s)
	for i := 0; i < n; {
		end := nextToken(s, i)
		h := uint32(fnvOffset32)
		for k := i; k < end; k++ {
			h ^= uint32(s[k])
			h *= fnvPrime32
		}
		dst = append(dst, h)
		i = end
	}
	return dst
}

// CountTokens returns how many tokens Tokenize would produce for s, without allocating.
func CountTokens[S ~string | ~[]byte](s S) int {
	c := 0
	for i := 0; i < len(s); c++ {
		i = nextToken(s, i)
	}
	return c
}

// nextToken returns the end offset of the token starting at i (i < len(s)).
func nextToken[S ~string | ~[]byte](s S, i int) int {
	n := len(s)
	start := i
	c := s[i]
	cls := byteClass[c]
	if c == ' ' && i+1 < n {
		if nc := byteClass[s[i+1]]; nc == clsLetter || nc == clsPunct {
			i++ // fold one leading space into the following word or symbol
			cls = nc
		}
	}
	switch cls {
	case clsLetter:
		j := i + 1
		for j < n && j-start < maxWordPiece && byteClass[s[j]] == clsLetter {
			j++
		}
		return j
	case clsDigit:
		j := i + 1
		for j < n && j-i < maxDigitPiece && byteClass[s[j]] == clsDigit {
			j++
		}
		return j
	case clsPunct:
		if i+1 < n && byteClass[s[i+1]] == clsPunct {
			return i + 2 // common pairs ("**", "),", "->") are one token in real vocabularies
		}
		return i + 1
	case clsSpace:
		j := i + 1
		for j < n && j-i < maxSpaceRun && byteClass[s[j]] == clsSpace {
			j++
		}
		if j < n && j-i > 1 && s[j-1] == ' ' {
			if nc := byteClass[s[j]]; nc == clsLetter || nc == clsPunct {
				j-- // leave the last space to the word that follows, as BPE vocabularies do
			}
		}
		return j
	case clsNewline:
		j := i + 1
		for j < n && j-i < maxNewlineRun && byteClass[s[j]] == clsNewline {
			j++
		}
		return j
	default:
		return i + runeLen(s, i)
	}
}

// runeLen returns the length of the UTF-8 sequence at s[i] (1 for an invalid byte), judged from
// the lead byte and checked against the continuation bytes, without decoding.
func runeLen[S ~string | ~[]byte](s S, i int) int {
	c := s[i]
	size := 1
	switch {
	case c >= 0xF8:
		size = 1
	case c >= 0xF0:
		size = 4
	case c >= 0xE0:
		size = 3
	case c >= 0xC0:
		size = 2
	}
	if i+size > len(s) {
		return 1
	}
	for k := i + 1; k < i+size; k++ {
		if s[k]&0xC0 != 0x80 {
			return 1
		}
	}
	return size
}

// tokenID returns the id Tokenize gives to a string that is exactly one token.
func tokenID(tok string) uint32 {
	h := uint32(fnvOffset32)
	for k := 0; k < len(tok); k++ {
		h ^= uint32(tok[k])
		h *= fnvPrime32
	}
	return h
}
