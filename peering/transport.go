// The peer port's TCP streams, bounded: memberlist reads a whole push/pull (up to its 20 MiB
// limit) into memory before it can authenticate it, so that unauthenticated connections
// would each hold up to that much, and connections that send nothing would each hold a
// goroutine for memberlist's whole push/pull timeout. limitTransport hands memberlist only
// the streams whose frame header came in time (guard.go), caps how many read a large frame
// at once, and how many bytes one may send.

package peering

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

const (
	// maxInboundStreams is how many inbound peer streams with a frame over smallFrameBytes
	// (a snapshot exchange) memberlist reads at once: 8, enough for a handful of replicas
	// exchanging together; the memory an unauthenticated sender can make this replica hold
	// is then about 8 × maxStreamBytes (twice that while a buffer grows), plus the small
	// frames (maxUnauthenticated × smallFrameBytes), not one such buffer per connection.
	maxInboundStreams = 8
	// streamSlotWait is the longest a large frame's stream waits for a slot before it is
	// closed: the push/pull timeout, after which its sender has given up anyway.
	streamSlotWait = tcpTimeout
	// maxStreamBytes is the most bytes read from one inbound stream: a join snapshot
	// (maxSnapshotBytes) plus 1 MiB for memberlist's node states and framing; a stream
	// that sends more is cut (memberlist's own limit is 20 MiB).
	maxStreamBytes = maxSnapshotBytes + 1<<20
)

// errStreamTooLong is what a stream that sent over maxStreamBytes reads.
var errStreamTooLong = errors.New("peering: inbound stream over the size limit")

// limitTransport is the peer port's transport (netTransport) with its inbound streams
// guarded and bounded (see the constants above and guard.go). Each stream it drops goes to
// drop. Its accept loop ends at Shutdown (inner's StreamCh is never closed).
type limitTransport struct {
	memberlist.Transport
	handshake time.Duration // DefaultHandshakeTimeout unless Options say
	drop      dropFunc
	room      *room
	streams   chan net.Conn
	slots     chan struct{} // a token per large-frame stream memberlist reads
	done      chan struct{}
	stopOnce  sync.Once
	accepted  chan struct{}  // closed when the accept loop has ended
	wg        sync.WaitGroup // the admits
}

// newLimitTransport guards inner's inbound streams: handshake bounds the wait for a frame
// header (<= 0: DefaultHandshakeTimeout); drop is told of each stream dropped.
func newLimitTransport(inner memberlist.Transport, handshake time.Duration, drop dropFunc) *limitTransport {
	if handshake <= 0 {
		handshake = DefaultHandshakeTimeout
	}
	t := &limitTransport{Transport: inner, handshake: handshake, drop: drop,
		room: newRoom(maxUnauthenticated, maxUnauthenticatedPerSource), streams: make(chan net.Conn),
		slots: make(chan struct{}, maxInboundStreams), done: make(chan struct{}), accepted: make(chan struct{})}
	go t.accept()
	return t
}

// accept takes inner's streams into the room (evicting an idle one for each, or refusing
// them) and has each admitted, until Shutdown.
func (t *limitTransport) accept() {
	defer close(t.accepted)
	in := t.Transport.StreamCh()
	for {
		var c net.Conn
		select {
		case c = <-in:
		case <-t.done:
			return
		}
		s := newInbound(c, time.Now())
		victim, reason, ok := t.room.enter(s)
		if !ok {
			_ = c.Close()
			t.drop(reason, c.RemoteAddr().String(), t.refusal(reason))
			continue
		}
		if victim != nil {
			_ = victim.c.Close()
			t.drop(reason, victim.c.RemoteAddr().String(),
				fmt.Sprintf("closed idle after %s for a newcomer (%s)", time.Since(victim.start).Round(time.Millisecond), t.refusal(reason)))
		}
		t.wg.Add(1)
		go t.admit(s)
	}
}

// refusal says what limit a stream met.
func (t *limitTransport) refusal(r dropReason) string {
	if r == dropPerSource {
		return fmt.Sprintf("over %d unauthenticated streams from one address", t.room.perSource)
	}
	return fmt.Sprintf("over %d unauthenticated streams", t.room.limit)
}

// admit reads s's frame header, waits up to streamSlotWait for a slot when the frame is
// large, and hands s on to memberlist; else it closes s.
func (t *limitTransport) admit(s *inbound) {
	defer t.wg.Done()
	fail := func(reason dropReason, detail string) {
		t.room.leave(s)
		_ = s.c.Close()
		if reason != "" {
			t.drop(reason, s.c.RemoteAddr().String(), detail)
		}
	}
	h, size, reason, err := readHeader(s, t.handshake, t.room)
	if err != nil {
		fail(reason, err.Error())
		return
	}
	if !t.room.headerCame(s) {
		_ = s.c.Close() // evicted as it came
		return
	}
	gc := &guardConn{Conn: s.c, t: t, in: s, pre: h[:], frameEnd: frameHeaderBytes + int64(size)}
	if size > smallFrameBytes {
		timer := time.NewTimer(streamSlotWait)
		defer timer.Stop()
		select {
		case t.slots <- struct{}{}:
			gc.slot = true
		case <-timer.C:
			fail(dropBusy, fmt.Sprintf("no stream slot for a %d-byte frame within %s", size, streamSlotWait))
			return
		case <-t.done:
			fail("", "")
			return
		}
	}
	gc.since = time.Now()
	select {
	case t.streams <- gc:
	case <-t.done:
		_ = gc.Close()
	}
}

func (t *limitTransport) StreamCh() <-chan net.Conn { return t.streams }

// SetDirect passes h on to the inner transport; false when it has no direct path.
func (t *limitTransport) SetDirect(h directHandler) bool {
	d, ok := t.Transport.(directPath)
	return ok && d.SetDirect(h)
}

// Shutdown closes the inner transport and the streams not yet handed on, and returns once
// the loops have ended.
func (t *limitTransport) Shutdown() error {
	t.stopOnce.Do(func() { close(t.done) })
	err := t.Transport.Shutdown()
	<-t.accepted
	t.closeWaiting()
	t.wg.Wait()
	return err
}

// closeWaiting closes the streams still waiting for their frame header.
func (t *limitTransport) closeWaiting() {
	t.room.mu.Lock()
	idle := append([]*inbound(nil), t.room.idle...)
	t.room.mu.Unlock()
	for _, s := range idle {
		_ = s.c.Close()
	}
}
