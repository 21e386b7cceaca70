package key

// Paths as the backend reads them. uvicorn (vLLM, SGLang) percent-decodes the request path
// before routing (urllib's unquote: every %XX, invalid escapes kept as they are), so
// /v1/%63hat/completions is its chat endpoint; prefixlb classifies the same decoded path, or a
// client could take a request out of its model pool, and out of prefix routing, by encoding
// a letter. The bytes forwarded are the client's, unchanged.

// maxClassifiedPath is the longest decoded path classify can match, in bytes: the longest
// known path ("/v1/chat/completions", 20) and a trailing slash, with room to spare.
const maxClassifiedPath = 32

// DecodePath appends path with its percent-escapes decoded (%XX, either case of hex; a '%'
// not followed by two hex digits is kept) to dst and returns it. It does not allocate when
// dst has room.
func DecodePath(dst, path []byte) []byte {
	for i := 0; i < len(path); i++ {
		c := path[i]
		if c == '%' && i+2 < len(path) {
			hi, ok1 := unhex(path[i+1])
			lo, ok2 := unhex(path[i+2])
			if ok1 && ok2 {
				dst = append(dst, hi<<4|lo)
				i += 2
				continue
			}
		}
		dst = append(dst, c)
	}
	return dst
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// hasEscape reports whether path has a '%'.
func hasEscape(path []byte) bool {
	for _, c := range path {
		if c == '%' {
			return true
		}
	}
	return false
}

// PathIs reports whether path, decoded as DecodePath does, is want. It does not allocate.
func PathIs(path []byte, want string) bool {
	if !hasEscape(path) {
		return string(path) == want
	}
	if len(path) > 3*maxClassifiedPath {
		return false
	}
	var buf [3 * maxClassifiedPath]byte
	return string(DecodePath(buf[:0], path)) == want
}
