package proxy

import (
	"errors"
	"net"
	"os"
	"strconv"

	"github.com/valyala/fasthttp"
)

// Errors the proxy itself reports. Each maps to one status in statusOf.
var (
	errNoBackend      = errors.New("no backend available")
	errClientGone     = errors.New("client disconnected")
	errHeaderTimeout  = errors.New("backend sent no response headers within timeouts.response_header")
	errIdleTimeout    = errors.New("backend sent nothing within timeouts.idle")
	errShuttingDown   = errors.New("prefixlb is shutting down")
	errUpstreamClosed = errors.New("backend closed the connection")
	errBackendRemoved = errors.New("backend removed by a config reload or discovery")
)

// StatusClientClosedRequest is nginx's 499: the client left before the response was complete.
const StatusClientClosedRequest = 499

// statusOf maps a forwarding error to the status reported to the client (and logged): one
// place, as Caddy's statusError does. Dial errors and closed connections → 502, timeouts → 504,
// client gone → 499, nothing to route to → 503.
func statusOf(err error) int {
	var ne net.Error
	switch {
	case errors.Is(err, errClientGone):
		return StatusClientClosedRequest
	case errors.Is(err, errNoBackend), errors.Is(err, errShuttingDown):
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
	case status == fasthttp.StatusServiceUnavailable:
		return "service_unavailable"
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
