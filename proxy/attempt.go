package proxy

// One attempt of a request on one backend: connect (pooled or new), write the request, read
// the response head, judge the status, and hand the response to fasthttp for the relay.

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/router"
)

// retryStatus is a backend answer that says "not now" before any byte reached the client:
// 502/503 (overloaded, starting, behind its own proxy) and 429 (busy).
type retryStatus int

func (r retryStatus) Error() string { return fmt.Sprintf("backend answered %d", int(r)) }

// isRetryStatus reports whether a response with status is retried elsewhere when it can be.
func isRetryStatus(status int) bool {
	return status == fasthttp.StatusServiceUnavailable || status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusBadGateway
}

// retryable reports whether an attempt that failed with err may be retried on another
// backend: nothing of it reached the client, and the backend, not the request, failed. (A
// body cut short is errTruncated here only when it was read ahead before the head went to
// the client: readHead.) prefixlb's own resources running out (localError) is not: another
// backend would meet the same limit.
func retryable(err error) bool {
	var rs retryStatus
	var de *dialError
	return errors.As(err, &rs) || errors.As(err, &de) || errors.Is(err, errHeaderTimeout) ||
		errors.Is(err, errUpstreamClosed) || errors.Is(err, errInvalidResponse) || errors.Is(err, errTruncated)
}

// earlyResponseWait bounds the read of a response after writing the request failed: a
// backend that answered before reading the whole body (413, 400) and closed has its answer
// in the socket already; a connection that carries none is given up on at once.
const earlyResponseWait = time.Second

// try sends the request to b and, when response headers arrive, hands the response to
// fasthttp. A nil error means the flow now belongs to the relay. Every failure leaves
// through one exit, which withdraws what the attempt taught the policy (the ticket refused)
// and releases b.
func (s *Server) try(ctx *fasthttp.RequestCtx, f *flow, b *backend.Backend, canRetry bool) error {
	up := (*s.ups.Load())[b]
	if up == nil {
		return errBackendRemoved // nothing was sent: not a connect error of b's
	}
	f.up = up
	if !f.leased || f.lease.Backend() != b {
		s.beginLease(f, b)
	}
	f.leased = false // begun by flow control's dispatcher with its decision: this attempt's
	f.tr.attemptBegan(&ctx.Request.Header, b)
	ctx.Request.Header.SetHost(b.Addr)
	head := bytes.Equal(f.method, []byte(fasthttp.MethodHead))
	var early bool
	err := s.settle(f, b)
	if err == nil {
		early, err = s.exchange(ctx, f, b, up, head)
	}
	if err == nil {
		err = s.judge(f, b, canRetry)
	}
	if err != nil {
		f.ticket.Refuse()
		f.lease.Release()
		f.tr.attemptFailed(err)
		return err
	}
	s.testPanicAt(stageHead)
	s.relayResponse(ctx, f, b, early, head)
	return nil
}

// settle holds a first attempt that the policy asks to (router.Settler: peered replicas, a
// request long enough that waiting costs little of its TTFT) for its SettleWait, its
// decision sent to the peers first (the ticket held), so that this replica hears of theirs
// made at the same instant: a burst spread over several replicas would otherwise be placed
// by each on the backend that looked lightest to all of them. errContended when a peer's
// decision on b made before it arrived meanwhile (the ticket's Release withdrew the hold;
// forward decides again, and try's exit releases b).
//
// A client that leaves during the hold is not decided again: its request is withdrawn (the
// ticket refused while held: Abandon, where the Hold learned it; its chunks never went to
// the peers). The lease began before the hold, so that this replica's and its peers' next
// decisions count it; its prefill sample times from the send (backend.Lease.Sent).
func (s *Server) settle(f *flow, b *backend.Backend) error {
	if f.attempts != 1 || f.settles >= maxSettles || f.dec.Backend != b || f.gone.Load() {
		return nil
	}
	wait := f.ticket.SettleWait(f.dec) // 0 once held or sent
	if wait <= 0 {
		return nil
	}
	decided := time.Now()
	if !f.ticket.Hold(f.dec) {
		return nil // nothing held: sent at once, and learned once written
	}
	f.settles++
	time.Sleep(wait)
	if f.gone.Load() {
		f.ticket.Refuse() // never sent: Abandon, not an Unlearn of chunks the peers never got
		return f.goneErr()
	}
	if f.ticket.Release(decided) {
		return errContended
	}
	f.lease.Sent()
	return nil
}

// exchange sends the request to b and reads the response head into f.resp. A pooled
// connection that turns out stale is replaced once by a new one: its siblings idle as long
// likely are too (a backend that restarted closed them all), so the resend dials. early
// reports a response read after writing the request failed.
func (s *Server) exchange(ctx *fasthttp.RequestCtx, f *flow, b *backend.Backend, up *upstream, head bool) (early bool, err error) {
	early, stale, err := s.exchangeOn(ctx, f, b, up, head, false)
	if stale {
		early, _, err = s.exchangeOn(ctx, f, b, up, head, true)
	}
	return early, err
}

// exchangeOn is exchange on one connection: a pooled one, or a new one when dial is set.
// stale reports a failure of a reused connection that a resend on a new one may fix; other
// failures are classified and counted against b's health, but for prefixlb's own resources
// running out (localError), which is reported as prefixlb's and never as b's.
func (s *Server) exchangeOn(ctx *fasthttp.RequestCtx, f *flow, b *backend.Backend, up *upstream, head, dial bool) (early, stale bool, err error) {
	now := time.Now()
	var conn *uconn
	var reused bool
	if dial {
		conn, err = up.dial()
	} else {
		conn, reused, err = up.get(now)
	}
	if err != nil {
		if le := (*localError)(nil); errors.As(err, &le) {
			s.local.report(le.kind, "dial", le.err)
		} else {
			s.hc.Observe(b, health.OutcomeConnectError)
		}
		return false, false, err
	}
	if !f.setConn(conn) {
		_ = conn.Close()
		return false, false, f.goneErr()
	}
	early, err = s.sendAndReadHead(ctx, f, b, conn, now, head)
	if err == nil {
		return early, false, nil
	}
	f.dropConn()
	switch {
	case f.gone.Load():
		return false, false, f.goneErr()
	case reused && staleConn(err):
		return false, true, err
	case isTimeout(err):
		s.hc.Observe(b, health.OutcomeTimeout)
		return false, false, &failure{errHeaderTimeout, err}
	}
	if !errors.Is(err, errInvalidResponse) && !errors.Is(err, errTruncated) {
		err = classify(err)
	}
	s.hc.Observe(b, health.OutcomeConnectError)
	return false, false, err
}

// sendAndReadHead writes the request on conn and reads the response head, within the
// response-header timeout from now. The prefix index learns as soon as the request is on its
// way (the ticket sent; a request held by settle learned before), so that updating it
// overlaps the backend's work instead of delaying the response; a backend that then refuses
// the request (status ≥ 400) or never answers is unlearned again (the ticket refused).
func (s *Server) sendAndReadHead(ctx *fasthttp.RequestCtx, f *flow, b *backend.Backend, conn *uconn, now time.Time, head bool) (early bool, err error) {
	deadline := now.Add(s.headerTimeout)
	_ = conn.SetDeadline(deadline)
	err = conn.writeRequest(&ctx.Request)
	if err == nil {
		f.ticket.Send(b, f.dec.MatchedChunks)
	}
	if err == nil {
		err = readHead(f, conn, head)
	} else if !f.gone.Load() && !isTimeout(err) {
		// The backend may have answered before reading all of the body (413, 400) and
		// closed, which makes the write fail: its answer is in the socket. Relay it and
		// judge the backend by its status; the connection is not reused.
		_ = conn.SetReadDeadline(earliest(deadline, time.Now().Add(earlyResponseWait)))
		if readHead(f, conn, head) == nil {
			err, early = nil, true
		}
	}
	if err == nil && f.resp.StatusCode() < fasthttp.StatusOK {
		// 101 Switching Protocols: the connection now speaks another protocol (fasthttp
		// consumes 100, 103 and the other 1xx before the final response). prefixlb does not
		// tunnel upgrades; the connection is closed, never pooled.
		err = &failure{errInvalidResponse, errUnexpected1xx}
	}
	return early, err
}

// judge counts the response status for b's health and unlearns a refused request; a "not
// now" status is a retryStatus error when the request can be retried elsewhere (its response
// is then dropped).
func (s *Server) judge(f *flow, b *backend.Backend, canRetry bool) error {
	status := f.resp.StatusCode()
	s.hc.Observe(b, outcomeOf(status))
	if status >= fasthttp.StatusMultipleChoices {
		f.lease.Refused() // its first byte is no token: not a TTFT for the prefill model
	}
	// A refused request (400 context too long, 429, 503 retried elsewhere) left nothing in
	// the backend's cache.
	if status >= fasthttp.StatusBadRequest {
		f.ticket.Refuse()
	}
	if canRetry && isRetryStatus(status) {
		_ = f.resp.CloseBodyStream()
		f.dropConn()
		return retryStatus(status)
	}
	return nil
}

// relayResponse hands the response whose head arrived to fasthttp: from here on it belongs
// to the client.
func (s *Server) relayResponse(ctx *fasthttp.RequestCtx, f *flow, b *backend.Backend, early, head bool) {
	status := f.resp.StatusCode()
	f.relayed = true
	f.resp.Header.CopyTo(&ctx.Response.Header)
	// CopyTo copies the backend header's flags too, and fasthttp writes "text/plain;
	// charset=utf-8" for a response without Content-Type unless told not to: a response the
	// backend sent untyped reaches the client untyped.
	ctx.Response.Header.SetNoDefaultContentType(true)
	if early {
		f.resp.SetConnectionClose() // the request was not written whole: the connection is done
	}
	stripHopResponse(&ctx.Response.Header)
	if s.backendHeader {
		ctx.Response.Header.Set(HeaderBackend, b.Name)
	} else {
		ctx.Response.Header.Del(HeaderBackend) // a backend's own (a prefixlb in front of others)
	}
	var route [routeHeaderCap]byte
	ctx.Response.Header.SetBytesV(HeaderRoute, appendRouteHeader(route[:0], f.dec, f.k.PromptTokens, f.settles))
	if f.body == nil { // HEAD, 204, 304, Content-Length: 0
		f.eof = true
		ctx.Response.SkipBody = head
		f.finish(status, nil)
		return
	}
	f.ctx, f.clientWrite = ctx, s.clientWrite
	s.predictDirect(f) // the last moment the request body is held
	contentLength := f.resp.Header.ContentLength()
	// A body longer than readHead reads ahead: its head goes out at once, so that a body the
	// backend cuts short reaches the client as fewer bytes than its Content-Length, then the
	// close, rather than as nothing (fasthttp holds a head until its buffer fills).
	ctx.Response.ImmediateHeaderFlush = contentLength > connBufferSize
	if contentLength < 0 {
		contentLength = -1
		if !ctx.Request.Header.IsHTTP11() {
			f.relayClosing(ctx)
			return
		}
	}
	ctx.SetBodyStream(f, contentLength)
}

// dropConn closes the flow's backend connection, if the watchdog has not, and forgets the
// response read on it.
func (f *flow) dropConn() {
	if conn := f.takeConn(); conn != nil {
		_ = conn.Close()
	}
	f.resp.Reset()
	f.body = nil
}

// hasBody reports whether a response has body bytes still to come on the connection.
func hasBody(r *fasthttp.Response, head bool) bool {
	st := r.StatusCode()
	return !head && r.Header.ContentLength() != 0 && st >= 200 && st != fasthttp.StatusNoContent && st != fasthttp.StatusNotModified
}

// outcomeOf classifies a response status for passive health: 5xx counts against the backend,
// 429 means busy (not dead), other 4xx are the client's fault.
func outcomeOf(status int) health.Outcome {
	switch {
	case status == fasthttp.StatusTooManyRequests:
		return health.OutcomeBusy
	case status >= 500:
		return health.OutcomeServerError
	case status >= 400:
		return health.OutcomeClientError
	}
	return health.OutcomeOK
}

// routeHeaderCap holds the longest x-prefixlb-route value ("overload-fallback;chunks=",
// ";cached=", ";predicted_ttft_us=" and 19 digits each, ";settled=2") without allocating.
const routeHeaderCap = 144

// appendRouteHeader appends the x-prefixlb-route value "REASON;chunks=N", with
// ";cached=T" (the prompt tokens the policy predicts the backend holds) when the policy
// predicted its prefill, ";predicted_ttft_us=U" (the time to first token it estimated
// there, microseconds) when it estimated one, and ";settled=H" when the request was held H
// times (1 or 2) to settle with peered replicas (Server.settle), the decision shown being the
// last (no fmt: this runs on every request).
func appendRouteHeader(dst []byte, d router.Decision, promptTokens, settles int) []byte {
	dst = append(dst, d.Reason.String()...)
	dst = append(dst, ";chunks="...)
	dst = strconv.AppendInt(dst, int64(d.MatchedChunks), 10)
	if d.PrefillTokens > 0 {
		dst = append(dst, ";cached="...)
		dst = strconv.AppendInt(dst, max(int64(promptTokens)-d.PrefillTokens, 0), 10)
	}
	if d.PredictedTTFT > 0 {
		dst = append(dst, ";predicted_ttft_us="...)
		dst = strconv.AppendInt(dst, d.PredictedTTFT.Microseconds(), 10)
	}
	if settles > 0 {
		dst = append(dst, ";settled="...)
		dst = strconv.AppendInt(dst, int64(settles), 10)
	}
	return dst
}
