package key

import (
	"bytes"
	"unicode/utf8"
)

// The model of a body the key could not read. A routed request whose body does not key (not
// JSON to fastjson, nested deeper than its limit, invalid UTF-8 somewhere, a field of the
// wrong type) is forwarded unchanged with fallback routing; it must still go to its model's
// pool, as the backend reads its "model" whatever else is wrong (and answers the error).
// fallbackModel reads the top-level "model" member with a lenient scan that skips nested
// values by counting brackets (no depth limit, no recursion), and unescapes only its value.

// fallbackModel sets k.Model to body's top-level "model" string (the last one, as Python's
// json and fastjson keep), when body is an object whose top level scans; else it leaves
// k.Model as it is. A model that is not a string, or not valid UTF-8, is not taken.
func (s *state) fallbackModel(body []byte, k *Key) {
	v := topLevelMember(body, "model")
	if len(v) == 0 || v[0] != '"' || !utf8.Valid(v) {
		return
	}
	p, err := s.parser.ParseBytes(v)
	if err != nil {
		return
	}
	if b, ok := optString(p); ok && len(b) > 0 {
		k.Model = append(k.Model[:0], b...)
	}
}

// topLevelMember returns the raw bytes of the last top-level member name of the object in
// body (a name without escapes), or nil. Nested values are skipped by bracket counting,
// strings by their unescaped quotes; a body that ends early yields nil.
func topLevelMember(body []byte, name string) []byte {
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil
	}
	var found []byte
	for i++; ; {
		i = skipWS(body, i)
		if i >= len(body) {
			return found
		}
		switch body[i] {
		case '}':
			return found
		case ',':
			i++
			continue
		case '"':
		default:
			return found
		}
		end := stringEnd(body, i)
		if end < 0 {
			return found
		}
		key := body[i+1 : end-1]
		i = skipWS(body, end)
		if i >= len(body) || body[i] != ':' {
			return found
		}
		i = skipWS(body, i+1)
		vEnd := valueEnd(body, i)
		if vEnd < 0 {
			return found
		}
		if string(key) == name {
			found = body[i:vEnd]
		}
		i = vEnd
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the position after the string whose quote is at i, or -1.
func stringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		n := bytes.IndexByte(b[j:], '"')
		if n < 0 {
			return -1
		}
		q := j + n
		bs := 0
		for k := q - 1; k > i && b[k] == '\\'; k-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// valueEnd returns the position after the value at i (any depth, brackets counted, not
// validated), or -1 when the body ends first.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				if i = stringEnd(b, i); i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}

// Fallback sets k to the key of a request to path whose body the Builder could not read, as
// Build leaves one that does not parse: API from the path, Routed for a routed API (with
// OK false, no chunks, PromptTokens 0, Body set), and Model from the lenient top-level
// "model" scan, so that the request stays in its model's pool. A caller that contained a
// panic of Build (which leaves k partly filled) calls it before routing the request by
// parse-fallback. It uses scratch state of its own, never pooled; a panic in the scan leaves
// every field set but Model, which is then empty.
func Fallback(path, body []byte, k *Key) {
	k.Reset()
	k.API = classify(path)
	k.Routed = k.API.Routed()
	if k.Routed {
		k.Body = body
	}
	if k.API != APINone {
		var s state
		s.fallbackModel(body, k)
	}
}
