package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// hopHeaders are the hop-by-hop headers of RFC 7230 §6.1 that a proxy must not forward
// (the list net/http/httputil strips).
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// stripHopRequest removes hop-by-hop headers, including those named in Connection.
// Deleting Connection also clears fasthttp's connection-close flag, so a client's
// "Connection: close" does not close the pooled upstream connection.
func stripHopRequest(h *fasthttp.RequestHeader) {
	if c := h.Peek("Connection"); len(c) > 0 {
		forEachToken(c, func(tok []byte) { h.DelBytes(tok) })
	}
	for _, n := range hopHeaders {
		h.Del(n)
	}
}

// stripHopResponse is stripHopRequest for responses.
func stripHopResponse(h *fasthttp.ResponseHeader) {
	if c := h.Peek("Connection"); len(c) > 0 {
		forEachToken(c, func(tok []byte) { h.DelBytes(tok) })
	}
	for _, n := range hopHeaders {
		h.Del(n)
	}
}

func forEachToken(list []byte, f func([]byte)) {
	for len(list) > 0 {
		i := bytes.IndexByte(list, ',')
		var tok []byte
		if i < 0 {
			tok, list = list, nil
		} else {
			tok, list = list[:i], list[i+1:]
		}
		tok = bytes.TrimSpace(tok)
		if len(tok) > 0 && !bytes.EqualFold(tok, []byte("close")) && !bytes.EqualFold(tok, []byte("keep-alive")) {
			f(tok)
		}
	}
}
