package peering

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// notYet is how long a test watches for a stream that must not be handed on yet.
const notYet = 300 * time.Millisecond

// limitOnNet wraps a real netTransport on an ephemeral 127.0.0.1 port.
func limitOnNet(t *testing.T) (*limitTransport, string, *metrics.Counter) {
	t.Helper()
	nt := onLoopback(t, 0, quietLog)
	rej := metrics.NewSet().NewCounter("rejected")
	lt := newLimitTransport(nt, rej)
	t.Cleanup(func() { _ = lt.Shutdown() })
	return lt, nt.addr(), rej
}

// TestLimitTransportStreams: at most maxInboundStreams inbound streams are handed to
// memberlist at once; closing one admits a waiting one; streams beyond the waiting room are
// closed and counted.
func TestLimitTransportStreams(t *testing.T) {
	lt, addr, rej := limitOnNet(t)
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	dial := func(k int) {
		for range k {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
		}
	}
	dial(maxInboundStreams + 1)
	var got []net.Conn
	defer func() {
		for _, c := range got {
			_ = c.Close()
		}
	}()
	for range maxInboundStreams {
		got = append(got, testutil.RecvWithin(t, lt.StreamCh(), wait, "a stream handed on"))
	}
	select {
	case <-lt.StreamCh():
		t.Fatalf("a stream beyond %d handed on", maxInboundStreams)
	case <-time.After(notYet):
	}
	_ = got[0].Close()
	testutil.RecvWithin(t, lt.StreamCh(), wait, "the waiting stream admitted once one closed")
	dial(maxPendingStreams + 1)
	testutil.Eventually(t, wait, "a stream over the waiting room refused", func() bool { return rej.Get() >= 1 })
}

// TestLimitTransportBytes: one inbound stream reads at most maxStreamBytes.
func TestLimitTransportBytes(t *testing.T) {
	lt, addr, rej := limitOnNet(t)
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
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
	if rej.Get() != 1 {
		t.Fatalf("rejected %d, want 1", rej.Get())
	}
}
