package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
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

// uconn is one upstream connection with its buffers.
type uconn struct {
	net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	idleFrom time.Time
}

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

// get returns a pooled connection (reused=true) or dials a new one.
func (u *upstream) get(now time.Time) (c *uconn, reused bool, err error) {
	u.mu.Lock()
	for len(u.idle) > 0 {
		c = u.idle[len(u.idle)-1]
		u.idle[len(u.idle)-1] = nil
		u.idle = u.idle[:len(u.idle)-1]
		if now.Sub(c.idleFrom) < maxIdleAge {
			u.mu.Unlock()
			return c, true, nil
		}
		_ = c.Close()
	}
	u.mu.Unlock()
	c, err = u.dial()
	return c, false, err
}

func (u *upstream) dial() (*uconn, error) {
	d := net.Dialer{Timeout: u.timeout, KeepAlive: 30 * time.Second}
	conn, err := d.Dial("tcp", u.b.Addr)
	if err != nil {
		return nil, &dialError{err}
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		conn = rawconn.Wrap(tc)
	}
	if u.tls != nil {
		tc := tls.Client(conn, u.tls)
		_ = tc.SetDeadline(time.Now().Add(u.timeout))
		if err := tc.Handshake(); err != nil {
			_ = conn.Close()
			return nil, &dialError{err}
		}
		_ = tc.SetDeadline(time.Time{})
		conn = tc
	}
	return &uconn{Conn: conn, br: bufio.NewReaderSize(conn, 16<<10), bw: bufio.NewWriterSize(conn, 16<<10)}, nil
}

// put returns a connection whose response was fully read. Its deadlines are left as they
// are: whoever takes it from the pool sets new ones before any read or write.
func (u *upstream) put(c *uconn, now time.Time) {
	c.idleFrom = now
	u.mu.Lock()
	if !u.removed && len(u.idle) < maxIdlePerBackend {
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

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// staleConn reports whether err on a reused keep-alive connection means that the backend had
// closed it before reading the request (EOF / reset before any response byte): the request
// is resent on a fresh connection to the same backend, as net/http's Transport does.
func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
