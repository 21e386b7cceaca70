package proxy

// Reading a backend's response: the head through fasthttp's ResponseHeader parser, after a
// look of prefixlb's own at its framing, and the body through upBody. prefixlb owns the
// upstream socket (upstream.go), so it reads the response from the connection's buffer
// itself rather than through fasthttp's body stream, for what fasthttp is stricter or
// blinder about than a proxy in front of vLLM and SGLang should be:
//
//   - a status outside 100–599 ("000") is an invalid response (502, retried elsewhere before
//     the first byte); fasthttp reads "000" as 0 and reports it as 200;
//   - a head whose lines end in bare LF is read (RFC 9112 §2.2 lets a recipient accept it,
//     as Go's net/http does) instead of waiting for a CRLF CRLF that never comes;
//   - a head longer than the 16 KiB read buffer grows it up to maxResponseHead (64 KiB) once;
//     past that it is an invalid response;
//   - a chunked body allows whitespace before a chunk extension's ";" (RFC 9112 §7.1.1 BWS),
//     and its trailer fields, whatever their names, are read and dropped (prefixlb relays no
//     trailers), where fasthttp would cut a response that arrived whole;
//   - a body with a Content-Length that fits the read buffer is read whole before the head
//     goes to the client, so that one cut short is a 502 (and retried elsewhere) rather
//     than a reply the client cannot read; a longer one has its head sent at once and is
//     cut as it ends, so the client sees fewer bytes than the length it was told.

import (
	"bufio"
	"bytes"
	"errors"
	"io"

	"github.com/valyala/fasthttp"
)

// maxResponseHead bounds a backend's response head (status line and header fields), bytes:
// Envoy's default max_response_headers_kb is 60 KiB, HAProxy's tune.bufsize 16 KiB, nginx's
// proxy_buffer_size 4–8 KiB. A longer head gets the client a 502 (invalid response).
const maxResponseHead = 64 << 10

// maxInterimResponses bounds the 1xx responses read before the final one (as fasthttp's).
const maxInterimResponses = 100

// Causes of an invalid response (class errInvalidResponse) found reading a response.
var (
	errBadStatus      = errors.New("status code outside 100-599")
	errHeadTooLarge   = errors.New("response head over 64 KiB")
	errManyInterim    = errors.New("more than 100 interim (1xx) responses")
	errChunkLine      = errors.New("malformed chunk size line")
	errChunkEnd       = errors.New("chunk data not followed by CRLF")
	errChunkOverhead  = errors.New("chunk extensions or trailers out of proportion to the data")
	errTrailerTooLong = errors.New("trailer section over 64 KiB")
)

// readHead reads the final response head from c into f.resp (1xx interim responses other
// than 101 are skipped) and prepares c.body for its body. When a body follows, it also waits
// for its first byte (of a chunked body: its first size line), or for the whole of a body
// whose length fits the read buffer: vLLM
// sends stream headers at once, then queues and prefills, and nothing reaches the client
// before the first body byte (fasthttp sends headers with the first chunk), so a backend that
// dies in that window is still retried elsewhere.
func readHead(f *flow, c *uconn, head bool) error {
	h := &f.resp.Header
	for n := 0; ; n++ {
		if err := readHeader(h, c); err != nil {
			return err
		}
		if st := h.StatusCode(); st >= 200 || st == 101 {
			break
		}
		if n >= maxInterimResponses {
			return &failure{errInvalidResponse, errManyInterim}
		}
	}
	if !hasBody(&f.resp, head) {
		return nil
	}
	cl := h.ContentLength()
	c.body.reset(c, cl)
	f.body = &c.body
	if cl == -1 {
		// The first chunk's size line: one the backend botched is an invalid response while
		// the request can still go elsewhere.
		switch err := c.body.sizeLine(); {
		case err == io.EOF: // an empty body: its last chunk and trailers are read
			c.body.err = io.EOF
		case err != nil:
			return err
		}
		return nil
	}
	if cl > 0 && cl <= c.br.Size() {
		if b, err := c.br.Peek(cl); err != nil {
			if len(b) > 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
				return &failure{errTruncated, io.ErrUnexpectedEOF}
			}
			return err
		}
		return nil
	}
	_, err := c.br.Peek(1)
	return err
}

// readHeader reads one response head from c into h: scanHead finds where it ends and checks
// its status; a head with bare-LF lines is parsed from a copy with CRLF line ends.
func readHeader(h *fasthttp.ResponseHeader, c *uconn) error {
	sc, err := scanHead(c)
	if err != nil {
		return err
	}
	if sc.start > 0 {
		_, _ = c.br.Discard(sc.start) // blank lines before the status line
	}
	if !sc.bareLF {
		return h.Read(c.br)
	}
	raw, _ := c.br.Peek(sc.end - sc.start)
	crlf := make([]byte, 0, len(raw)+64)
	for len(raw) > 0 {
		i := bytes.IndexByte(raw, '\n')
		line := raw[:i]
		line = bytes.TrimSuffix(line, []byte{'\r'})
		crlf = append(append(crlf, line...), '\r', '\n')
		raw = raw[i+1:]
	}
	if err := h.Read(bufio.NewReaderSize(bytes.NewReader(crlf), len(crlf))); err != nil {
		return err
	}
	_, _ = c.br.Discard(sc.end - sc.start)
	return nil
}

// headScan is where a response head lies in a connection's unread bytes: from start (after
// blank lines) to end (after its blank line); bareLF when a line of it ends in LF alone.
type headScan struct {
	start, end int
	bareLF     bool
}

// scanHead finds the response head at the front of c's unread bytes without consuming them,
// reading from the socket until its blank line arrives. Its status code must be within
// 100–599 (errBadStatus); the rest of the status line is fasthttp's to judge. A head that
// does not fit the read buffer grows it to maxResponseHead (the connection is then not
// reused); past that, errHeadTooLarge. The connection ending first is io.EOF (nothing read)
// or io.ErrUnexpectedEOF; a timeout is the read's error.
func scanHead(c *uconn) (headScan, error) {
	var sc headScan
	off, status := 0, false
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		for off < len(buf) {
			i := bytes.IndexByte(buf[off:], '\n')
			if i < 0 {
				break
			}
			line := buf[off : off+i]
			next := off + i + 1
			bare := len(line) == 0 || line[len(line)-1] != '\r'
			if !bare {
				line = line[:len(line)-1]
			}
			switch {
			case !status && len(line) == 0:
				sc.start = next // a blank line before the status line: skipped
			case len(line) == 0:
				sc.bareLF = sc.bareLF || bare
				sc.end = next
				return sc, nil
			case !status:
				if !statusInRange(line) {
					return sc, &failure{errInvalidResponse, errBadStatus}
				}
				status = true
				sc.bareLF = bare
			default:
				sc.bareLF = sc.bareLF || bare
			}
			off = next
		}
		n := c.br.Buffered()
		if n >= maxResponseHead {
			return sc, &failure{errInvalidResponse, errHeadTooLarge}
		}
		if n >= c.br.Size() {
			c.br = bufio.NewReaderSize(c.br, maxResponseHead)
			c.noReuse = true
		}
		if _, err := c.br.Peek(n + 1); err != nil && c.br.Buffered() <= n {
			if errors.Is(err, io.EOF) && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return sc, err
		}
	}
}

// statusInRange reports whether a status line's code, when it has one where one belongs
// (three digits after the version and its space), is within 100–599; a line without one is
// left to fasthttp's parser, which refuses it.
func statusInRange(line []byte) bool {
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		return true
	}
	code := bytes.TrimLeft(line[sp+1:], " ")
	if i := bytes.IndexByte(code, ' '); i >= 0 {
		code = code[:i]
	}
	if len(code) != 3 {
		return true
	}
	n := 0
	for _, d := range code {
		if d < '0' || d > '9' {
			return true
		}
		n = n*10 + int(d-'0')
	}
	return n >= 100 && n <= 599
}

// Framings of a response body (upBody.mode).
const (
	framedLength  = iota // Content-Length
	framedChunked        // Transfer-Encoding: chunked
	framedClose          // neither: the body ends when the connection does
)

// upBody reads one response body from a backend connection as its framing says: it returns
// io.EOF at the body's end, io.ErrUnexpectedEOF when the connection ends before it, and a
// *failure (errInvalidResponse) for a malformed chunked coding. A Read that has data returns
// it rather than wait on the socket for more (so every chunk goes to the client as it
// arrives) and otherwise takes all the whole chunks already read from the socket. Trailer
// fields are read and dropped. It lives in its uconn: one response at a time.
type upBody struct {
	c        *uconn
	mode     uint8
	left     int64 // framedLength: body bytes to come; framedChunked: data bytes left in the chunk
	crlf     bool  // framedChunked: the CRLF after the chunk's data is still to read
	overhead int64 // framedChunked: size-line and trailer bytes beyond their allowance (chunkOverhead)
	err      error // the error every later Read returns (io.EOF once the body ended)
}

// reset prepares b for the body of a response with Content-Length cl (fasthttp's: -1
// chunked, -2 neither) on c.
func (b *upBody) reset(c *uconn, cl int) {
	*b = upBody{c: c, mode: framedLength, left: int64(cl)}
	switch {
	case cl == -1:
		b.mode, b.left = framedChunked, 0
	case cl < 0:
		b.mode, b.left = framedClose, 0
		c.noReuse = true
	}
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	switch b.mode {
	case framedLength:
		if b.left == 0 {
			b.err = io.EOF
			return 0, io.EOF
		}
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err := b.c.br.Read(p)
		b.left -= int64(n)
		switch {
		case b.left == 0:
			b.err = io.EOF
		case errors.Is(err, io.EOF):
			b.err = io.ErrUnexpectedEOF
		case err != nil:
			b.err = err
		}
		if n > 0 && b.err != io.EOF {
			return n, nil
		}
		return n, b.err
	case framedClose:
		n, err := b.c.br.Read(p)
		if err != nil {
			b.err = err
		}
		return n, err
	}
	return b.readChunked(p)
}

// chunkOverhead is what a chunked body may carry besides its data before it is refused, as
// Go's net/http measures it: each chunk is allowed chunkAllowance bytes of size line and
// framing plus twice its data, and what exceeds that, summed over the body, may reach
// chunkOverhead. A stream of one-byte chunks passes; kilobytes of extensions per byte do not.
const (
	chunkOverhead  = 16 << 10
	chunkAllowance = 16
)

func (b *upBody) readChunked(p []byte) (n int, err error) {
	br := b.c.br
	for n < len(p) && b.err == nil {
		if b.crlf {
			if n > 0 && br.Buffered() < 2 {
				return n, nil
			}
			b.err = b.chunkEnd()
			continue
		}
		if b.left == 0 {
			if n > 0 && bytes.IndexByte(peekBuffered(br), '\n') < 0 {
				return n, nil
			}
			b.err = b.sizeLine()
			continue
		}
		if n > 0 && br.Buffered() == 0 {
			return n, nil
		}
		m, rerr := br.Read(p[n:min(int64(len(p)), int64(n)+b.left)])
		n += m
		b.left -= int64(m)
		if b.left == 0 {
			b.crlf = true
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				rerr = io.ErrUnexpectedEOF
			}
			b.err = rerr
		}
	}
	if b.err != nil && (n == 0 || b.err == io.EOF) {
		return n, b.err
	}
	return n, nil
}

// peekBuffered returns what br holds, without reading.
func peekBuffered(br *bufio.Reader) []byte {
	p, _ := br.Peek(br.Buffered())
	return p
}

// chunkEnd reads the CRLF after a chunk's data.
func (b *upBody) chunkEnd() error {
	br := b.c.br
	p, err := br.Peek(2)
	if len(p) < 2 {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	if p[0] != '\r' || p[1] != '\n' {
		return &failure{errInvalidResponse, errChunkEnd}
	}
	_, _ = br.Discard(2)
	b.crlf = false
	return nil
}

// sizeLine reads a chunk's size line: hex digits, optional whitespace, optional extensions
// after ";" (ignored), CRLF (a bare LF is refused here, as by Go and fasthttp: RFC 9112
// erratum 7633). A zero size ends the data; the trailer section is then read (trailers).
func (b *upBody) sizeLine() error {
	line, err := b.c.br.ReadSlice('\n')
	if err != nil {
		switch {
		case errors.Is(err, io.EOF):
			return io.ErrUnexpectedEOF
		case errors.Is(err, bufio.ErrBufferFull):
			return &failure{errInvalidResponse, errChunkLine}
		}
		return err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return &failure{errInvalidResponse, errChunkLine}
	}
	s := line[:len(line)-2]
	var size int64
	digits := 0
	for ; digits < len(s); digits++ {
		d := unhex(s[digits])
		if d < 0 {
			break
		}
		if size >= 1<<59 { // past 2^63 with this digit: no chunk is that long
			return &failure{errInvalidResponse, errChunkLine}
		}
		size = size<<4 | int64(d)
	}
	rest := bytes.TrimLeft(s[digits:], " \t")
	if digits == 0 || (len(rest) > 0 && rest[0] != ';') || bytes.IndexByte(rest, '\r') >= 0 {
		return &failure{errInvalidResponse, errChunkLine}
	}
	if err := b.spend(int64(len(line)) + 2 - chunkAllowance - 2*size); err != nil {
		return err
	}
	if size == 0 {
		return b.trailers()
	}
	b.left = size
	return nil
}

// trailers reads the trailer section after the last chunk, up to its blank line, and drops
// it. Its lines may end in bare LF, and any field is taken: the body arrived whole whatever
// they say. It returns io.EOF: the body's end.
func (b *upBody) trailers() error {
	total, partial := 0, false // partial: the last slice was cut by the buffer, not a line end
	for {
		line, err := b.c.br.ReadSlice('\n')
		total += len(line)
		switch {
		case errors.Is(err, io.EOF) && total == 0:
			// The connection ended right after the last chunk: every data byte arrived, but
			// the connection is not left where the next response starts.
			b.c.noReuse = true
			return io.EOF
		case errors.Is(err, io.EOF):
			return io.ErrUnexpectedEOF
		case errors.Is(err, bufio.ErrBufferFull):
		case err != nil:
			return err
		}
		if total > maxResponseHead {
			return &failure{errInvalidResponse, errTrailerTooLong}
		}
		if err == nil && !partial && len(bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'})) == 0 {
			return io.EOF
		}
		partial = err != nil
	}
}

// spend counts n bytes of chunk framing beyond their allowance (negative: under it).
func (b *upBody) spend(n int64) error {
	b.overhead = max(b.overhead+n, 0)
	if b.overhead > chunkOverhead {
		return &failure{errInvalidResponse, errChunkOverhead}
	}
	return nil
}

// unhex is the value of a hex digit, -1 for another byte.
func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
