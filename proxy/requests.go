package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// What prefixlb refuses before routing, and how it answers: every refusal is a status, an
// OpenAI-shaped error whose message is fixed for its class, and one log line naming the
// class. Neither ever carries a header value or body bytes (fasthttp's own error texts
// quote them, so they are classified, never passed on).

// allowedMethods is the Allow field of a 405: prefixlb forwards requests, it does not tunnel
// (CONNECT) or loop them back (TRACE).
const allowedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

var (
	methodConnect = []byte(fasthttp.MethodConnect)
	methodTrace   = []byte(fasthttp.MethodTrace)
	proto10       = []byte("HTTP/1.0")
	proto11       = []byte("HTTP/1.1")
)

// admit runs before a request is routed: it refuses CONNECT and TRACE (405), HTTP versions
// other than 1.0 and 1.1 on this HTTP/1 connection (505: "HTTP/2.0" or "HTTP/9.9" in a
// request line is not HTTP/2, and would reach the backend as sent), and reads the body
// within the budget (readBody). It reports whether the request may go on; when not, it has
// answered it.
func (s *Server) admit(ctx *fasthttp.RequestCtx, bl *bodyLease) bool {
	if cc, ok := ctx.Conn().(*clientConn); ok {
		cc.beginRequest()
	}
	h := &ctx.Request.Header
	if m := h.Method(); bytes.EqualFold(m, methodConnect) || bytes.EqualFold(m, methodTrace) {
		name := fasthttp.MethodTrace
		if bytes.EqualFold(m, methodConnect) {
			name = fasthttp.MethodConnect
		}
		s.reject(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed",
			"method "+name+" is not supported: prefixlb forwards requests, it does not tunnel or trace them")
		ctx.Response.Header.Set("Allow", allowedMethods)
		return false
	}
	if p := h.Protocol(); !bytes.Equal(p, proto11) && !bytes.Equal(p, proto10) {
		s.reject(ctx, fasthttp.StatusHTTPVersionNotSupported, "http_version",
			"HTTP version not supported: prefixlb serves HTTP/1.1 and HTTP/1.0 on this port")
		closeAfterRefusal(ctx)
		return false
	}
	if why := s.readBody(ctx, bl, ctx.Time()); why != bodyOK {
		s.refuseBody(ctx, why)
		return false
	}
	return true
}

// endRequest runs when handle returns, on every path: it gives back the body's budget and
// buffer (the request is written by then; the relay needs neither) and tells the client
// connection that the next bytes start a new request header. It is the one place a body
// reservation is released.
func (s *Server) endRequest(ctx *fasthttp.RequestCtx, bl *bodyLease) {
	if bl.buf != nil {
		ctx.Request.ResetBody() // the body points into bl.buf, which goes back to the pool
	}
	s.bodies.release(bl)
	if cc, ok := ctx.Conn().(*clientConn); ok {
		cc.endRequest()
	}
}

// reject answers a request prefixlb refuses itself with status and an OpenAI-shaped error
// (msg is fixed per class, never request bytes), and logs one line with the class
// (logRejected).
func (s *Server) reject(ctx *fasthttp.RequestCtx, status int, class, msg string) {
	s.logRejected(ctx, status, class)
	writeError(ctx, status, msg)
}

// logRejected is the one log line of a refused request: its status, class and remote
// address; at info for the client's errors, at warn when prefixlb's own limit refused it
// (503).
func (s *Server) logRejected(ctx *fasthttp.RequestCtx, status int, class string) {
	lvl := zap.InfoLevel
	if status == fasthttp.StatusServiceUnavailable {
		lvl = zap.WarnLevel
	}
	if ce := s.log.Check(lvl, "rejected request"); ce != nil {
		ce.Write(zap.Int("status", status), zap.String("class", class), zap.String("remote", ctx.RemoteAddr().String()))
	}
}

// parseErrorClass is one kind of request fasthttp could not read, recognised by a fragment
// of fasthttp's error text (which quotes the offending bytes, so it is matched, never shown).
type parseErrorClass struct {
	fragment string // in err.Error(); "" matches by the error's identity (see classifyParseError)
	status   int
	class    string
	msg      string
}

var parseErrorClasses = []parseErrorClass{
	{"invalid header value", fasthttp.StatusBadRequest, "header_value", "malformed HTTP request: a header field value holds a forbidden byte (CR, LF or NUL)"},
	{"invalid header key", fasthttp.StatusBadRequest, "header_name", "malformed HTTP request: a header field name is invalid"},
	{"malformed mime header", fasthttp.StatusBadRequest, "header_line", "malformed HTTP request: a header line is invalid"},
	{"headers cannot start with space", fasthttp.StatusBadRequest, "header_line", "malformed HTTP request: a header line is invalid"},
	{"unsupported http version", fasthttp.StatusHTTPVersionNotSupported, "http_version", "HTTP version not supported: prefixlb serves HTTP/1.1 and HTTP/1.0 on this port"},
	{"transfer-encoding", fasthttp.StatusBadRequest, "transfer_encoding", "malformed HTTP request: unsupported or repeated Transfer-Encoding (only chunked, once)"},
	{"content-length", fasthttp.StatusBadRequest, "content_length", "malformed HTTP request: invalid or repeated Content-Length"},
	{"host header", fasthttp.StatusBadRequest, "host", "malformed HTTP request: missing or repeated Host"},
	{"request uri", fasthttp.StatusBadRequest, "request_target", "malformed HTTP request: invalid request target"},
	{"requesturi", fasthttp.StatusBadRequest, "request_target", "malformed HTTP request: invalid request target"},
	{"request method", fasthttp.StatusBadRequest, "method", "malformed HTTP request: invalid method"},
	{"first line", fasthttp.StatusBadRequest, "request_line", "malformed HTTP request: invalid request line"},
	{"request line", fasthttp.StatusBadRequest, "request_line", "malformed HTTP request: invalid request line"},
	{"trailer", fasthttp.StatusBadRequest, "trailer", "malformed HTTP request: invalid or forbidden trailer field"},
	{"chunk", fasthttp.StatusBadRequest, "body_malformed", "malformed chunked request body"},
}

// classifyParseError returns the status, class and fixed message for an error fasthttp
// met reading a request.
func (s *Server) classifyParseError(err error) (status int, class, msg string) {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return fasthttp.StatusRequestEntityTooLarge, "body_too_large",
			fmt.Sprintf("request body exceeds max_request_body_bytes (%d bytes)", s.maxBody)
	case errors.As(err, &small), errors.Is(err, fasthttp.ErrSmallReadBuffer):
		return fasthttp.StatusRequestHeaderFieldsTooLarge, "header_too_large", "request headers too large"
	case errors.Is(err, errBareLF):
		return fasthttp.StatusBadRequest, "bare_lf", "malformed HTTP request: header lines must end in CRLF (RFC 9112 §2.2)"
	case errors.Is(err, errH2Preface):
		return fasthttp.StatusHTTPVersionNotSupported, "http_version", "HTTP version not supported: prefixlb serves HTTP/1.1 and HTTP/1.0 on this port (not HTTP/2 with prior knowledge)"
	case isTimeout(err):
		return fasthttp.StatusRequestTimeout, "read_timeout", "request not received within timeouts.client_read"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fasthttp.StatusBadRequest, "request_incomplete", "request incomplete: the connection ended inside the request headers"
	}
	text := strings.ToLower(err.Error())
	for _, c := range parseErrorClasses {
		if strings.Contains(text, c.fragment) {
			return c.status, c.class, c.msg
		}
	}
	return fasthttp.StatusBadRequest, "malformed", "malformed HTTP request"
}

// handleParseError answers requests fasthttp could not read: 413 for bodies over
// max_request_body_bytes, 431 for oversized headers, 408 for requests not read within
// client_read (or whose first body bytes did not come within client_body_idle), 505 for
// unknown versions, 400 otherwise, each with a fixed message per class. Each is logged
// once, by class. A body that ended or was reset during fasthttp's pre-read is answered
// as one that did so in readBody (refuseBody).
func (s *Server) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	status, class, msg := s.classifyParseError(err)
	if cc, ok := ctx.Conn().(*clientConn); ok && cc.headerRead() {
		// The header was whole: fasthttp's pre-read of the body failed.
		switch why := classifyBodyErr(err); {
		case class == "read_timeout": // client_body_idle (headerReceived)
			class, msg = "body_stalled", msgBodyStalled
		case why == bodyIncomplete, why == bodyClientGone:
			s.refuseBody(ctx, why)
			return
		}
	}
	if status == fasthttp.StatusRequestEntityTooLarge {
		s.m.rejected413.Inc()
	}
	s.reject(ctx, status, class, msg)
	closeAfterRefusal(ctx)
}

// closeAfterRefusal closes the connection after the answer, lingering (clientConn.Close)
// so that a client still sending what was refused reads the answer instead of a reset.
func closeAfterRefusal(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if cc, ok := ctx.Conn().(*clientConn); ok {
		cc.lingerOnClose()
	}
}

// fasthttpLogger routes fasthttp's own messages to zap at debug: they are mostly the expected
// "use of closed network connection" of aborted streams. Their arguments are redacted
// (redactLogArg): an error fasthttp reports may quote request bytes.
type fasthttpLogger struct {
	l *zap.Logger
	s *Server
}

func (l fasthttpLogger) Printf(format string, args ...any) {
	ce := l.l.Check(zap.DebugLevel, "fasthttp")
	if ce == nil {
		return
	}
	safe := make([]any, len(args))
	for i, a := range args {
		safe[i] = l.redactLogArg(a)
	}
	ce.Write(zap.String("msg", fmt.Sprintf(format, safe...)))
}

// errorClass names an error fasthttp logs: a network condition, or the class of a request
// it could not read.
func (l fasthttpLogger) errorClass(err error) string {
	switch {
	case errors.Is(err, net.ErrClosed):
		return "closed"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.EPIPE):
		return "broken_pipe"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case l.s == nil:
		return "unknown"
	}
	_, class, _ := l.s.classifyParseError(err)
	return class
}

// redactLogArg keeps addresses and numbers, turns an error into its class and anything
// else into a placeholder.
func (l fasthttpLogger) redactLogArg(a any) any {
	switch v := a.(type) {
	case error:
		return "error class " + l.errorClass(v)
	case net.Addr:
		return v.String()
	case int, int64, uint64, uint32, int32, float64, time.Duration:
		return v
	}
	return "[redacted]"
}
