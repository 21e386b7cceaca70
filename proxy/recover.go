package proxy

// Containing panics: a bug that one request hits (hostile input reaching a key-builder bug,
// a nil in the routing code) fails that request, never the process. fasthttp does not
// recover a handler's panic, so without this one panic would end every stream of every
// user. Each panic is logged once, at error level, and counted; every resource the request
// held is released exactly once. The line has the stack (bounded) at most once per
// panicStackEvery per site (logLimiter), so that a client that can trigger a panic again
// and again does not flood the log; the others name the site and count the stacks left out.
//
// Where a request's serving runs, and what contains a panic there:
//
//   - The routing key (buildKey, from prepare and /debug/route): the request is routed as
//     one prefixlb cannot parse (parse-fallback, key.Fallback), its body forwarded unchanged;
//     prefixlb_key_panics_total. The recover is here, not in router/key: the key package
//     only guarantees that its scratch pool never gets back a state a panic left half-way
//     (key.Builder.Build), and lets the panic reach its caller, since a library that
//     swallowed its own bugs would hide them from its fuzz targets and other callers, and
//     logging and metrics are the proxy's.
//   - The handler (handle, through endServing): admit, prepare, pick, forward, the attempt
//     up to handing the response to fasthttp. The client gets a 500 with an OpenAI-shaped
//     error (nothing of the response has reached it: fasthttp writes only after handle
//     returns) and the connection is closed after it.
//   - The relay (flow.Read), which fasthttp drives after handle returned, or relayClosing's
//     hijacked goroutine for an HTTP/1.0 client: the response's head is written (to the
//     client, or to fasthttp's buffer), so the client connection is closed; the client sees
//     a cut stream (or a connection closed without a response), never a hang.
//   - The release (flow.finish, from fasthttp's CloseWithError or the handler): the release
//     is completed, and the client has had its answer.
//
// The last three count prefixlb_handler_panics_total and leave the flow through abandon,
// which releases what it holds and keeps it out of the pool. A panicked request writes this
// one log line instead of its request line, and prefixlb_requests_total does not count it.
//
// The goroutines that are not a request's serving stay as they are. Process-scoped: the
// watchdog's loop (one per Server; per flow it polls a socket and closes a connection, no
// request bytes), the body budget's collector (runtime GC calls) and the health checker's
// loops (already recovered per check, health.Checker.safely). Per connection: the lingering
// close of a refused connection (reads and drops bytes). The shadow policy, the chunk
// coalescing (bufferedChunk) and the index correction (correctIndex) run on the request's
// own goroutine, inside the handler, the relay or the release, and are contained there.
//
// A panic is contained, not undone: code that panics while holding a lock it does not
// release by defer leaves it held, and the requests that need it wait.

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Bounds of a panic's log line, bytes: the stack of a request's goroutine is a few KB; the
// value of a runtime error a line.
const (
	maxPanicStack = 8 << 10
	maxPanicValue = 256
)

// panicStackEvery is how often one site's panics log their stack: the first of a site's
// panics, and the first after each panicStackEvery since its last stack, do; the others log
// the short line.
const panicStackEvery = time.Minute

// The messages of the panic log lines, one per place a panic is contained.
const (
	logKeyPanic     = "panic building the routing key: routed by parse-fallback, body forwarded unchanged"
	logHandlerPanic = "panic serving a request: answered 500"
	logRelayPanic   = "panic relaying a response: client connection closed"
	logFinishPanic  = "panic finishing a request: its resources released"
)

// msgInternal is the message of the 500 a request whose serving panicked gets.
const msgInternal = "internal error in prefixlb while serving the request; it was not completed"

// errPanicked ends the relay of a flow whose serving panicked.
var errPanicked = errors.New("prefixlb internal error (panic) while relaying the response")

// panicStage is where a test makes a request's serving panic (Server.testPanic).
type panicStage uint8

const (
	stageKey    panicStage = iota + 1 // after the key is built, inside buildKey
	stagePick                         // after the policy picked a backend, before the attempt
	stageHead                         // the backend's response head read, before the relay
	stageRelay                        // in the relay, after body bytes reached the client
	stageFinish                       // in finish, before the backend lease is released
)

var panicStageNames = [...]string{stageKey: "key", stagePick: "pick", stageHead: "head", stageRelay: "relay", stageFinish: "finish"}

func (p panicStage) String() string { return panicStageNames[p] }

// testPanicAt runs the test hook at stage (tests only; nil, and one compare, otherwise).
func (s *Server) testPanicAt(stage panicStage) {
	if s.testPanic != nil {
		s.testPanic(stage)
	}
}

// serving is what handle holds of one request until it returns: the body's lease, and the
// flow once taken. The handler owns the flow until finish runs (the flow is then pooled) or
// until it hands the response to fasthttp, which are the last things each path of handle
// does: a panic that reaches endServing finds the flow either not done and still the
// handler's, or done by a finish that contained its own panic.
type serving struct {
	body bodyLease
	f    *flow
	tr   requestTrace // the request's spans until the flow takes them (trace.go)
}

// endServing runs when handle returns or panics. A panic is contained (handlerPanicked)
// before the body's lease is given back, so that the request is released whichever way it
// ended.
func (s *Server) endServing(ctx *fasthttp.RequestCtx, st *serving) {
	if p := recover(); p != nil {
		s.handlerPanicked(ctx, st.f, p)
	}
	st.tr.unserved()
	s.endRequest(ctx, &st.body)
}

// handlerPanicked answers a request whose handler panicked: its flow (if any) is abandoned,
// then the client gets a 500 with an OpenAI-shaped error and the connection is closed after
// it (what the panic left of the request's state on it, an unread body among it, is not
// trusted).
func (s *Server) handlerPanicked(ctx *fasthttp.RequestCtx, f *flow, p any) {
	s.m.handlerPanics.Inc()
	fields := s.panicFields(logHandlerPanic, p)
	if f != nil && !f.done.Load() {
		fields = append(fields, f.requestFields()...)
		f.abandon()
	}
	// An HTTP/1.0 relay (relayClosing) hijacks the connection: it is not run.
	ctx.Hijack(nil)
	ctx.HijackSetNoResponse(false)
	// writeError resets the response, which closes a body stream set on it (finish then
	// finds the flow done). The close lingers: a client still sending its body reads the 500.
	writeError(ctx, fasthttp.StatusInternalServerError, msgInternal)
	closeAfterRefusal(ctx)
	s.log.Error(logHandlerPanic, append(fields, zap.String("in", "handler"))...)
}

// containFinish is finish's deferred recover: what finish had not released yet is released,
// and the flow is not pooled.
func (f *flow) containFinish() {
	if p := recover(); p != nil {
		f.panicked(p, logFinishPanic, "release")
	}
}

// panicked counts, abandons and logs a panic p recovered while f was served; in names where.
func (f *flow) panicked(p any, msg, in string) {
	s := f.s
	s.m.handlerPanics.Inc()
	fields := append(s.panicFields(msg, p), f.requestFields()...)
	f.abandon()
	s.log.Error(msg, append(fields, zap.String("in", in))...)
}

// relayClosingGuard is the deferred recover of relayClosing's hijacked goroutine, for a
// panic outside Read and finish (which contain their own): the flow is abandoned, and
// fasthttp closes the connection when the goroutine ends.
func (f *flow) relayClosingGuard() {
	p := recover()
	if p == nil {
		return
	}
	s := f.s
	s.m.handlerPanics.Inc()
	fields := s.panicFields(logRelayPanic, p)
	if !f.done.Load() {
		fields = append(fields, f.requestFields()...)
		f.abandon()
	}
	s.log.Error(logRelayPanic, append(fields, zap.String("in", "relay"))...)
}

// abandon releases what f holds after a panic stopped its serving, whatever had been
// released already: the watchdog's entry, the backend connection (closed, never pooled: a
// response may be half read on it, and the close makes the engine abort the generation),
// the response's body stream and the backend lease (in-flight count and prefill tokens;
// backend.Lease.Release is idempotent) and the learning ticket (done: a Tracker hears that
// the request ended, as for any failed one; router.Ticket.Done is idempotent). f is marked
// done, so that a later finish (fasthttp's CloseWithError) does nothing, and it is not
// returned to the pool: what a panic left in it is not trusted again.
func (f *flow) abandon() {
	f.done.Store(true)
	f.s.wd.remove(f)
	if c := f.takeConn(); c != nil {
		_ = c.Close()
	}
	if f.body != nil {
		_ = f.resp.CloseBodyStream()
		f.body = nil
	}
	f.lease.Release()
	f.endTicket()
	f.tr.abandoned()
	f.ctx, f.hj = nil, nil
}

// endTicket ends f's ticket for abandon. It runs inside a recovery, where a second panic (a
// Tracker's Finished) would end the process: that one is dropped, the request's own panic
// being the one logged.
func (f *flow) endTicket() {
	defer func() { _ = recover() }()
	f.ticket.Done()
}

// requestFields describes the request f serves, for a panic's log line: its id, method, path,
// backend (the leased one, else the one picked; empty before a pick), attempts and the body
// bytes relayed.
func (f *flow) requestFields() []zap.Field {
	name := ""
	if b := f.lease.Backend(); b != nil {
		name = b.Name
	} else if b := f.dec.Backend; b != nil {
		name = b.Name
	}
	return []zap.Field{zap.Uint64("request_id", f.id), zap.ByteString("method", f.method), zap.ByteString("path", f.path),
		zap.String("backend", name), zap.Int("attempts", f.attempts), zap.Int64("bytes", f.bytes)}
}

// panicFields are the panic's value, where it was raised (panic_site) and, when
// s.panicLog lets the site's stack through, the goroutine's stack, each cut to its bound;
// stacks_suppressed counts the site's stacks left out since its last one (on a full line:
// those before it). place is where the panic was contained (its log message).
func (s *Server) panicFields(place string, p any) []zap.Field {
	v := fmt.Sprint(p)
	if len(v) > maxPanicValue {
		v = v[:maxPanicValue]
	}
	site := panicSite()
	fields := []zap.Field{zap.String("panic", v), zap.String("panic_site", site)}
	full, suppressed := s.panicLog.allow(place + "|" + site)
	if full {
		stack := debug.Stack()
		if len(stack) > maxPanicStack {
			stack = stack[:maxPanicStack]
		}
		fields = append(fields, zap.ByteString("stack", stack))
	}
	if suppressed > 0 {
		fields = append(fields, zap.Int("stacks_suppressed", suppressed))
	}
	return fields
}

// panicSite names the code that raised the panic being recovered: the first frame below the
// runtime's panic machinery (gopanic, sigpanic, panicIndex…), as "function dir/file:line".
func panicSite() string {
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	inRuntime := false
	for {
		fr, more := frames.Next()
		if strings.HasPrefix(fr.Function, "runtime.") {
			inRuntime = true
		} else if inRuntime {
			dir, file := path.Split(fr.File)
			return fmt.Sprintf("%s %s%s:%d", fr.Function, path.Base(dir)+"/", file, fr.Line)
		}
		if !more {
			return "unknown"
		}
	}
}
