package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/rawconn"
)

// maxIdleAge is how long an idle upstream connection is kept for reuse. uvicorn (vLLM's and
// SGLang's server) closes idle keep-alive connections after 5 s (timeout_keep_alive), so
// connections idle longer than 4 s are closed here rather than raced against the backend.
const maxIdleAge = 4 * time.Second

// maxIdlePerBackend bounds the idle pool of one backend.
const maxIdlePerBackend = 1024

// connBufferSize is the read and the write buffer of an upstream connection, bytes. A
// response head longer than it grows the read buffer to maxResponseHead (upframe.go).
const connBufferSize = 16 << 10

// tcpKeepAlive is the keep-alive probe period of upstream connections.
const tcpKeepAlive = 30 * time.Second

// uconn is one upstream connection with its buffers.
type uconn struct {
	net.Conn
	raw      syscall.RawConn // the TCP socket under Conn (under TLS too); nil if it has none
	tls      bool            // Conn is a *tls.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	idleFrom time.Time
	body     upBody // the body of the response being read (upframe.go)
	// noReuse: the connection cannot carry another request (a close-delimited body, trailers
	// cut short, a read buffer grown for a long head): put closes it.
	noReuse bool
	fds     *fdBudget // the budget its descriptor came from (nil: none)
	closed  atomic.Bool

	peekFn    func(fd uintptr) // peek bound once at dial, so that silent does not allocate
	peekQuiet bool
	peekBuf   [1]byte
}

// silent reports whether an idle connection is as a finished response left it: nothing
// buffered, and nothing readable on the socket, neither data nor EOF. Bytes there are the
// tail of a misframed response (more than its Content-Length, a body on a HEAD reply, a
// chunk after the last one) or an unsolicited answer; sending another user's request on the
// connection would hand them over as that user's response. One non-blocking recv(MSG_PEEK)
// per reuse, as HAProxy checks a connection before reusing it. Under TLS, plaintext already
// decrypted past the response counts, and so does any readable byte on the socket (it may be
// a record the TLS layer would consume, but a quiet connection has nothing to send).
func (c *uconn) silent() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	if c.tls {
		// Decrypted bytes are in neither br nor the socket. With a deadline already passed, a
		// read returns them or times out without touching the socket.
		_ = c.SetReadDeadline(longAgo)
		_, err := c.br.Peek(1)
		if !isTimeout(err) {
			return false
		}
	}
	if c.raw == nil {
		return true
	}
	c.peekQuiet = false
	return c.raw.Control(c.peekFn) == nil && c.peekQuiet
}

// peek is silent's look at the socket: quiet when a non-blocking peek finds nothing. No error
// is data or EOF (0 bytes); an error other than EAGAIN is a reset.
func (c *uconn) peek(fd uintptr) {
	for {
		_, _, err := syscall.Recvfrom(int(fd), c.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != syscall.EINTR {
			c.peekQuiet = err == syscall.EAGAIN
			return
		}
	}
}

// Close closes the connection, once, and gives its descriptor back to the budget.
func (c *uconn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	err := c.Conn.Close()
	c.fds.giveBackend()
	return err
}

// longAgo is a deadline that has passed.
var longAgo = time.Unix(1, 0)

// writeRequest sends req (its body read in full) on c. A request that fits the write
// buffer goes out in one write; a larger one (a long prompt) as one writev of the header
// and the body, without copying the body: one system call and one wakeup of the backend
// instead of one per buffer. Framing is fasthttp's Request.Write: a Content-Length for a
// body, or for any method other than GET and HEAD.
func (c *uconn) writeRequest(req *fasthttp.Request) error {
	body := req.Body()
	if len(body) != 0 || !(req.Header.IsGet() || req.Header.IsHead()) {
		req.Header.SetContentLength(len(body))
	}
	hdr := req.Header.Header()
	if len(hdr)+len(body) <= c.bw.Available() {
		_, _ = c.bw.Write(hdr)
		_, _ = c.bw.Write(body)
		return c.bw.Flush()
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}
	_, err := rawconn.WriteVector(c.Conn, hdr, body)
	return err
}

// earliest is the earlier of two times.
func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// upstream dials and pools connections to one backend. Connections are handed out one request
// at a time; a connection goes back to the pool only when its response was read to the end.
// fasthttp's HostClient is not used because it cannot be cancelled while it waits for response
// headers (no context, fasthttp #874): here the proxy owns the socket and closes it when the
// client leaves, which makes the engine abort the generation.
type upstream struct {
	b       *backend.Backend
	m       *backendMetrics
	timeout time.Duration // connect timeout
	tls     *tls.Config
	fds     *fdBudget // the data path's descriptors (nil: no budget)

	mu      sync.Mutex
	idle    []*uconn
	removed bool // backend no longer configured: connections close instead of pooling
}

func newUpstream(b *backend.Backend, connectTimeout time.Duration, m *backendMetrics) *upstream {
	u := &upstream{b: b, timeout: connectTimeout, m: m}
	if b.Scheme == "https" {
		host, _, _ := net.SplitHostPort(b.Addr)
		u.tls = &tls.Config{ServerName: host, NextProtos: []string{"http/1.1"}}
	}
	return u
}

// get returns a pooled connection (reused=true) or dials a new one. A pooled connection that
// aged past maxIdleAge or is not silent is closed instead of reused.
func (u *upstream) get(now time.Time) (c *uconn, reused bool, err error) {
	for {
		u.mu.Lock()
		n := len(u.idle)
		if n == 0 {
			u.mu.Unlock()
			break
		}
		c = u.idle[n-1]
		u.idle[n-1] = nil
		u.idle = u.idle[:n-1]
		u.mu.Unlock()
		if now.Sub(c.idleFrom) < maxIdleAge && c.silent() {
			return c, true, nil
		}
		_ = c.Close()
	}
	c, err = u.dial()
	return c, false, err
}

// dial connects to the backend. Its descriptor is taken from the budget first; a budget
// used up, or a local resource that ran out on the way (EMFILE, ENFILE, ENOBUFS, ENOMEM,
// EADDRNOTAVAIL: localKindOf), is a *localError, not the backend's: nothing reached it. Any
// other failure is a *dialError.
func (u *upstream) dial() (*uconn, error) {
	if !u.fds.takeBackend() {
		return nil, &localError{localFDBudget, errFDBudget}
	}
	d := net.Dialer{Timeout: u.timeout, KeepAlive: tcpKeepAlive}
	conn, err := d.Dial("tcp", u.b.Addr)
	if err != nil {
		u.fds.giveBackend()
		if kind, ok := localKindOf(err); ok {
			return nil, &localError{kind, err}
		}
		return nil, &dialError{err}
	}
	uc := &uconn{fds: u.fds}
	uc.peekFn = uc.peek
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		uc.raw, _ = tc.SyscallConn()
		conn = rawconn.Wrap(tc)
	}
	if u.tls != nil {
		tc := tls.Client(conn, u.tls)
		_ = tc.SetDeadline(time.Now().Add(u.timeout))
		if err := tc.Handshake(); err != nil {
			_ = conn.Close()
			u.fds.giveBackend()
			return nil, &dialError{err}
		}
		_ = tc.SetDeadline(time.Time{})
		conn = tc
		uc.tls = true
	}
	uc.Conn, uc.br, uc.bw = conn, bufio.NewReaderSize(conn, connBufferSize), bufio.NewWriterSize(conn, connBufferSize)
	return uc, nil
}

// put returns a connection whose response was fully read. Its deadlines are left as they
// are: whoever takes it from the pool sets new ones before any read or write. A connection
// with bytes buffered past the response (the backend sent more than it framed) is closed:
// those bytes would become the next user's response.
func (u *upstream) put(c *uconn, now time.Time) {
	c.idleFrom = now
	u.mu.Lock()
	if !u.removed && !c.noReuse && len(u.idle) < maxIdlePerBackend && c.br.Buffered() == 0 {
		u.idle = append(u.idle, c)
		c = nil
	}
	u.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// retire closes every pooled connection and stops pooling (backend removed, shutdown);
// requests still in flight finish on their own connections.
func (u *upstream) retire() {
	u.mu.Lock()
	u.removed = true
	u.mu.Unlock()
	u.closeIdle()
}

// closeIdle closes every pooled connection (retire; the descriptor budget reclaiming them).
func (u *upstream) closeIdle() {
	u.mu.Lock()
	idle := u.idle
	u.idle = nil
	u.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
}

// dialError marks a failure to connect: nothing reached the backend, so the request is safe
// to send elsewhere.
type dialError struct{ err error }

// Error is the class only: the cause names the backend's address (dial tcp 10.1.2.3:8000).
func (e *dialError) Error() string   { return errConnect.Error() }
func (e *dialError) Unwrap() []error { return []error{errConnect, e.err} }

// staleConn reports whether err on a reused keep-alive connection means that the backend had
// closed it before reading the request (EOF / reset before any response byte): the request
// is resent on a fresh connection to the same backend, as net/http's Transport does.
func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
