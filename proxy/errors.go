package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// Errors the proxy itself reports. Each maps to one status in statusOf. The messages of the
// upstream failure classes are what a client's error body and the request log line say, and
// they are all those say (as Envoy's "upstream connect error"): never an address, never bytes
// the backend sent. The cause of a class is kept beside it (failure, dialError) and shows
// only in debug logs, sanitised by errDetail.
var (
	errNoBackend  = errors.New("no backend available")
	errClientGone = errors.New("client disconnected")
	// errClientWriteTimeout: the client left a chunk unread for timeouts.client_write.
	errClientWriteTimeout = errors.New("client stopped reading within timeouts.client_write")
	errConnect            = errors.New("upstream connect error")
	errHeaderTimeout      = errors.New("upstream response headers timeout (timeouts.response_header)")
	errIdleTimeout        = errors.New("upstream idle timeout (timeouts.idle)")
	errShuttingDown       = errors.New("prefixlb is shutting down")
	// errUpstreamClosed: the connection ended (EOF, reset) before a complete response head.
	errUpstreamClosed = errors.New("upstream closed the connection before responding")
	// errInvalidResponse: the backend's bytes are not an HTTP/1.1 response the proxy relays
	// (unparsable head, or a 101 that switched the connection to another protocol).
	errInvalidResponse = errors.New("upstream sent an invalid response")
	// errTruncated: the backend's body ended (EOF, reset, bad chunk) before its framing said.
	errTruncated      = errors.New("upstream response ended early")
	errBackendRemoved = errors.New("backend removed by a config reload or discovery")
	// errContended: a request held by settle is decided again (never reaches a client).
	errContended = errors.New("a peer decided on the backend first")
	// errUnexpected1xx is the cause of an errInvalidResponse for a 101 (fasthttp consumes the
	// other 1xx itself).
	errUnexpected1xx = errors.New("1xx response to a request that asked for no upgrade")
)

// failure is one way a request failed: class is one of the errors above and is all Error
// says; cause is what happened, for errors.Is/As and debug logs (errDetail).
type failure struct{ class, cause error }

func (e *failure) Error() string   { return e.class.Error() }
func (e *failure) Unwrap() []error { return []error{e.class, e.cause} }

// classify turns an error reading a response head into its class: a connection that ended
// is errUpstreamClosed, anything else (a parse error) errInvalidResponse.
func classify(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return &failure{errUpstreamClosed, err}
	}
	return &failure{errInvalidResponse, err}
}

// maxDetail bounds errDetail's text, bytes.
const maxDetail = 120

// errDetail describes err's cause for a debug log without what the error text may carry:
// fasthttp's parse errors quote up to 1.6 KB of the backend's bytes (`contents: "…"`), a
// completion another user is owed among them. An errno is named ("connection refused"); any
// other text is cut before its first quote or "contents:", and at maxDetail bytes.
func errDetail(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return ""
	case errors.As(err, &errno):
		return errno.Error()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "deadline exceeded"
	}
	var ue *failure
	if errors.As(err, &ue) {
		err = ue.cause
	}
	var de *dialError
	if errors.As(err, &de) {
		err = de.err
	}
	var le *localError
	if errors.As(err, &le) {
		err = le.err
	}
	d := err.Error()
	if i := strings.IndexAny(d, "\"'`"); i >= 0 {
		d = d[:i]
	}
	if i := strings.Index(d, "contents:"); i >= 0 {
		d = d[:i]
	}
	if len(d) > maxDetail {
		n := maxDetail
		for n > 0 && !utf8.RuneStart(d[n]) {
			n--
		}
		d = d[:n]
	}
	return strings.TrimRight(d, " :,")
}

// StatusClientClosedRequest is nginx's 499: the client left before the response was complete.
const StatusClientClosedRequest = 499

// statusOf maps a forwarding error to the status reported to the client (and logged): one
// place, as Caddy's statusError does. Dial errors and closed connections → 502, timeouts → 504,
// client gone → 499, nothing to route to (or only backends a reload removed) or prefixlb out of a
// local resource → 503.
func statusOf(err error) int {
	var ne net.Error
	var fr *flowRefusal
	switch {
	case errors.As(err, &fr):
		return fr.status
	case errors.Is(err, errClientGone), errors.Is(err, errClientWriteTimeout):
		return StatusClientClosedRequest
	case errors.Is(err, errNoBackend), errors.Is(err, errShuttingDown), errors.Is(err, errBackendRemoved),
		errors.Is(err, errLocalResource):
		return fasthttp.StatusServiceUnavailable
	case errors.Is(err, errHeaderTimeout), errors.Is(err, errIdleTimeout), errors.Is(err, os.ErrDeadlineExceeded):
		return fasthttp.StatusGatewayTimeout
	case errors.As(err, &ne) && ne.Timeout():
		return fasthttp.StatusGatewayTimeout
	default:
		return fasthttp.StatusBadGateway
	}
}

// errorType is the OpenAI error "type" for a status.
func errorType(status int) string {
	switch {
	case status == fasthttp.StatusRequestEntityTooLarge, status == fasthttp.StatusBadRequest,
		status == fasthttp.StatusRequestHeaderFieldsTooLarge, status == fasthttp.StatusMethodNotAllowed,
		status == fasthttp.StatusRequestTimeout, status == fasthttp.StatusHTTPVersionNotSupported:
		return "invalid_request_error"
	case status == fasthttp.StatusInternalServerError:
		return "server_error" // prefixlb's own failure (recover.go), as OpenAI types its 500s
	case status == fasthttp.StatusServiceUnavailable:
		return "service_unavailable"
	case status == fasthttp.StatusTooManyRequests:
		return "rate_limit_error" // prefixlb's flow control refused it (flowctl.go)
	case status == fasthttp.StatusGatewayTimeout:
		return "timeout"
	default:
		return "upstream_error"
	}
}

// writeError answers with an error in the OpenAI shape:
// {"error":{"message":…,"type":…,"param":null,"code":"prefixlb_<status>"}}.
func writeError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b := make([]byte, 0, 128+len(msg))
	b = append(b, `{"error":{"message":`...)
	b = strconv.AppendQuote(b, msg)
	b = append(b, `,"type":`...)
	b = strconv.AppendQuote(b, errorType(status))
	b = append(b, `,"param":null,"code":"prefixlb_`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, "\"}}\n"...)
	ctx.SetBody(b)
}
