package proxy

import (
	"bytes"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prefixlb/prefixlb/internal/rawconn"
)

// retryListener keeps accepting through temporary errors. Out of file descriptors (EMFILE,
// ENFILE), socket memory and aborted handshakes are retried with a backoff of 5 ms doubling to
// 1 s, as net/http's Server does; fasthttp would otherwise stop serving and the process would
// exit, cutting every in-flight stream. A resource that ran out is reported (counted, and
// logged at most once per localLogEvery: localResources), never logged per retry.
//
// On the data port, each connection takes a descriptor of the data path's budget (fdBudget)
// before it is accepted, and is wrapped by rawconn, then by clientConn, which gives the
// descriptor back when it closes. A connection over the clients' share is accepted into the
// overflow and answered 503 (Server.overflowed); with the overflow full too, Accept waits
// for a descriptor to come back and the connections wait in the listen backlog. The admin
// port's listener (admin set) has no budget: it lives in the reserve the budget leaves, so it
// stays reachable while the data path is at its limit; its connections are not wrapped.
type retryListener struct {
	net.Listener
	local  *localResources
	fds    *fdBudget // nil: no budget
	where  string    // "accept" or "admin accept", for the log
	admin  bool
	closed atomic.Bool
}

// acceptWaitPoll bounds one wait of Accept for a descriptor to come back, so that a Close
// meanwhile is seen.
const acceptWaitPoll = 100 * time.Millisecond

func (l *retryListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		adm := l.fds.takeClient()
		if adm == admitWait {
			if l.closed.Load() {
				return nil, net.ErrClosed
			}
			l.fds.waitFreed(acceptWaitPoll)
			continue
		}
		c, err := l.Listener.Accept()
		if err == nil {
			if l.admin {
				return c, nil
			}
			return &clientConn{Conn: rawconn.Wrap(c), fds: l.fds, adm: adm}, nil
		}
		l.fds.giveClient(adm)
		if !temporaryAccept(err) {
			return nil, err
		}
		if kind, ok := localKindOf(err); ok && l.local != nil {
			l.local.report(kind, l.where, err)
		}
		if delay == 0 {
			delay = 5 * time.Millisecond
		} else {
			delay = min(2*delay, time.Second)
		}
		time.Sleep(delay)
	}
}

// Close closes the listener and ends an Accept waiting for a descriptor.
func (l *retryListener) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

func temporaryAccept(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// AdminListener wraps the admin port's listener: temporary accept errors (out of file
// descriptors) are retried with backoff, counted and logged at most once per localLogEvery
// (net/http's Server would log "http: Accept error" on each), and its connections live in
// the descriptors the data path leaves in reserve. Pass the result to ServeAdmin.
func (s *Server) AdminListener(ln net.Listener) net.Listener {
	return &retryListener{Listener: ln, local: s.local, where: "admin accept", admin: true}
}

// errH2Preface is returned by a client connection's Read when the connection opens with the
// HTTP/2 connection preface (h2c with prior knowledge): fasthttp would refuse its request
// target "*" with a 400; the client gets 505, as for any HTTP version but 1.0 and 1.1.
var errH2Preface = errors.New("HTTP/2 connection preface on an HTTP/1 port")

// h2Preface is the request line of the HTTP/2 connection preface (RFC 9113 §3.4).
const h2Preface = "PRI * HTTP/2.0\r\n"

// errBareLF is returned by a client connection's Read when the request header it is
// reading ended its lines in bare LF: fasthttp waits for a CRLF CRLF that such a client
// never sends, so the read fails at once and the client gets 400 instead of a hang until
// timeouts.client_read.
var errBareLF = errors.New("request header block ends in bare LF")

// lingerTime bounds how long a connection closed right after refusing a request body
// (413, 503) keeps reading and discarding what the client still sends: closing a socket
// with unread bytes sends a reset, which can destroy the refusal in the client's receive
// buffer before the client reads it (nginx's lingering close).
const lingerTime = 3 * time.Second

// lingerBufSize is the discard buffer of a lingering close.
const lingerBufSize = 16 << 10

// clientConn is one client connection as fasthttp sees it. It adds two things to the socket:
//
//   - between requests it watches the bytes of the request header being read (lfScan), and
//     fails the read that would wait for a terminator that a bare-LF client never sends;
//   - after a refused body (lingerOnClose) its Close sends FIN and discards what the client
//     still sends for up to lingerTime before closing, so the refusal reaches the client.
//
// Read, beginRequest and endRequest run on the connection's serving goroutine only.
type clientConn struct {
	net.Conn
	inRequest bool // handle is running: the bytes read are a body, not a header
	lf        lfScan
	pri       int // bytes of h2Preface the connection opened with so far; past it: not a preface
	linger    atomic.Bool
	closed    atomic.Bool
	fds       *fdBudget // the budget its descriptor came from (nil: none)
	adm       admission // what the budget admitted it as (admitOverflow: answered 503)
}

// Read reads from the socket; while a request header is being read it fails with errBareLF
// instead of waiting when the header read so far ends in a bare-LF blank line.
func (c *clientConn) Read(p []byte) (int, error) {
	if c.inRequest {
		return c.Conn.Read(p)
	}
	if c.lf.bare {
		return 0, errBareLF
	}
	n, err := c.Conn.Read(p)
	if c.pri < len(h2Preface) && n > 0 && c.preface(p[:n]) {
		return 0, errH2Preface
	}
	if n > 0 {
		c.lf.scan(p[:n])
	}
	return n, err
}

// preface follows the first bytes of the connection and reports whether they complete the
// request line of the HTTP/2 preface (the read that completes it is withheld from fasthttp,
// which would answer it as a malformed HTTP/1 request).
func (c *clientConn) preface(p []byte) bool {
	k := min(len(p), len(h2Preface)-c.pri)
	if string(p[:k]) != h2Preface[c.pri:c.pri+k] {
		c.pri = len(h2Preface) + 1
		return false
	}
	c.pri += k
	return c.pri == len(h2Preface)
}

// overflow reports whether the connection was accepted over the data path's descriptor
// budget, to be answered 503.
func (c *clientConn) overflow() bool { return c.adm == admitOverflow }

// beginRequest marks the start of a request's handler: what is read from now on is body.
func (c *clientConn) beginRequest() { c.inRequest = true }

// endRequest marks the end of a request's handler: the next bytes read start a new header.
// (A bare-LF request pipelined behind another and already buffered by fasthttp is not
// seen; it waits for client_read as before.)
func (c *clientConn) endRequest() {
	c.inRequest = false
	c.lf = lfScan{}
}

// headerRead reports whether the request header being read is complete (its CRLF CRLF was
// read): a read that fails now is one of the body's. (A header pipelined behind another and
// buffered by fasthttp is not seen: false.)
func (c *clientConn) headerRead() bool { return c.lf.done }

// lingerOnClose makes Close a lingering close (see lingerTime).
func (c *clientConn) lingerOnClose() { c.linger.Store(true) }

// Close closes the connection, once, and gives its descriptor back to the budget; after
// lingerOnClose it first shuts the sending side down and drains the client's bytes in the
// background for up to lingerTime.
func (c *clientConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	if !c.linger.CompareAndSwap(true, false) {
		return c.closeNow()
	}
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return c.closeNow()
	}
	go func() {
		_ = c.Conn.SetReadDeadline(time.Now().Add(lingerTime))
		buf := make([]byte, lingerBufSize)
		for {
			if _, err := c.Conn.Read(buf); err != nil {
				break
			}
		}
		_ = c.closeNow()
	}()
	return nil
}

// closeNow closes the socket and gives its descriptor back.
func (c *clientConn) closeNow() error {
	err := c.Conn.Close()
	c.fds.giveClient(c.adm)
	return err
}

// NetConn returns the socket under the wrapper (the watchdog polls it).
func (c *clientConn) NetConn() net.Conn { return c.Conn }

// SyscallConn returns the socket's raw connection.
func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

// lfScan follows the bytes of one request header as they are read and reports whether the
// block so far ends in a bare-LF blank line ("\n\n", or "\n\r\n" after a line ended in bare
// LF) with no CRLF CRLF: fasthttp accepts bare-LF lines only in a block that CRLF CRLF
// terminates, and otherwise waits for one. Blank lines before the request line are ignored
// (RFC 9112 §2.2 lets a client send CRLF after a body). Once CRLF CRLF is seen the rest
// (body bytes) is not looked at.
type lfScan struct {
	started bool    // a byte other than CR or LF arrived: the request line began
	done    bool    // CRLF CRLF seen: the block is terminated
	bare    bool    // a bare-LF blank line seen and no CRLF CRLF
	tail    [3]byte // the last three bytes scanned, most recent last
}

func (s *lfScan) scan(p []byte) {
	if s.done {
		return
	}
	if !s.started {
		i := 0
		for i < len(p) && (p[i] == '\r' || p[i] == '\n') {
			i++
		}
		if i == len(p) {
			return
		}
		s.started = true
		p = p[i:]
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.push(p)
			return
		}
		b1, b2, b3 := s.before(p, i, 1), s.before(p, i, 2), s.before(p, i, 3)
		switch {
		case b1 == '\n':
			s.bare = true
		case b1 == '\r' && b2 == '\n' && b3 == '\r':
			s.done, s.bare = true, false
			return
		case b1 == '\r' && b2 == '\n':
			s.bare = true
		}
		s.push(p[:i+1])
		p = p[i+1:]
	}
}

// before returns the byte k places before p[i], from p or from the bytes scanned earlier.
func (s *lfScan) before(p []byte, i, k int) byte {
	if i-k >= 0 {
		return p[i-k]
	}
	return s.tail[len(s.tail)+i-k]
}

// push records the last bytes of p as the tail.
func (s *lfScan) push(p []byte) {
	if len(p) >= len(s.tail) {
		copy(s.tail[:], p[len(p)-len(s.tail):])
		return
	}
	n := copy(s.tail[:], s.tail[len(p):])
	copy(s.tail[n:], p)
}
