package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Request bodies. The fasthttp server streams request bodies (StreamRequestBody): before
// handle runs it has read the header and at most the first bodyPrefetch bytes of the body,
// within timeouts.client_body_idle (headerReceived). A body that short is in memory already:
// handle copies it into a pooled buffer without asking the budget. A longer one is read
// into a buffer that grows as its bytes arrive (nextLen), every growth reserved from the
// budget that all requests share (limits.max_buffered_body_bytes, bodyBudget) before it is
// allocated, each read bounded by timeouts.client_body_idle: a growth that does not fit is
// refused with 503, a body over max_request_body_bytes with 413 (a declared length over it
// before any body byte is read: headerReceived). So a client holds at most four times what
// it sent within the pooled classes (1 MiB) and 2.5 times past them, never what it merely
// declared. The reservation and the buffer are given back when handle returns
// (endRequest), whatever the outcome: by then the request has been written to the backend
// and can no longer be retried.
const (
	// bodyPrefetch is what fasthttp reads of a body before the handler runs:
	// min(Content-Length, 8 KiB) (readBodyWithStreaming). A body no longer than this is
	// already in memory, and reading it needs no deadline.
	bodyPrefetch = 8 << 10
	// bodyFirst is the first buffer of a body longer than bodyPrefetch (or chunked).
	bodyFirst = 16 << 10
)

// msgBodyStalled is the message of a 408 for a body that stopped coming.
const msgBodyStalled = "request body not received in time (timeouts.client_body_idle between reads, timeouts.client_read in all)"

// msgBodyIncomplete is the message of a 400 for a body whose connection ended (the client
// closed or half-closed it) before the body's end.
const msgBodyIncomplete = "request body incomplete: the connection ended before the end of the body (its Content-Length, or the last chunk)"

// bodyRefusal is why readBody answered a request itself.
type bodyRefusal int

const (
	bodyOK bodyRefusal = iota
	bodyTooLarge
	bodyNoBudget
	bodyStalled
	bodyMalformed
	bodyIncomplete // the stream ended (EOF) before the body's framing did
	bodyClientGone // the connection was reset or closed under the read
)

// readBody reads the request body into a buffer held by bl and makes it the request's
// body; start is when the handler began (client_read bounds the body from there). A body of
// at most bodyPrefetch bytes, prefetched whole, is copied without a reservation; a longer
// one grows as it arrives (readGrowing). It returns bodyOK, or why it could not; the caller
// answers (refuseBody) and releases bl in every case.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, bl *bodyLease, start time.Time) bodyRefusal {
	req := &ctx.Request
	st := req.BodyStream()
	if st == nil {
		return bodyOK // not streamed: any body is whole already
	}
	limit := s.maxBody
	cl := req.Header.ContentLength()
	switch {
	case cl > limit:
		return bodyTooLarge
	case cl == 0:
		if req.Header.Peek(overLimitField) != nil {
			return bodyTooLarge // headerReceived cut the declared length
		}
		req.SetBodyRaw(nil) // drops the (empty) stream: Body never reads a stream
		return bodyOK
	case cl > 0 && cl <= bodyPrefetch:
		bl.buf = s.bodies.get(cl)
		if _, err := io.ReadFull(st, bl.buf); err != nil {
			return classifyBodyErr(err)
		}
		req.SetBodyRaw(bl.buf)
		return bodyOK
	}
	n, why := s.readGrowing(ctx, bl, st, cl, limit, start)
	if why != bodyOK {
		return why
	}
	req.SetBodyRaw(bl.buf[:n])
	return bodyOK
}

// readGrowing reads a body of cl bytes (over bodyPrefetch), or a chunked one (cl < 0) of at
// most limit, into bl's buffer, growing it (nextLen) each time it is full and more is to
// come, each growth reserved first. It returns the body's length, or why it could not be
// read.
func (s *Server) readGrowing(ctx *fasthttp.RequestCtx, bl *bodyLease, st io.Reader, cl, limit int, start time.Time) (int, bodyRefusal) {
	chunked := cl < 0
	total := cl
	if chunked {
		total = limit
	}
	if !s.bodies.grow(bl, 0, min(bodyFirst, total)) {
		return 0, bodyNoBudget
	}
	br := bodyReader{ctx: ctx, st: st, idle: s.bodyIdle, until: s.bodyDeadline(start)}
	n := 0
	for {
		if n == len(bl.buf) {
			switch {
			case n == total && !chunked:
				return n, bodyOK
			case n == total:
				// A chunked body of exactly limit bytes ends here; one more byte makes it too
				// large, and is read into no buffer of the budget's.
				var one [1]byte
				m, err := br.read(one[:])
				switch {
				case m > 0:
					return n, bodyTooLarge
				case err == io.EOF:
					return n, bodyOK
				case err != nil:
					return n, classifyBodyErr(err)
				}
				continue
			case cap(bl.buf) > n:
				bl.buf = bl.buf[:min(cap(bl.buf), total)]
			case !s.bodies.grow(bl, n, nextLen(n, total)):
				return n, bodyNoBudget
			}
		}
		m, err := br.read(bl.buf[n:])
		n += m
		switch {
		case err == io.EOF && !chunked && n < cl:
			return n, bodyIncomplete // the client closed (or half-closed) its side early
		case err == io.EOF:
			return n, bodyOK
		case err != nil:
			return n, classifyBodyErr(err)
		}
	}
}

// overLimitField marks a request whose declared Content-Length headerReceived found over
// max_request_body_bytes (and cut to 0). A client cannot send it: '(' is not a token byte,
// and fasthttp refuses such a field name on the wire.
const overLimitField = "prefixlb(body-over-limit)"

// headerReceived runs when fasthttp has read a request's header, before it reads any of the
// body (fasthttp's pre-read: min(Content-Length, bodyPrefetch) bytes, after 100 Continue
// when the client expects one). It bounds that pre-read by client_body_idle (client_read
// when shorter), as handle bounds the reads after it. A declared length over
// max_request_body_bytes is refused before any body byte is read: the length is cut to 0
// so that fasthttp pre-reads nothing, the Expect field dropped so that it sends no 100
// Continue inviting the upload, the connection marked to close (the body bytes that follow
// are never read as a request), and the request marked (overLimitField) for readBody to
// answer 413 at once.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	cl := h.ContentLength()
	switch {
	case cl <= 0:
		return fasthttp.RequestConfig{} // empty, or chunked: fasthttp pre-reads nothing
	case cl > s.maxBody:
		h.SetContentLength(0)
		h.Del(fasthttp.HeaderExpect)
		h.SetConnectionClose()
		h.Set(overLimitField, "1")
		return fasthttp.RequestConfig{}
	}
	return fasthttp.RequestConfig{ReadTimeout: s.preReadTimeout()}
}

// preReadTimeout bounds fasthttp's pre-read of a body: client_body_idle, or client_read
// when that is shorter; 0 (fasthttp keeps client_read's deadline) when neither is set.
func (s *Server) preReadTimeout() time.Duration {
	d := s.bodyIdle
	if d <= 0 || (s.clientRead > 0 && s.clientRead < d) {
		d = s.clientRead
	}
	return max(d, 0)
}

// bodyDeadline is the latest a body read may end: client_read after start (none when
// client_read is 0).
func (s *Server) bodyDeadline(start time.Time) time.Time {
	if s.clientRead <= 0 {
		return time.Time{}
	}
	return start.Add(s.clientRead)
}

// classifyBodyErr sorts a failed body read: deadline (stalled client), the stream ended
// early (EOF: the client closed or half-closed its side, and may still read the answer),
// the client gone (reset, closed), or broken chunked framing.
func classifyBodyErr(err error) bodyRefusal {
	switch {
	case isTimeout(err):
		return bodyStalled
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return bodyIncomplete
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return bodyClientGone
	}
	return bodyMalformed
}

// bodyReader reads a body stream with an idle deadline: each read may wait at most idle,
// and none past until (timeouts.client_read from the start of the handler). The deadline
// moves only when it has aged by a sixteenth of idle, so a fast body does not reset a
// timer per read.
type bodyReader struct {
	ctx   *fasthttp.RequestCtx
	st    io.Reader
	idle  time.Duration
	until time.Time
	set   time.Time
}

func (r *bodyReader) read(p []byte) (int, error) {
	if r.idle > 0 {
		if now := time.Now(); r.set.IsZero() || now.Sub(r.set) > r.idle/16 {
			d := now.Add(r.idle)
			if !r.until.IsZero() && r.until.Before(d) {
				d = r.until
			}
			_ = r.ctx.SetReadDeadline(d)
			r.set = now
		}
	}
	return r.st.Read(p)
}

// refuseBody answers a request whose body readBody did not take: 413, 503 (with
// Retry-After), 408, 400 (malformed, or incomplete: prefixlb_request_body_incomplete_total),
// or, for a client that reset the connection, nothing it could read (logged as 499 and
// counted in prefixlb_client_disconnects_total). Each is one log line naming the class. The
// connection closes after the answer, lingering so that a client still sending its body
// sees the refusal.
func (s *Server) refuseBody(ctx *fasthttp.RequestCtx, why bodyRefusal) {
	var status int
	var class, msg string
	switch why {
	case bodyTooLarge:
		s.m.rejected413.Inc()
		status, class = fasthttp.StatusRequestEntityTooLarge, "body_too_large"
		msg = fmt.Sprintf("request body exceeds max_request_body_bytes (%d bytes)", s.maxBody)
	case bodyNoBudget:
		s.bodies.rejected.Inc()
		status, class = fasthttp.StatusServiceUnavailable, "body_budget_exhausted"
		msg = fmt.Sprintf("prefixlb is buffering as many request bodies as limits.max_buffered_body_bytes allows (%d bytes); retry shortly", s.bodies.limit)
	case bodyStalled:
		status, class = fasthttp.StatusRequestTimeout, "body_stalled"
		msg = msgBodyStalled
	case bodyMalformed:
		status, class = fasthttp.StatusBadRequest, "body_malformed"
		msg = "malformed chunked request body"
	case bodyIncomplete:
		s.m.bodyIncomplete.Inc()
		status, class, msg = fasthttp.StatusBadRequest, "body_incomplete", msgBodyIncomplete
	case bodyClientGone:
		// Nothing written can reach the client: the status is the log line's.
		s.m.clientGone.Inc()
		s.logRejected(ctx, StatusClientClosedRequest, "body_client_gone")
		ctx.SetConnectionClose()
		ctx.SetStatusCode(StatusClientClosedRequest)
		return
	}
	s.reject(ctx, status, class, msg)
	if status == fasthttp.StatusServiceUnavailable {
		ctx.Response.Header.Set("Retry-After", "1")
	}
	closeAfterRefusal(ctx)
}
