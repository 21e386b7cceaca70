package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// flow is one proxied request: the routing key, the lease on the chosen backend, the upstream
// connection and the response being relayed. Flows are pooled. A flow's response body is
// relayed by fasthttp calling Read until EOF and then CloseWithError, once.
type flow struct {
	s     *Server
	id    uint64
	k     key.Key
	cands []*backend.Backend
	lease backend.Lease
	dec   router.Decision
	// ticket is the request's learning lifecycle with the policy (router.Ticket): what it
	// learned of the attempt that stands, and the calls that withdraw or correct it.
	ticket router.Ticket
	resp   fasthttp.Response
	conn0  net.Conn        // client connection; the watchdog derives raw from it when it first looks
	raw    syscall.RawConn // client socket, for the watchdog (set and read by the watchdog only)

	start    time.Time
	keyed    time.Time // the key built; zero once the first pick counted from it (flow.pickStart)
	method   []byte
	path     []byte
	attempts int
	settles  int // times held for the peers' decisions (Server.settle)

	mu     sync.Mutex // guards conn against the watchdog's abort
	conn   *uconn
	up     *upstream
	gone   atomic.Bool // client left (or shutdown abort)
	goneBy error

	body      io.Reader // the backend's decoded body stream
	eof       bool
	firstByte time.Duration // TTFT as the proxy saw it: the first body byte that holds a token (see tokenAt)
	firstBody time.Duration // the first body byte from the backend
	tokenSeen bool          // firstByte is set
	bytes     int64
	idle      time.Duration
	idleSet   time.Time // when the connection's read deadline was last set to now + idle
	done      atomic.Bool

	// The client's write deadline, moved as the relay progresses (timeouts.client_write):
	// through ctx, so that fasthttp clears it after the response, or on hj, the connection
	// hijacked for a close-delimited HTTP/1.0 body.
	ctx          *fasthttp.RequestCtx
	hj           net.Conn
	clientWrite  time.Duration
	clientWriteA time.Time // when the client's write deadline was last set to now + clientWrite

	readErr     error // the first error reading the backend's body
	usagePrompt int   // backend-reported usage.prompt_tokens (0: not seen)
	usageCached int   // backend-reported usage.prompt_tokens_details.cached_tokens
	// usageCacheSeen: the usage carried a cached-token count (cached_tokens or
	// cache_read_input_tokens); without it usageCached 0 means "not reported".
	usageCacheSeen bool

	tr requestTrace // the request's spans (trace.go); zero when not traced

	// Flow control (flowctl.go). wake is signalled by abort, so that a request waiting in
	// a queue learns that its client left. qit and qq are the request's queue item and its
	// pool's queue once it was queued and dispatched (settled when the flow is put back);
	// placed says the dispatcher made the first decision and began the lease on it; refused
	// that flow control answered the request itself.
	wake            chan struct{}
	qit             *flowcontrol.Item
	qq              *poolQueue
	placed, refused bool
	leased          bool // the dispatcher began the lease for the first attempt
	queueWait       time.Duration
	usageOutput     int  // backend-reported completion_tokens / output_tokens (queued and direct requests)
	usageOutputSeen bool // usageOutput was reported
	// direct: flow control was on and the request went straight through (its pool had
	// room); its flow is charged what it cost when it ends (chargeDirect), classified from
	// reqHeader, the request's headers (valid until the response is written, unlike its
	// body, which the handler's end releases).
	direct    bool
	reqHeader *fasthttp.RequestHeader
	directOut int // its predicted output, noted while its body was held (predictDirect); 0: none
	// class is the request's priority and flow once classified (classify), classOK says so:
	// a request is classified once, whichever of the queue, the reserve check (hold) and the
	// charge of a straight-through request asks first.
	class   classed
	classOK bool
	// relayed: a replica's response was handed to the client (relayResponse); without it no
	// replica served the request, and flow control charges its flow nothing (servedCost).
	// f.resp's status does not tell: fail sets prefixlb's own there.
	relayed bool
}

// setConn attaches c as the flow's upstream connection; false if the client already left.
func (f *flow) setConn(c *uconn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone.Load() {
		return false
	}
	f.conn = c
	return true
}

// takeConn detaches and returns the upstream connection (nil if the watchdog closed it).
func (f *flow) takeConn() *uconn {
	f.mu.Lock()
	c := f.conn
	f.conn = nil
	f.mu.Unlock()
	return c
}

// abort is called by the watchdog (client gone) and by shutdown: it closes the upstream
// connection, which makes the backend see a disconnect and abort the generation, and makes
// any blocked read on it return.
func (f *flow) abort(why error) {
	f.mu.Lock()
	if !f.gone.Load() {
		f.goneBy = why
		f.gone.Store(true)
	}
	c := f.conn
	f.conn = nil
	f.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
	select { // a request waiting in a flow-control queue leaves it (Server.await)
	case f.wake <- struct{}{}:
	default:
	}
}

// goneErr is the reason the flow was aborted.
func (f *flow) goneErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.goneBy
}

// deadlineSteps: a stream's idle and client-write deadlines move only when they have aged by
// 1/deadlineSteps of their timeout, so that a stream of many small chunks does not reset a
// runtime timer per chunk; a stall is cut after between 1-1/deadlineSteps and all of it.
const deadlineSteps = 16

// read relays the backend's body (Read, with its panics contained). Each read may wait at
// most the idle timeout; what it returns the client must take within timeouts.client_write.
func (f *flow) read(p []byte) (int, error) {
	f.mu.Lock()
	c := f.conn
	f.mu.Unlock()
	if c == nil {
		if f.gone.Load() {
			return 0, f.goneErr()
		}
		return 0, errUpstreamClosed
	}
	if f.idle > 0 {
		// The idle deadline is moved only when it has aged by a sixteenth of the idle
		// timeout: a stream that stalls is cut after between 15/16 and all of idle without
		// a byte, and a stream of many small chunks does not reset a runtime timer per chunk.
		if now := time.Now(); f.idleSet.IsZero() || now.Sub(f.idleSet) > f.idle/deadlineSteps {
			_ = c.SetReadDeadline(now.Add(f.idle))
			f.idleSet = now
		}
	}
	n, err := f.body.Read(p)
	// fasthttp writes and flushes one client chunk per Read. Chunks the backend wrote back to
	// back that have already arrived (a burst of tokens, the usage event and [DONE]) go out
	// in that one write; bufferedChunk makes sure this never waits for more data. Each Read of
	// the chunked reader ends at a chunk boundary unless it filled p or drained the buffer,
	// so the loop only ever starts at a boundary.
	for err == nil && n > 0 && n < len(p) && f.resp.Header.ContentLength() == -1 && bufferedChunk(c.br) {
		var m int
		m, err = f.body.Read(p[n:])
		n += m
	}
	if f.clientWrite > 0 {
		// Moved after the read, which may have waited on the backend for long: the deadline
		// bounds the client, not the backend. Throttled like the idle deadline: a client that
		// takes nothing is cut after between 15/16 and all of clientWrite.
		if now := time.Now(); now.Sub(f.clientWriteA) > f.clientWrite/deadlineSteps {
			f.setClientWriteDeadline(now.Add(f.clientWrite))
			f.clientWriteA = now
		}
	}
	if n > 0 {
		if f.bytes == 0 {
			f.firstBody = time.Since(f.start)
		}
		if !f.tokenSeen && f.tokenAt(p[:n]) {
			f.tokenSeen = true
			f.firstByte = time.Since(f.start)
			f.tr.firstToken()
			f.lease.FirstByte()
			f.ticket.FirstToken()
		}
		f.bytes += int64(n)
		f.sniffUsage(p[:n])
	}
	if err == io.EOF {
		f.eof = true
		return n, io.EOF
	}
	if err != nil {
		f.readErr = err
		switch {
		case f.gone.Load():
			err = f.goneErr()
		case isTimeout(err):
			err = errIdleTimeout
		default:
			err = &failure{errTruncated, err}
		}
	}
	return n, err
}

// setClientWriteDeadline sets the write deadline of the client's connection. fasthttp writes
// with no deadline of its own (WriteTimeout 0); one set through ctx is cleared after the
// response, so a later response on the connection starts without it.
func (f *flow) setClientWriteDeadline(t time.Time) {
	if f.hj != nil {
		_ = f.hj.SetWriteDeadline(t)
	} else if f.ctx != nil {
		_ = f.ctx.SetWriteDeadline(t)
	}
}

// relayClosing relays the body to an HTTP/1.0 client, which knows no chunked coding, as a
// close-delimited body (RFC 9112 §6.3): fasthttp chunks a stream of unknown length for every
// client, so the connection is hijacked once the handler returns, and the head (without
// Content-Length or Transfer-Encoding, with Connection: close), then the body as the backend
// sends it, are written on it; fasthttp closes it after. The flow ends as with fasthttp's
// relay, through CloseWithError.
func (f *flow) relayClosing(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.SetContentLength(-2) // identity; sets Connection: close
	head := append([]byte(nil), h.Header()...)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		defer f.relayClosingGuard()
		f.hj = c
		if f.clientWrite > 0 {
			f.setClientWriteDeadline(time.Now().Add(f.clientWrite))
		}
		_, err := c.Write(head)
		buf := make([]byte, relayBufferSize)
		for err == nil {
			n, rerr := f.Read(buf)
			if n > 0 {
				_, err = c.Write(buf[:n])
			}
			if rerr == io.EOF {
				break
			}
			if err == nil {
				err = rerr
			}
		}
		_ = f.CloseWithError(err)
	})
}

// relayBufferSize is the read size of relayClosing, as fasthttp's body copy buffer.
const relayBufferSize = 32 << 10

// CloseWithError ends the relay: fasthttp calls it once with nil after a complete response
// or with the error that stopped writing to the client.
func (f *flow) CloseWithError(werr error) error {
	status := f.resp.StatusCode()
	var err error
	switch {
	case werr != nil:
		err = werr // what Read returned (a class), or the error writing to the client
		switch {
		case f.gone.Load():
			err = f.goneErr()
		case f.readErr == nil && isTimeout(werr):
			// The client took nothing for timeouts.client_write: cut both sides, so that the
			// backend's in-flight slot is free. Not the backend's fault.
			err = &failure{errClientWriteTimeout, werr}
		case f.readErr == nil:
			// Reading from the backend went fine; writing to the client failed: the client
			// left. That must not count against the backend.
			err = &failure{errClientGone, werr}
		}
	case !f.eof:
		err = errTruncated
	}
	f.finish(status, err)
	return nil
}

// finish releases everything the flow holds, exactly once, logs the request line and returns
// the flow to its pool.
func (f *flow) finish(status int, err error) {
	if f.done.Swap(true) {
		return
	}
	defer f.containFinish() // a panic below: the rest is released, the flow not pooled
	s := f.s
	s.wd.remove(f)
	if !f.tokenSeen {
		f.firstByte = f.firstBody // no token event (an error, an empty stream): the first byte
	}
	res := f.result(err)
	s.m.observe(f, status, res)
	s.correctIndex(f, res)
	f.ticket.Done()
	if f.body != nil && (res == resultTruncated || res == resultIdleTimeout) {
		s.hc.Observe(f.lease.Backend(), health.OutcomeServerError) // died or stalled mid-response
	}
	s.testPanicAt(stageFinish)
	if f.body != nil {
		_ = f.resp.CloseBodyStream()
		f.body = nil
	}
	// Taken here, not before the bookkeeping above, so that a panic there leaves the
	// connection on the flow for containFinish to close.
	c := f.takeConn()
	reusable := err == nil && f.eof && c != nil && !f.resp.ConnectionClose()
	if c != nil {
		if reusable {
			f.up.put(c, time.Now())
		} else {
			_ = c.Close()
		}
	}
	if f.k.Routed && err == nil && f.eof && status >= fasthttp.StatusOK && status < fasthttp.StatusMultipleChoices {
		// A generation the replica counts finished (who else sends: health/senders.go); its
		// /health, /tokenize or embeddings answers it does not count.
		f.lease.Complete()
	}
	// Flow control's charge first: the release may wake the dispatcher, whose next
	// placement should see it.
	s.settleQueued(f)
	s.chargeDirect(f)
	f.lease.Release()
	f.tr.end(f, status, res)
	s.logRequest(f, status, err, res)
	f.ctx, f.hj, f.clientWrite, f.clientWriteA = nil, nil, 0, time.Time{}
	s.putFlow(f)
}

// result is what became of a request, for its log line and the stream-error counters.
type result uint8

const (
	resultOK                 result = iota // complete
	resultFailed                           // no backend response: the proxy's own error status
	resultTruncated                        // the backend's body ended early (closed, reset, bad framing)
	resultIdleTimeout                      // the backend sent nothing for timeouts.idle mid-response
	resultClientGone                       // the client left
	resultClientWriteTimeout               // the client took nothing for timeouts.client_write
	resultShutdown                         // aborted at the end of the shutdown grace
	nResults
)

var resultNames = [nResults]string{"ok", "failed", "truncated", "idle_timeout", "client_gone", "client_write_timeout", "shutdown"}

func (r result) String() string { return resultNames[r] }

// result classifies err, the reason the flow ended (nil: complete). Call before the body
// stream is released: a flow whose response started (headers handed to the client) fails
// differently from one that never got one.
func (f *flow) result(err error) result {
	switch {
	case err == nil:
		return resultOK
	case errors.Is(err, errClientGone):
		return resultClientGone
	case errors.Is(err, errClientWriteTimeout):
		return resultClientWriteTimeout
	case errors.Is(err, errShuttingDown):
		return resultShutdown
	case f.body == nil && f.bytes == 0:
		return resultFailed
	case errors.Is(err, errIdleTimeout):
		return resultIdleTimeout
	}
	return resultTruncated
}

// isTimeout reports deadline errors: net.Error timeouts and fasthttp.ErrTimeout, which has a
// Timeout method but no Temporary, so it is not a net.Error.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, errHeaderTimeout) || (errors.As(err, &te) && te.Timeout())
}
