package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http/httputil"
	"strings"
	"testing"
	"testing/iotest"
)

// bodyOf decodes wire as a body framed as cl says (fasthttp's: -1 chunked, -2 neither) from a
// connection buffer of bufSize bytes, reading at most step bytes at a time, and returns the
// data, the error that ended it and the connection after it.
func bodyOf(wire string, cl, step, bufSize int) (string, error, *uconn) {
	c := &uconn{br: bufio.NewReaderSize(strings.NewReader(wire), bufSize)}
	c.body.reset(c, cl)
	var out []byte
	p := make([]byte, step)
	for {
		n, err := c.body.Read(p)
		out = append(out, p[:n]...)
		if err != nil {
			return string(out), err, c
		}
	}
}

func TestUpBodyFraming(t *testing.T) {
	long := strings.Repeat("z", 40)
	for _, c := range []struct {
		name, wire string
		cl         int
		data       string
		err        error // io.EOF: complete
		noReuse    bool
		leftover   string // what stays in the buffer for the next response
	}{
		{"length", "hello world", 5, "hello", io.EOF, false, " world"},
		{"length cut short", "hel", 5, "hel", io.ErrUnexpectedEOF, false, ""},
		{"close-delimited", "all of it", -2, "all of it", io.EOF, true, ""},
		{"chunked", "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nNEXT", -1, "hello world", io.EOF, false, "NEXT"},
		{"chunked, long chunk over small reads", "28\r\n" + long + "\r\n0\r\n\r\n", -1, long, io.EOF, false, ""},
		{"extension after whitespace", "5 \t; name=\"a;b\"\r\nhello\r\n0 ; x\r\n\r\n", -1, "hello", io.EOF, false, ""},
		{"trailers of any name", "5\r\nhello\r\n0\r\nContent-Length: 9\r\nTrailer: x\r\n\r\nNEXT", -1, "hello", io.EOF, false, "NEXT"},
		{"trailers in bare LF", "5\r\nhello\r\n0\r\nA: b\n\nNEXT", -1, "hello", io.EOF, false, "NEXT"},
		{"a size line over the buffer", "5;" + long + "\r\nhello\r\n0\r\n\r\n", -1, "", errChunkLine, false, ""},
		{"a trailer line over the buffer", "5\r\nhello\r\n0\r\nX: " + long + "\r\n\r\nNEXT", -1, "hello", io.EOF, false, "NEXT"},
		{"ends after the last chunk", "5\r\nhello\r\n0\r\n", -1, "hello", io.EOF, true, ""},
		{"cut in the trailers", "5\r\nhello\r\n0\r\nA: b", -1, "hello", io.ErrUnexpectedEOF, false, ""},
		{"cut in a chunk", "5\r\nhel", -1, "hel", io.ErrUnexpectedEOF, false, ""},
		{"cut in a size line", "5\r\nhello\r\n3", -1, "hello", io.ErrUnexpectedEOF, false, ""},
		{"size line in bare LF", "5\nhello\r\n0\r\n\r\n", -1, "", errChunkLine, false, ""},
		{"no size", ";x\r\nhello\r\n0\r\n\r\n", -1, "", errChunkLine, false, ""},
		{"junk after the size", "5 5\r\nhello\r\n0\r\n\r\n", -1, "", errChunkLine, false, ""},
		{"size over 2^63", "8000000000000000\r\nx", -1, "", errChunkLine, false, ""},
		{"leading zeros", "00000000000000000005\r\nhello\r\n0\r\n\r\n", -1, "hello", io.EOF, false, ""},
		{"data past its size", "3\r\nhello\r\n", -1, "hel", errChunkEnd, false, ""},
	} {
		for _, step := range []int{1, 3, 64} {
			data, err, conn := bodyOf(c.wire, c.cl, step, 24) // a small buffer: lines and chunks span fills
			rest, _ := io.ReadAll(conn.br)
			if data != c.data || !errors.Is(err, c.err) || conn.noReuse != c.noReuse || (c.err == io.EOF && string(rest) != c.leftover) {
				t.Errorf("%s, reads of %d: %q %v noReuse %v, left %q; want %q %v noReuse %v, left %q",
					c.name, step, data, err, conn.noReuse, rest, c.data, c.err, c.noReuse, c.leftover)
			}
			if c.err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, errInvalidResponse) {
				t.Errorf("%s: %v is not an invalid response", c.name, err)
			}
		}
	}
}

// A chunked Read returns the chunks already read from the socket, all of them, and never
// waits on the socket once it has data.
func TestUpBodyChunkedReadsWhatArrived(t *testing.T) {
	first := "5\r\nhello\r\n6\r\n world\r\n"
	r := io.MultiReader(strings.NewReader(first), iotest.ErrReader(errors.New("read past what arrived")))
	c := &uconn{br: bufio.NewReader(r)}
	_, _ = c.br.Peek(len(first)) // both chunks are in the buffer
	c.body.reset(c, -1)
	p := make([]byte, 64)
	n, err := c.body.Read(p)
	if string(p[:n]) != "hello world" || err != nil {
		t.Errorf("Read: %q %v, want both buffered chunks and no error", p[:n], err)
	}
	if _, err := c.body.Read(p); err == nil || err.Error() != "read past what arrived" {
		t.Errorf("the next Read: %v, want the socket's error", err)
	}
}

// Kilobytes of extensions per data byte are refused; one-byte chunks are not.
func TestUpBodyChunkOverhead(t *testing.T) {
	var small, junk strings.Builder
	for range 20000 {
		small.WriteString("1\r\nx\r\n")
	}
	small.WriteString("0\r\n\r\n")
	if data, err, _ := bodyOf(small.String(), -1, 4096, connBufferSize); err != io.EOF || len(data) != 20000 {
		t.Errorf("20000 one-byte chunks: %d bytes, %v; want all, EOF", len(data), err)
	}
	ext := strings.Repeat("e", 900)
	for range 40 {
		junk.WriteString("1;" + ext + "\r\nx\r\n")
	}
	if _, err, _ := bodyOf(junk.String(), -1, 4096, connBufferSize); !errors.Is(err, errChunkOverhead) {
		t.Errorf("36 KB of extensions for 40 bytes: %v, want refused", err)
	}
}

func TestStatusInRange(t *testing.T) {
	for line, want := range map[string]bool{
		"HTTP/1.1 200 OK": true, "HTTP/1.1 100": true, "HTTP/1.1 599 x": true, "HTTP/1.0  404 Not Found": true,
		"HTTP/1.1 000 OK": false, "HTTP/1.1 099": false, "HTTP/1.1 600 x": false, "HTTP/1.1 999": false,
		"HTTP/1.1 20 OK": true, "HTTP/1.1 2000": true, "garbage": true, // fasthttp refuses these itself
	} {
		if got := statusInRange([]byte(line)); got != want {
			t.Errorf("%q: %v, want %v", line, got, want)
		}
	}
}

// FuzzUpBodyChunked decodes arbitrary bytes as a chunked body: never a panic, never more data
// than the input, and wherever Go's net/http decoder takes the bytes as a whole body, the same
// data (the trailer section, which Go's decoder leaves to its caller, may then still be cut).
func FuzzUpBodyChunked(f *testing.F) {
	for _, seed := range []string{
		"5\r\nhello\r\n0\r\n\r\n",
		"5 ; a=b\r\nhello\r\n6\r\n world\r\n0\r\nX: y\r\n\r\n",
		"1;e\r\nx\r\n0\r\nA: b\n\n",
		"3\r\nhello\r\n",
		"ffffffffffffffff\r\n",
		"5\nhello\r\n0\r\n\r\n",
	} {
		f.Add([]byte(seed), uint8(7))
	}
	f.Fuzz(func(t *testing.T, wire []byte, step uint8) {
		data, err, _ := bodyOf(string(wire), -1, int(step)+1, connBufferSize)
		if len(data) > len(wire) {
			t.Fatalf("%d bytes of data from %d of input", len(data), len(wire))
		}
		if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, errInvalidResponse) {
			t.Fatalf("error %v is none of the body's", err)
		}
		ref, rerr := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(bytes.NewReader(wire))))
		if rerr == nil && (string(ref) != data || (err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF))) {
			t.Fatalf("Go's decoder reads %q; prefixlb's %q, %v", ref, data, err)
		}
	})
}
