package proxy

import (
	"bufio"
	"bytes"
)

// bufferedChunk reports whether br already holds, read from the socket, one whole chunk of
// chunked transfer coding with data: size line (hex digits, optional extensions, CRLF), the
// data and its CRLF. Called at a chunk boundary, fasthttp's chunked body reader then reads
// that chunk without touching the socket, so relaying it together with the chunk just read
// cannot delay anything. The terminating zero-size chunk is left for the next Read.
func bufferedChunk(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	size, i := 0, 0
	for ; i < len(b); i++ {
		c := b[i]
		var d int
		switch {
		case '0' <= c && c <= '9':
			d = int(c - '0')
		case 'a' <= c && c <= 'f':
			d = int(c-'a') + 10
		case 'A' <= c && c <= 'F':
			d = int(c-'A') + 10
		default:
			goto sized
		}
		if i >= 7 { // ≥ 256 MiB: not a chunk worth coalescing
			return false
		}
		size = size<<4 | d
	}
sized:
	if i == 0 || size == 0 {
		return false
	}
	j := bytes.Index(b[i:], []byte("\r\n"))
	if j < 0 {
		return false
	}
	end := i + j + 2 + size + 2
	return end <= len(b) && b[end-2] == '\r' && b[end-1] == '\n'
}
