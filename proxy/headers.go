package proxy

import (
	"bytes"
	"net"
	"net/netip"

	"github.com/valyala/fasthttp"
)

// hopHeaders are the hop-by-hop fields of RFC 9110 §7.6.1 (Connection, Proxy-Connection,
// Keep-Alive, TE, Transfer-Encoding, Upgrade) with the ones net/http/httputil also drops
// (Proxy-Authenticate, Proxy-Authorization, Trailer), in their canonical spelling. Field
// names are case-insensitive, and the server keeps them as the client spelled them
// (DisableHeaderNamesNormalizing), so every comparison below folds case.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// specialHeaders are the fields fasthttp keeps outside its list of headers (or under a
// canonical name whatever the spelling on the wire): deleting one takes its canonical name.
var specialHeaders = []string{
	"Connection", "Transfer-Encoding", "Trailer", "Host", "Content-Type", "Content-Length",
	"User-Agent", "Cookie", "Content-Encoding", "Server", "Set-Cookie",
}

// Request fields the proxy rewrites.
const (
	headerXFF       = "X-Forwarded-For"
	headerForwarded = "Forwarded"
	// headerExpect is dropped from forwarded requests: fasthttp has answered 100-continue
	// and read the body before the handler runs, so the backend gets the body at once.
	headerExpect = "Expect"
)

func isHop(name []byte) bool { return foldIn(name, hopHeaders) != "" }

func isConnection(name []byte) bool {
	return len(name) == len("Connection") && bytes.EqualFold(name, []byte("Connection"))
}

// foldIn returns the member of list that name equals ignoring case, or "".
func foldIn(name []byte, list []string) string {
	for _, c := range list {
		if len(c) == len(name) && bytes.EqualFold(name, []byte(c)) {
			return c
		}
	}
	return ""
}

// namedInConnection reports whether name is one of the tokens of the Connection values.
func namedInConnection(name []byte, conn [][]byte) bool {
	for _, v := range conn {
		for len(v) > 0 {
			var tok []byte
			tok, v = nextToken(v)
			if bytes.EqualFold(tok, name) {
				return true
			}
		}
	}
	return false
}

// nextToken splits the first comma-separated token off list, trimmed, skipping close and
// keep-alive (connection options, not field names): tok is empty when list held none.
func nextToken(list []byte) (tok, rest []byte) {
	for len(list) > 0 {
		i := bytes.IndexByte(list, ',')
		if i < 0 {
			tok, list = list, nil
		} else {
			tok, list = list[:i], list[i+1:]
		}
		tok = bytes.TrimSpace(tok)
		if len(tok) > 0 && !bytes.EqualFold(tok, []byte("close")) && !bytes.EqualFold(tok, []byte("keep-alive")) {
			return tok, list
		}
	}
	return nil, nil
}

// nextRawField splits the first field line off a raw header block (lines ending in CRLF or
// LF, as fasthttp accepted them): name and value trimmed, cont true for an obs-fold line
// (leading SP or HT) that continues the field before it. ok is false at the end.
func nextRawField(raw []byte) (name, value, rest []byte, cont, ok bool) {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			return nil, bytes.TrimSpace(line), raw, true, true
		}
		k, v, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		return bytes.TrimSpace(k), bytes.TrimSpace(v), raw, false, true
	}
	return nil, nil, nil, false, false
}

// Kinds of request field prepareRequestHeader looks at.
const (
	fieldOther = iota
	fieldXFF
	fieldForwarded
	fieldConnection
)

// prepareRequestHeader readies a client request's header for the backend, in one pass over
// the fields as received (h.RawHeaders):
//   - it removes the hop-by-hop fields in any spelling, the fields the Connection fields name
//     (RFC 9110 §7.6.1), and Expect;
//   - it joins every X-Forwarded-For field (any spelling) into one and appends peer, so that
//     the last address is always the one prefixlb saw, whatever the client sent;
//   - when the client sent Forwarded, it joins those fields the same way and appends
//     for=peer (RFC 7239; an IPv6 address quoted in brackets).
//
// fasthttp's connection-close flag is cleared, so that a client's "Connection: close" (or
// an HTTP/1.0 request) does not close the pooled upstream connection. An invalid peer (not a
// TCP client) appends nothing. The names and values found point into the raw block, which
// deleting fields does not touch.
func prepareRequestHeader(h *fasthttp.RequestHeader, peer netip.Addr) {
	// fasthttp writes "Content-Type: application/octet-stream" for a body that came without
	// one: FastAPI (vLLM's server) parses an untyped body as JSON but refuses octet-stream
	// with 422, so a request that works directly would fail through prefixlb.
	h.SetNoDefaultContentType(true)
	// A chunked request's trailers were read with its body, which goes upstream re-framed
	// with a Content-Length: announce none (the trailer fields themselves, if any, go as
	// header fields, as RFC 9110 §6.5.1 allows a recipient to merge them).
	_ = h.SetTrailer("")
	// On the stack for the usual handful of fields; longer lists grow on the heap. This
	// allocates nothing (TestHeaderRewritesDoNotAllocate).
	var delArr [12][]byte
	var connArr, xffArr, fwdArr [4][]byte
	del, conn, xff, fwd := delArr[:0], connArr[:0], xffArr[:0], fwdArr[:0]
	sawFwd := false
	raw := h.RawHeaders()
	kind := fieldOther
	for {
		k, v, rest, cont, ok := nextRawField(raw)
		if !ok {
			break
		}
		raw = rest
		if cont { // the value goes on: it counts as one more value of the same field
			switch kind {
			case fieldXFF:
				xff = append(xff, v)
			case fieldForwarded:
				fwd = append(fwd, v)
			case fieldConnection:
				conn = append(conn, v)
			}
			continue
		}
		kind = fieldOther
		switch {
		case len(k) == len(headerXFF) && bytes.EqualFold(k, []byte(headerXFF)):
			kind = fieldXFF
			xff = append(xff, v)
			del = append(del, k)
		case len(k) == len(headerForwarded) && bytes.EqualFold(k, []byte(headerForwarded)):
			kind = fieldForwarded
			fwd = append(fwd, v)
			sawFwd = true
			del = append(del, k)
		case len(k) == len(headerExpect) && bytes.EqualFold(k, []byte(headerExpect)):
			del = append(del, k)
		case isHop(k):
			if isConnection(k) {
				kind = fieldConnection
				conn = append(conn, v)
			}
			del = append(del, k)
		}
	}
	if len(conn) > 0 {
		// A client that lists X-Forwarded-For or Forwarded in Connection asks that its own
		// values not go further: they are dropped, prefixlb's entry stays.
		if namedInConnection([]byte(headerXFF), conn) {
			xff = xff[:0]
		}
		if namedInConnection([]byte(headerForwarded), conn) {
			fwd = fwd[:0]
		}
		for raw = h.RawHeaders(); ; {
			k, _, rest, cont, ok := nextRawField(raw)
			if !ok {
				break
			}
			raw = rest
			if !cont && namedInConnection(k, conn) {
				del = append(del, k)
			}
		}
	}
	for _, k := range del {
		delRequestField(h, k)
	}
	// An HTTP/1.0 request without keep-alive has the flag set with no field to delete.
	h.ResetConnectionClose()
	if !peer.IsValid() {
		return
	}
	var buf [256]byte
	b := joinValues(buf[:0], xff)
	if len(b) > 0 {
		b = append(b, ", "...)
	}
	b = peer.AppendTo(b)
	h.SetBytesV(headerXFF, b)
	if sawFwd {
		b = joinValues(buf[:0], fwd)
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = appendForwardedFor(b, peer)
		h.SetBytesV(headerForwarded, b)
	}
}

// peerAddr is the client's IP address; invalid when the client is not on TCP.
func peerAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	ta, ok := ctx.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	return ta.AddrPort().Addr().Unmap()
}

// appendForwardedFor appends the Forwarded element for=ADDR for the client address (RFC
// 7239 §6: an IPv6 address in brackets, quoted).
func appendForwardedFor(dst []byte, peer netip.Addr) []byte {
	dst = append(dst, "for="...)
	if peer.Is4() {
		return peer.AppendTo(dst)
	}
	dst = append(dst, `"[`...)
	dst = peer.AppendTo(dst)
	return append(dst, `]"`...)
}

func joinValues(dst []byte, vals [][]byte) []byte {
	for _, v := range vals {
		v = bytes.Trim(v, ", \t")
		if len(v) == 0 {
			continue
		}
		if len(dst) > 0 {
			dst = append(dst, ", "...)
		}
		dst = append(dst, v...)
	}
	return dst
}

// delRequestField deletes every field named name (as spelled on the wire) and, for the
// fields fasthttp keeps apart, the canonical one.
func delRequestField(h *fasthttp.RequestHeader, name []byte) {
	h.DelBytes(name)
	if c := foldIn(name, specialHeaders); c != "" && c != string(name) {
		h.Del(c)
	}
}

// stripHopResponse removes the hop-by-hop fields of a backend's response, in any spelling,
// and the fields its Connection fields name, before it is relayed to the client. It
// allocates nothing for the usual few fields (TestHeaderRewritesDoNotAllocate).
func stripHopResponse(h *fasthttp.ResponseHeader) {
	// The Connection values, copied once: deleting fields moves the bytes VisitAll points
	// into. On the stack for the usual short list; a longer one grows on the heap.
	var connArr [128]byte
	conn := connArr[:0]
	fields := 0
	h.VisitAll(func(k, v []byte) {
		fields++
		if isConnection(k) {
			if len(conn) > 0 {
				conn = append(conn, ',')
			}
			conn = append(conn, v...)
		}
	})
	conns := [][]byte{conn}
	// One field name found and deleted per pass, whatever the number or length of the names
	// (a backend may name any number of fields in Connection). Each pass deletes a field, so
	// fields+1 passes always suffice; the bound only guards against a field fasthttp lists
	// but cannot delete.
	var nameArr [64]byte
	for pass := 0; pass <= fields; pass++ {
		name, found := nameArr[:0], false
		h.VisitAll(func(k, _ []byte) {
			if !found && (isHop(k) || namedInConnection(k, conns)) {
				name, found = append(name, k...), true
			}
		})
		if !found {
			return
		}
		h.DelBytes(name)
		if c := foldIn(name, specialHeaders); c != "" && c != string(name) {
			h.Del(c)
		}
	}
}
