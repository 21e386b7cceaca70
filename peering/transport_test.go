package peering

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// notYet is how long a test watches for a stream that must not be handed on yet.
const notYet = 300 * time.Millisecond

// shortHandshake is the guard's handshake timeout in these tests.
const shortHandshake = 200 * time.Millisecond

// drops records the streams a limitTransport dropped.
type drops struct {
	mu sync.Mutex
	by map[dropReason]int
}

func (d *drops) drop(r dropReason, from, detail string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.by == nil {
		d.by = map[dropReason]int{}
	}
	d.by[r]++
}

func (d *drops) count(r dropReason) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.by[r]
}

func (d *drops) total() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, k := range d.by {
		n += k
	}
	return n
}

// limitOnNet wraps a real netTransport on an ephemeral 127.0.0.1 port, with handshake as
// its handshake timeout.
func limitOnNet(t *testing.T, handshake time.Duration) (*limitTransport, string, *drops) {
	t.Helper()
	nt := onLoopback(t, 0, quietLog)
	d := &drops{}
	lt := newLimitTransport(nt, handshake, d.drop)
	t.Cleanup(func() { _ = lt.Shutdown() })
	return lt, nt.addr(), d
}

// dialFrom connects to addr from the loopback address src, closed at the test's end.
func dialFrom(t *testing.T, src netip.Addr, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: wait}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedWithin reports whether the port closed c within limit (a read ends other than by
// its deadline).
func closedWithin(c net.Conn, limit time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	_, err := io.Copy(io.Discard, c)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestGuardHandsOnWholeStream: a stream that sends a frame is handed on with every byte in
// order (its header read again first), and once its first frame is whole no longer counts as
// unauthenticated nor has the guard's deadline: it may then pause past the handshake timeout.
func TestGuardHandsOnWholeStream(t *testing.T) {
	lt, addr, d := limitOnNet(t, shortHandshake)
	src := loopbackSources(1)[0]
	c := dialFrom(t, src, addr)
	body := payload(3000, 7)
	msg := append(frameHeader(uint32(len(body))), body...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	s := testutil.RecvWithin(t, lt.StreamCh(), wait, "the stream handed on")
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(wait))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes (%v), not what was sent", len(got), err)
	}
	if n, from := lt.room.size(src); n != 0 || from != 0 {
		t.Fatalf("a whole frame still unauthenticated: %d in the room, %d from its source", n, from)
	}
	time.Sleep(3 * shortHandshake) // what is tested: a pause past the guard's deadline
	more := []byte("after a pause")
	if _, err := c.Write(more); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, len(more))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, more) {
		t.Fatalf("after a pause: %q, %v", got, err)
	}
	if d.total() != 0 {
		t.Fatalf("dropped: %v", d.by)
	}
}

// TestGuardDrops: streams that send nothing, something other than an encrypted frame, or a
// frame header and then too little are closed (those past their header as io.EOF to the
// reader) and counted by reason; nothing of them stays in the room.
func TestGuardDrops(t *testing.T) {
	for _, tc := range []struct {
		name     string
		send     []byte
		handedOn bool
		reason   dropReason
	}{
		{"idle", nil, false, dropIdle},
		{"part of a header", []byte{streamEncrypted, 0}, false, dropIdle},
		{"not encrypted", []byte("GET / HTTP/1.1\r\n\r\n"), false, dropInvalid},
		{"oversized frame", frameHeader(maxStreamBytes), false, dropInvalid},
		{"header then nothing", frameHeader(1000), true, dropSlow},
		{"header and a part", append(frameHeader(1000), payload(100, 1)...), true, dropSlow},
		{"large header then nothing", frameHeader(1 << 20), true, dropSlow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lt, addr, d := limitOnNet(t, shortHandshake)
			src := loopbackSources(1)[0]
			c := dialFrom(t, src, addr)
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			if tc.handedOn {
				s := testutil.RecvWithin(t, lt.StreamCh(), wait, "the stream handed on")
				_ = s.SetDeadline(time.Now().Add(wait))
				n, err := io.Copy(io.Discard, s)
				_ = s.Close()
				if err != nil || n != int64(len(tc.send)) {
					t.Fatalf("read %d bytes, %v; want the %d sent, then io.EOF", n, err, len(tc.send))
				}
			}
			testutil.Eventually(t, wait, "counted as "+string(tc.reason), func() bool { return d.count(tc.reason) == 1 })
			if !closedWithin(c, wait) {
				t.Fatal("the connection was not closed")
			}
			if n, _ := lt.room.size(src); n != 0 || d.total() != 1 {
				t.Fatalf("%d left in the room, drops %v", n, d.by)
			}
		})
	}
}

// TestGuardPerSource: one source holds at most maxUnauthenticatedPerSource unauthenticated
// streams: a newcomer closes its oldest idle one, or is refused when none of them is idle;
// other sources are not affected.
func TestGuardPerSource(t *testing.T) {
	lt, addr, d := limitOnNet(t, wait) // idle streams wait for the test
	srcs := loopbackSources(2)
	var conns []net.Conn
	for range maxUnauthenticatedPerSource {
		conns = append(conns, dialFrom(t, srcs[0], addr))
	}
	testutil.Eventually(t, wait, "the source's share taken", func() bool { _, k := lt.room.size(srcs[0]); return k == maxUnauthenticatedPerSource })
	other := dialFrom(t, srcs[1], addr)
	late := dialFrom(t, srcs[0], addr)
	if !closedWithin(conns[0], wait) {
		t.Fatal("the source's oldest idle stream not closed for its newcomer")
	}
	testutil.Eventually(t, wait, "the eviction counted", func() bool { return d.count(dropPerSource) == 1 })
	for _, c := range append(conns[1:], other, late) {
		if closedWithin(c, 10*time.Millisecond) {
			t.Fatal("another stream closed")
		}
	}
	// Every stream of the source past its header (handed on, its frame not whole): a
	// newcomer is refused.
	for _, c := range append(conns[1:], late) {
		if _, err := c.Write(frameHeader(1000)); err != nil {
			t.Fatal(err)
		}
	}
	for range maxUnauthenticatedPerSource {
		s := testutil.RecvWithin(t, lt.StreamCh(), wait, "a stream handed on")
		t.Cleanup(func() { _ = s.Close() })
	}
	refused := dialFrom(t, srcs[0], addr)
	if !closedWithin(refused, wait) {
		t.Fatal("a newcomer over the source's share not refused")
	}
	testutil.Eventually(t, wait, "the refusal counted", func() bool { return d.count(dropPerSource) == 2 })
	if closedWithin(other, 10*time.Millisecond) {
		t.Fatal("another source's stream closed")
	}
}

// TestGuardRoomFull: past maxUnauthenticated a newcomer closes the oldest idle stream of
// any source (counted busy).
func TestGuardRoomFull(t *testing.T) {
	lt, addr, d := limitOnNet(t, wait)
	lt.room.mu.Lock()
	lt.room.limit = 4
	lt.room.mu.Unlock()
	srcs := loopbackSources(5)
	var conns []net.Conn
	for i := range 4 {
		conns = append(conns, dialFrom(t, srcs[i], addr))
		testutil.Eventually(t, wait, "in the room", func() bool { n, _ := lt.room.size(srcs[i]); return n == i+1 })
	}
	dialFrom(t, srcs[4], addr)
	if !closedWithin(conns[0], wait) {
		t.Fatal("the oldest idle stream not closed for a newcomer")
	}
	testutil.Eventually(t, wait, "counted busy", func() bool { return d.count(dropBusy) == 1 })
	if n, _ := lt.room.size(srcs[0]); n != 4 {
		t.Fatalf("%d in the room, want 4", n)
	}
}

// TestLimitTransportSlots: at most maxInboundStreams streams with a large frame are handed
// on at once; closing one admits a waiting one; small frames need no slot.
func TestLimitTransportSlots(t *testing.T) {
	lt, addr, d := limitOnNet(t, wait)
	srcs := loopbackSources(4)
	var got []net.Conn
	defer func() {
		for _, c := range got {
			_ = c.Close()
		}
	}()
	for i := range maxInboundStreams + 1 {
		c := dialFrom(t, srcs[i%2], addr)
		if _, err := c.Write(frameHeader(smallFrameBytes + 1)); err != nil {
			t.Fatal(err)
		}
	}
	for range maxInboundStreams {
		got = append(got, testutil.RecvWithin(t, lt.StreamCh(), wait, "a large stream handed on"))
	}
	select {
	case <-lt.StreamCh():
		t.Fatalf("a large stream beyond %d handed on", maxInboundStreams)
	case <-time.After(notYet):
	}
	for i := range 2 * maxUnauthenticatedPerSource {
		c := dialFrom(t, srcs[2+i%2], addr)
		if _, err := c.Write(frameHeader(smallFrameBytes)); err != nil {
			t.Fatal(err)
		}
		got = append(got, testutil.RecvWithin(t, lt.StreamCh(), wait, "a small stream handed on"))
	}
	_ = got[0].Close()
	got = append(got, testutil.RecvWithin(t, lt.StreamCh(), wait, "the waiting large stream admitted once one closed"))
	if d.total() != 0 {
		t.Fatalf("dropped: %v", d.by)
	}
}

// TestLimitTransportBytes: one inbound stream reads at most maxStreamBytes.
func TestLimitTransportBytes(t *testing.T) {
	lt, addr, d := limitOnNet(t, 0)
	c := dialFrom(t, loopbackSources(1)[0], addr)
	go func() {
		if _, err := c.Write(frameHeader(maxStreamBytes - frameHeaderBytes)); err != nil {
			return
		}
		buf := make([]byte, 1<<20)
		for sent := 0; sent <= maxStreamBytes; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	s := testutil.RecvWithin(t, lt.StreamCh(), wait, "the stream handed on")
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(wait))
	n, err := io.Copy(io.Discard, s)
	if !errors.Is(err, errStreamTooLong) || n != maxStreamBytes {
		t.Fatalf("read %d bytes, err %v; want %d and errStreamTooLong", n, err, maxStreamBytes)
	}
	if d.count(dropTooLong) != 1 || d.total() != 1 {
		t.Fatalf("dropped %v, want one too_long", d.by)
	}
}
