package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Request bodies. The fasthttp server streams request bodies (StreamRequestBody): before
// handle runs it has read the header and at most the first bodyPrefetch bytes. handle then
// reserves the body's size from a budget that all requests share
// (limits.max_buffered_body_bytes) and only then reads the rest into a buffer of its own,
// each read bounded by timeouts.client_body_idle. A body that does not fit is refused at
// once with 503, before it is read, and a body over max_request_body_bytes with 413. The
// reservation and the buffer are given back when handle returns (endRequest), whatever the
// outcome: by then the request has been written to the backend and can no longer be
// retried.
const (
	// bodyPrefetch is what fasthttp reads of a body before the handler runs:
	// min(Content-Length, 8 KiB) (readBodyWithStreaming). A body no longer than this is
	// already in memory, and reading it needs no deadline.
	bodyPrefetch = 8 << 10
	// chunkedFirst is the first buffer of a chunked body; it doubles as the body grows.
	chunkedFirst = 16 << 10
	// Trimming: once a quarter of the budget (at most trimAfterMax) of unpooled, large body
	// buffers has been given back, the heap is collected and returned to the OS
	// (debug.FreeOSMemory) trimDelay later, so that the rest of a burst is given back
	// first, and at most once per trimEvery. Without it a burst of large bodies leaves the
	// process at its peak until the next natural GC, which an idle proxy may not run for
	// minutes.
	trimAfterMax = 64 << 20
	trimDelay    = time.Second
	trimEvery    = 10 * time.Second
)

// bodyClasses are the sizes of the pooled body buffers, and bodyClassMax how many of each
// the pool keeps: 4 MiB per class, 16 MiB in all. Larger bodies get a buffer of their own
// that is dropped after the request.
var (
	bodyClasses  = [...]int{16 << 10, 64 << 10, 256 << 10, 1 << 20}
	bodyClassMax = [...]int{256, 64, 16, 4}
)

// bodyBudget is the shared allowance of buffered request-body bytes, and the pool of body
// buffers. Every method is safe for concurrent use.
type bodyBudget struct {
	limit    int64
	used     atomic.Int64
	rejected *metrics.Counter

	classes [len(bodyClasses)]bufClass

	trimAfter   int64
	freedLarge  atomic.Int64 // unpooled buffer bytes given back since the last trim
	trimPending atomic.Bool
	lastTrim    atomic.Int64 // unix nanoseconds of the last trim
	trim        func()       // returns freed memory to the OS: debug.FreeOSMemory
}

// bufClass is a bounded free list of buffers of one size.
type bufClass struct {
	mu   sync.Mutex
	free [][]byte
}

// bodyLease is what one request holds of the budget: reserved bytes and its buffer.
type bodyLease struct {
	n   int64
	buf []byte
}

func newBodyBudget(limit int64, set *metrics.Set) *bodyBudget {
	b := &bodyBudget{limit: limit, trimAfter: min(trimAfterMax, limit/4), trim: debug.FreeOSMemory}
	set.NewGauge(`prefixlb_buffered_request_body_bytes`, func() float64 { return float64(b.used.Load()) })
	b.rejected = set.NewCounter(`prefixlb_request_body_budget_exhausted_total`)
	return b
}

// reserve adds n bytes to bl's reservation if they fit the budget; false leaves both as
// they were.
func (b *bodyBudget) reserve(bl *bodyLease, n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			bl.n += n
			return true
		}
	}
}

// get returns a buffer of length n, pooled when n fits a class.
func (b *bodyBudget) get(n int) []byte {
	for i, size := range bodyClasses {
		if n <= size {
			c := &b.classes[i]
			c.mu.Lock()
			var buf []byte
			if k := len(c.free); k > 0 {
				buf = c.free[k-1]
				c.free[k-1] = nil
				c.free = c.free[:k-1]
			}
			c.mu.Unlock()
			if buf == nil {
				buf = make([]byte, size)
			}
			return buf[:n]
		}
	}
	return make([]byte, n)
}

// put gives a buffer back: to its class's free list when it has room, else to the
// collector, counting large ones toward the next trim.
func (b *bodyBudget) put(buf []byte) {
	size := cap(buf)
	for i, cs := range bodyClasses {
		if size == cs {
			c := &b.classes[i]
			c.mu.Lock()
			if len(c.free) < bodyClassMax[i] {
				c.free = append(c.free, buf[:size])
				buf = nil
			}
			c.mu.Unlock()
			break
		}
	}
	if buf != nil && size > bodyClasses[len(bodyClasses)-1] {
		b.freed(size)
	}
}

// freed counts a large buffer given to the collector and schedules a trim when enough
// have been (see trimAfterMax).
func (b *bodyBudget) freed(size int) {
	if b.freedLarge.Add(int64(size)) < b.trimAfter || !b.trimPending.CompareAndSwap(false, true) {
		return
	}
	delay := max(trimDelay, time.Until(time.Unix(0, b.lastTrim.Load()).Add(trimEvery)))
	time.AfterFunc(delay, func() {
		b.freedLarge.Store(0)
		b.trim()
		b.lastTrim.Store(time.Now().UnixNano())
		b.trimPending.Store(false)
	})
}

// release gives back everything bl holds; bl is empty afterwards.
func (b *bodyBudget) release(bl *bodyLease) {
	if bl.n != 0 {
		b.used.Add(-bl.n)
	}
	if bl.buf != nil {
		b.put(bl.buf)
	}
	*bl = bodyLease{}
}

// grow returns a buffer of at least need bytes (doubling, capped at limit+1: one byte
// over the limit tells a body too large) holding buf[:n], reserving the added capacity
// first; nil when the budget has no room. bl's reservation is the new buffer's size.
func (b *bodyBudget) grow(bl *bodyLease, buf []byte, n, need, limit int) []byte {
	size := min(max(2*len(buf), need), limit+1)
	if !b.reserve(bl, int64(size-len(buf))) {
		return nil
	}
	nb := b.get(size)
	copy(nb, buf[:n])
	b.put(buf)
	return nb
}

// bodyRefusal is why readBody answered a request itself.
type bodyRefusal int

const (
	bodyOK bodyRefusal = iota
	bodyTooLarge
	bodyNoBudget
	bodyStalled
	bodyMalformed
	bodyClientGone
)

// readBody reads the request body into a buffer held by bl, reserving it from the budget
// first, and makes it the request's body; start is when the handler began (client_read
// bounds the body from there). It returns bodyOK, or why it could not; the caller answers
// (refuseBody) and releases bl in every case.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, bl *bodyLease, start time.Time) bodyRefusal {
	req := &ctx.Request
	st := req.BodyStream()
	if st == nil {
		return bodyOK // not streamed: any body is whole already
	}
	limit := s.maxBody
	cl := req.Header.ContentLength()
	var n int
	switch {
	case cl > limit:
		return bodyTooLarge
	case cl == 0:
		req.SetBodyRaw(nil) // drops the (empty) stream: Body never reads a stream
		return bodyOK
	case cl > 0:
		if !s.bodies.reserve(bl, int64(cl)) {
			return bodyNoBudget
		}
		bl.buf = s.bodies.get(cl)
		br := bodyReader{ctx: ctx, st: st, idle: s.bodyIdle, until: s.bodyDeadline(start), timed: cl > bodyPrefetch}
		for n < cl {
			m, err := br.read(bl.buf[n:cl])
			n += m
			if err == io.EOF && n < cl {
				return bodyClientGone // the stream ends early only when the client left
			}
			if err != nil && err != io.EOF {
				return classifyBodyErr(err)
			}
		}
	default: // chunked: the reservation grows with the buffer
		if !s.bodies.reserve(bl, chunkedFirst) {
			return bodyNoBudget
		}
		bl.buf = s.bodies.get(chunkedFirst)
		br := bodyReader{ctx: ctx, st: st, idle: s.bodyIdle, until: s.bodyDeadline(start), timed: true}
		for {
			if n == len(bl.buf) {
				if n > limit {
					return bodyTooLarge
				}
				nb := s.bodies.grow(bl, bl.buf, n, n+chunkedFirst, limit)
				if nb == nil {
					return bodyNoBudget
				}
				bl.buf = nb
			}
			m, err := br.read(bl.buf[n:])
			n += m
			if err == io.EOF {
				break
			}
			if err != nil {
				return classifyBodyErr(err)
			}
		}
		if n > limit {
			return bodyTooLarge
		}
	}
	req.SetBodyRaw(bl.buf[:n])
	return bodyOK
}

// bodyDeadline is the latest a body read may end: client_read after start (none when
// client_read is 0).
func (s *Server) bodyDeadline(start time.Time) time.Time {
	if s.clientRead <= 0 {
		return time.Time{}
	}
	return start.Add(s.clientRead)
}

// classifyBodyErr sorts a failed body read: deadline (stalled client), the client gone
// (EOF, reset, closed), or broken chunked framing.
func classifyBodyErr(err error) bodyRefusal {
	switch {
	case isTimeout(err):
		return bodyStalled
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return bodyClientGone
	}
	return bodyMalformed
}

// bodyReader reads a body stream with an idle deadline: each read may wait at most idle,
// and none past until (timeouts.client_read from the start of the handler). The deadline
// moves only when it has aged by a sixteenth of idle, so a fast body does not reset a
// timer per read. A body fasthttp prefetched whole (timed false) is read without one.
type bodyReader struct {
	ctx   *fasthttp.RequestCtx
	st    io.Reader
	idle  time.Duration
	until time.Time
	timed bool
	set   time.Time
}

func (r *bodyReader) read(p []byte) (int, error) {
	if r.timed && r.idle > 0 {
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
// Retry-After), 408, 400, or nothing for a client that left. The connection closes after
// the answer, lingering so that a client still sending its body sees the refusal.
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
		msg = "request body not received in time (timeouts.client_body_idle between reads, timeouts.client_read in all)"
	case bodyMalformed:
		status, class = fasthttp.StatusBadRequest, "body_malformed"
		msg = "malformed chunked request body"
	case bodyClientGone:
		s.log.Info("client left while sending the request body", zap.String("remote", ctx.RemoteAddr().String()))
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
