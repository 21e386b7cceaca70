// The peer port's inbound streams before they are authenticated. Memberlist sends each
// stream's message as one AES-GCM frame ([type 10][length, 4 bytes big-endian][sealed
// bytes]), which it can authenticate only once the whole frame is read: until then a
// connection is anyone's. Connections that send nothing, or a frame header and then little,
// must not hold what peers need to join: a stream is handed to memberlist only once its
// frame header came (within the handshake timeout), a large frame takes one of the few
// stream slots only then, and its bytes must keep coming at minFrameRate; streams not yet
// authenticated are bounded in all and per source address, the oldest idle one giving way
// to a newcomer. Each stream dropped is counted by reason and logged (at most a line a
// second per reason).

package peering

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
)

const (
	// DefaultHandshakeTimeout is how long an inbound stream may take to send its frame
	// header, and the grace its frame gets beyond minFrameRate: 1 s. A replica writes its
	// whole message at once as soon as it connects, so on a LAN its header arrives within
	// a millisecond; an idle connection holds nothing but a socket for this long.
	DefaultHandshakeTimeout = time.Second
	// minFrameRate is the slowest a first frame may arrive at, after its header, beyond
	// the handshake timeout's grace: 2 MiB/s, so a 64 KiB join push has 31 ms more and a
	// whole snapshot (maxStreamBytes) 8.5 s, longer than memberlist's own push/pull timeout
	// (tcpTimeout) already allows it.
	minFrameRate = 2 << 20
	// smallFrameBytes is the largest frame read without a stream slot: 64 KiB, more than a
	// new replica's join push, a ping or a push/pull without a snapshot. Larger ones (a
	// snapshot exchange) wait for one of maxInboundStreams slots first.
	smallFrameBytes = 64 << 10
	// maxUnauthenticated bounds the inbound streams whose first frame is not yet whole (a
	// goroutine, a socket and at most smallFrameBytes each unless they hold a slot): 256.
	// A newcomer past it closes the oldest one still waiting for its header, or is refused
	// when none is.
	maxUnauthenticated = 256
	// maxUnauthenticatedPerSource is the most of those from one source address: 8, more
	// than one replica opens at once (a join or an exchange, a fallback ping or two). A
	// newcomer past it closes that source's oldest one still waiting for its header, or is
	// refused.
	maxUnauthenticatedPerSource = 8
	// streamEncrypted is memberlist's encryptMsg type (v0.7.0), the first byte of every
	// stream a replica with a secret sends (memberlist sends a label header first only with
	// a Label, which this package never sets).
	streamEncrypted = 10
	// frameHeaderBytes is the type byte and the length.
	frameHeaderBytes = 5
)

// dropReason says why an inbound stream was dropped: the label of
// prefixlb_peer_streams_dropped_total.
type dropReason string

const (
	dropIdle      dropReason = "idle"       // no frame header within the handshake timeout
	dropSlow      dropReason = "slow"       // the first frame slower than minFrameRate
	dropInvalid   dropReason = "invalid"    // not an encrypted frame, or one over maxStreamBytes
	dropPerSource dropReason = "per_source" // over maxUnauthenticatedPerSource
	dropBusy      dropReason = "busy"       // over maxUnauthenticated, or no slot within streamSlotWait
	dropTooLong   dropReason = "too_long"   // the stream past maxStreamBytes
)

// dropReasons are all of them, for the metrics.
var dropReasons = []dropReason{dropIdle, dropSlow, dropInvalid, dropPerSource, dropBusy, dropTooLong}

// dropFunc counts and logs a dropped stream: its reason, the sender's address, and what
// happened in a few words.
type dropFunc func(reason dropReason, from, detail string)

// inbound is one accepted stream, while it is not yet authenticated.
type inbound struct {
	c     net.Conn
	src   netip.Addr
	start time.Time
	// Under the room's lock: idle until its frame header came; gone once it left the room
	// (its frame whole, closed, or evicted: closed by the room for a newcomer).
	idle, gone, evicted bool
}

// newInbound is c, accepted now.
func newInbound(c net.Conn, now time.Time) *inbound {
	var src netip.Addr
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		src = a.AddrPort().Addr().Unmap()
	}
	return &inbound{c: c, src: src, start: now, idle: true}
}

// room holds the streams not yet authenticated: at most limit, perSource from one address.
type room struct {
	limit, perSource int

	mu      sync.Mutex
	n       int
	sources map[netip.Addr]int
	idle    []*inbound // those waiting for their frame header, oldest first
}

func newRoom(limit, perSource int) *room {
	return &room{limit: limit, perSource: perSource, sources: map[netip.Addr]int{}}
}

// enter takes in into the room. When that needs a place, the oldest idle stream of the same
// source (over perSource: reason dropPerSource) or of any (over limit: dropBusy) is evicted,
// returned for the caller to close and count; when none is idle, in is refused (ok false).
func (r *room) enter(in *inbound) (victim *inbound, reason dropReason, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.sources[in.src] >= r.perSource:
		reason = dropPerSource
		for _, v := range r.idle {
			if v.src == in.src {
				victim = v
				break
			}
		}
	case r.n >= r.limit:
		reason = dropBusy
		if len(r.idle) > 0 {
			victim = r.idle[0]
		}
	}
	if reason != "" {
		if victim == nil {
			return nil, reason, false
		}
		victim.evicted = true
		r.remove(victim)
	}
	r.n++
	r.sources[in.src]++
	r.idle = append(r.idle, in)
	return victim, reason, true
}

// headerCame notes that in's frame header came; false when it was evicted meanwhile.
func (r *room) headerCame(in *inbound) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in.gone {
		return false
	}
	r.dropIdle(in)
	return true
}

// leave takes in out of the room, if it is still there.
func (r *room) leave(in *inbound) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !in.gone {
		r.remove(in)
	}
}

// wasEvicted reports whether in was closed by the room for a newcomer.
func (r *room) wasEvicted(in *inbound) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return in.evicted
}

// size is how many streams are in the room and how many of them from src.
func (r *room) size(src netip.Addr) (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.sources[src]
}

func (r *room) remove(in *inbound) {
	in.gone = true
	r.n--
	if r.sources[in.src]--; r.sources[in.src] <= 0 {
		delete(r.sources, in.src)
	}
	r.dropIdle(in)
}

// dropIdle takes in off the idle list.
func (r *room) dropIdle(in *inbound) {
	if !in.idle {
		return
	}
	in.idle = false
	for i, v := range r.idle {
		if v == in {
			r.idle = append(r.idle[:i], r.idle[i+1:]...)
			break
		}
	}
}

// readHeader reads in's frame header within handshake of its start. The error is the
// reason to drop it and the detail, or with reason "" one not to count (the sender closed,
// or the room evicted it, counted by the evictor).
func readHeader(in *inbound, handshake time.Duration, r *room) ([frameHeaderBytes]byte, uint32, dropReason, error) {
	var h [frameHeaderBytes]byte
	_ = in.c.SetReadDeadline(in.start.Add(handshake))
	k, err := io.ReadFull(in.c, h[:])
	switch {
	case err != nil && r.wasEvicted(in):
		return h, 0, "", err
	case errors.Is(err, os.ErrDeadlineExceeded):
		return h, 0, dropIdle, fmt.Errorf("no frame header within %s (%d bytes)", handshake, k)
	case err != nil:
		return h, 0, "", err // the sender closed: a port probe, or a peer that gave up
	case h[0] != streamEncrypted:
		return h, 0, dropInvalid, fmt.Errorf("not an encrypted memberlist frame (first byte %d)", h[0])
	}
	size := uint32(h[1])<<24 | uint32(h[2])<<16 | uint32(h[3])<<8 | uint32(h[4])
	if int64(size) > maxStreamBytes-frameHeaderBytes {
		return h, 0, dropInvalid, fmt.Errorf("a frame of %d bytes, over %d", size, maxStreamBytes-frameHeaderBytes)
	}
	_ = in.c.SetReadDeadline(time.Time{})
	return h, size, "", nil
}

// guardConn is an inbound stream as memberlist reads it: the frame header the guard read
// first, then the connection. Until its first frame is whole (unauthenticated), each read
// has a deadline the bytes so far earned (the handshake timeout from the hand-off, plus
// 1/minFrameRate a byte), or memberlist's when sooner; a read past it ends the stream (io.EOF
// to memberlist: it closes the stream without a line or an error reply of its own; the drop
// is counted here). Then memberlist's deadlines apply. It reads at most maxStreamBytes in
// all, and holds a stream slot, when it took one, until it is closed.
type guardConn struct {
	net.Conn
	t  *limitTransport
	in *inbound

	mu       sync.Mutex
	pre      []byte    // the frame header, not yet read again
	read     int64     // bytes read, the header's included
	frameEnd int64     // the first frame's end: read past it, it is authenticated or refused
	since    time.Time // the hand-off, whence the earned deadline counts
	readDL   time.Time // memberlist's read deadline
	slot     bool      // holds a stream slot
	closed   bool
}

func (c *guardConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.pre) > 0 {
		k := copy(p, c.pre)
		c.pre = c.pre[k:]
		c.read += int64(k)
		c.mu.Unlock()
		return k, nil
	}
	left := maxStreamBytes - c.read
	if left <= 0 {
		c.mu.Unlock()
		c.t.drop(dropTooLong, c.in.c.RemoteAddr().String(), fmt.Sprintf("over %d bytes", maxStreamBytes))
		return 0, errStreamTooLong
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	inFrame := c.read < c.frameEnd
	var ours bool
	if inFrame {
		dl := c.since.Add(c.t.handshake + time.Duration(c.read-frameHeaderBytes)*time.Second/minFrameRate)
		if ours = c.readDL.IsZero() || dl.Before(c.readDL); !ours {
			dl = c.readDL
		}
		_ = c.Conn.SetReadDeadline(dl)
	}
	c.mu.Unlock()
	k, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read += int64(k)
	if !inFrame {
		return k, err
	}
	if c.read >= c.frameEnd {
		c.t.room.leave(c.in)
		_ = c.Conn.SetReadDeadline(c.readDL)
		return k, err
	}
	if ours && errors.Is(err, os.ErrDeadlineExceeded) {
		c.t.room.leave(c.in)
		c.t.drop(dropSlow, c.in.c.RemoteAddr().String(),
			fmt.Sprintf("%d of %d bytes of the first frame in %s", c.read, c.frameEnd, time.Since(c.since).Round(time.Millisecond)))
		return k, io.EOF
	}
	return k, err
}

// SetDeadline sets the write deadline and memberlist's read deadline (Read applies it).
func (c *guardConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *guardConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDL = t
	if c.read >= c.frameEnd {
		return c.Conn.SetReadDeadline(t)
	}
	return nil
}

func (c *guardConn) Close() error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	c.mu.Unlock()
	if first {
		c.t.room.leave(c.in)
		if c.slot {
			<-c.t.slots
		}
	}
	return c.Conn.Close()
}

// dropStream counts a stream the guard dropped (by reason, and as rejected) and logs it, at
// most a line a second per reason.
func (n *Node) dropStream(reason dropReason, from, detail string) {
	if c := n.m.streamsDropped[reason]; c != nil {
		c.Inc()
	}
	n.mlog.emit("peering: inbound stream dropped", "Inbound stream "+string(reason)+": "+detail+" from="+from, true, true)
}
