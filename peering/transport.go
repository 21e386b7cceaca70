// The peer port's TCP streams, bounded: memberlist reads a whole push/pull (up to its 20 MiB
// limit) into memory before it can authenticate it, so that unauthenticated connections
// would each hold up to that much. limitTransport caps how many inbound streams memberlist
// handles at once and how many bytes one may send.

package peering

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/hashicorp/memberlist"
)

const (
	// maxInboundStreams is how many inbound peer streams (join push/pulls, TCP fallback
	// pings) memberlist handles at once: 8, enough for a handful of replicas joining
	// together; the memory an unauthenticated sender can make this replica hold is then
	// about 8 × maxStreamBytes (twice that while a buffer grows), not one such buffer per
	// connection.
	maxInboundStreams = 8
	// maxPendingStreams is how many further inbound streams wait for one of those slots
	// (they hold a socket, no buffer); more are closed at once.
	maxPendingStreams = 64
	// streamSlotWait is the longest a stream waits for a slot before it is closed: the
	// push/pull timeout, after which its sender has given up anyway.
	streamSlotWait = tcpTimeout
	// maxStreamBytes is the most bytes read from one inbound stream: a join snapshot
	// (maxSnapshotBytes) plus 1 MiB for memberlist's node states and framing; a stream
	// that sends more is cut (memberlist's own limit is 20 MiB).
	maxStreamBytes = maxSnapshotBytes + 1<<20
)

// errStreamTooLong is what a stream that sent over maxStreamBytes reads.
var errStreamTooLong = errors.New("peering: inbound stream over the size limit")

// limitTransport is the peer port's transport (netTransport) with its inbound streams
// bounded (see the constants above). Streams it refuses or cuts count in rejected. Its
// accept loop ends at Shutdown (inner's StreamCh is never closed).
type limitTransport struct {
	memberlist.Transport
	streams  chan net.Conn
	slots    chan struct{} // a token per stream memberlist handles
	pending  chan struct{} // a token per stream waiting for a slot
	rejected *metrics.Counter
	done     chan struct{}
	stopOnce sync.Once
}

func newLimitTransport(inner memberlist.Transport, rejected *metrics.Counter) *limitTransport {
	t := &limitTransport{Transport: inner, streams: make(chan net.Conn), slots: make(chan struct{}, maxInboundStreams),
		pending: make(chan struct{}, maxPendingStreams), rejected: rejected, done: make(chan struct{})}
	go t.accept()
	return t
}

// accept hands inner's streams on, each once it has a slot, until Shutdown.
func (t *limitTransport) accept() {
	in := t.Transport.StreamCh()
	for {
		var c net.Conn
		select {
		case c = <-in:
		case <-t.done:
			return
		}
		select {
		case t.pending <- struct{}{}:
		default:
			t.rejected.Inc()
			_ = c.Close()
			continue
		}
		go t.admit(c)
	}
}

// admit waits up to streamSlotWait for a slot, then hands c on (or closes it).
func (t *limitTransport) admit(c net.Conn) {
	defer func() { <-t.pending }()
	timer := time.NewTimer(streamSlotWait)
	defer timer.Stop()
	select {
	case t.slots <- struct{}{}:
	case <-timer.C:
		t.rejected.Inc()
		_ = c.Close()
		return
	case <-t.done:
		_ = c.Close()
		return
	}
	lc := &limitConn{Conn: c, left: maxStreamBytes, t: t}
	select {
	case t.streams <- lc:
	case <-t.done:
		_ = lc.Close()
	}
}

func (t *limitTransport) StreamCh() <-chan net.Conn { return t.streams }

// SetDirect passes h on to the inner transport; false when it has no direct path.
func (t *limitTransport) SetDirect(h directHandler) bool {
	d, ok := t.Transport.(directPath)
	return ok && d.SetDirect(h)
}

func (t *limitTransport) Shutdown() error {
	t.stopOnce.Do(func() { close(t.done) })
	return t.Transport.Shutdown()
}

// limitConn is an inbound stream holding a slot until it is closed, readable for at most
// left more bytes.
type limitConn struct {
	net.Conn
	mu     sync.Mutex
	left   int64
	t      *limitTransport
	closed bool
}

func (c *limitConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	left := c.left
	c.mu.Unlock()
	if left <= 0 {
		c.t.rejected.Inc()
		return 0, errStreamTooLong
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.left -= int64(n)
	c.mu.Unlock()
	return n, err
}

func (c *limitConn) Close() error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	c.mu.Unlock()
	if first {
		<-c.t.slots
	}
	return c.Conn.Close()
}
