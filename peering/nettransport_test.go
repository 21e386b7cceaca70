package peering

import (
	"bytes"
	"errors"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/hashicorp/memberlist"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// quietLog discards a transport's lines.
var quietLog = log.New(io.Discard, "", 0)

// onLoopback is a netTransport on an ephemeral 127.0.0.1 port, shut down at the test's end.
func onLoopback(t testing.TB, maxPacket int, lg *log.Logger) *netTransport {
	t.Helper()
	nt, err := newNetTransport("127.0.0.1", 0, maxPacket, lg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nt.Shutdown() })
	return nt
}

func (t *netTransport) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(t.port)) }

// udpSender is a plain UDP socket on 127.0.0.1, closed at the test's end.
func udpSender(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// payload is n bytes that differ with seed.
func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestNetTransportPackets: packets of every size up to IPv4's largest arrive whole, with
// exactly their length, the sender's address and a receive time; a packet kept is not
// overwritten by the next one (each is a copy, not the scratch); WriteTo reaches another
// transport and names this one as the sender.
func TestNetTransportPackets(t *testing.T) {
	recv := onLoopback(t, 0, quietLog)
	send := udpSender(t)
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: recv.port}
	const ipv4MaxUDP = 65507
	for _, size := range []int{1, 35, udpBufferSize, 9000, ipv4MaxUDP} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			first, second := payload(size, 1), payload(size, 2)
			before := time.Now()
			for _, p := range [][]byte{first, second} {
				if _, err := send.WriteToUDP(p, to); err != nil {
					t.Fatal(err)
				}
			}
			a := testutil.RecvWithin(t, recv.PacketCh(), wait, "the first packet")
			b := testutil.RecvWithin(t, recv.PacketCh(), wait, "the second packet")
			for i, c := range []struct {
				got  *memberlist.Packet
				want []byte
			}{{a, first}, {b, second}} {
				if !bytes.Equal(c.got.Buf, c.want) || cap(c.got.Buf) != size {
					t.Fatalf("packet %d: %d bytes (cap %d), equal %v; want the %d sent", i, len(c.got.Buf), cap(c.got.Buf), bytes.Equal(c.got.Buf, c.want), size)
				}
				if c.got.From.String() != send.LocalAddr().String() {
					t.Fatalf("packet %d from %s, want %s", i, c.got.From, send.LocalAddr())
				}
				if c.got.Timestamp.Before(before) || c.got.Timestamp.After(time.Now()) {
					t.Fatalf("packet %d: timestamp %v outside the send..receive window", i, c.got.Timestamp)
				}
			}
		})
	}
	t.Run("WriteTo", func(t *testing.T) {
		other := onLoopback(t, 0, quietLog)
		msg := payload(udpBufferSize, 3)
		if _, err := other.WriteTo(msg, recv.addr()); err != nil {
			t.Fatal(err)
		}
		p := testutil.RecvWithin(t, recv.PacketCh(), wait, "the packet WriteTo sent")
		if !bytes.Equal(p.Buf, msg) || p.From.String() != other.addr() {
			t.Fatalf("got %d bytes from %s, want %d from %s", len(p.Buf), p.From, len(msg), other.addr())
		}
		if _, err := other.WriteTo(msg, "localhost:"+strconv.Itoa(recv.port)); err != nil {
			t.Fatalf("WriteTo a host name: %v", err)
		}
		testutil.RecvWithin(t, recv.PacketCh(), wait, "the packet sent to a host name")
		if _, err := other.WriteTo(msg, "no-port"); err == nil {
			t.Fatal("WriteTo an address without a port: no error")
		}
	})
}

// TestNetTransportDrops: an empty packet and one over the size limit are not delivered; each
// is a memberlist line that counts as rejected; the loop goes on with the next packet.
func TestNetTransportDrops(t *testing.T) {
	const limit = 512
	for _, c := range []struct {
		name string
		size int
		line string
	}{
		{"empty", 0, "packet too short (0 bytes)"},
		{"one over", limit + 1, "packet too large (over 512 bytes)"},
		{"far over", 4 * limit, "packet too large (over 512 bytes)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lg, rec := testutil.RecordingLogger()
			rej := metrics.NewSet().NewCounter("rejected")
			recv := onLoopback(t, limit, log.New(newLevelWriter(lg, rej), "", 0))
			send := udpSender(t)
			to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: recv.port}
			good := payload(limit, 9)
			for _, p := range [][]byte{payload(c.size, 5), good} {
				if _, err := send.WriteToUDP(p, to); err != nil {
					t.Fatal(err)
				}
			}
			p := testutil.RecvWithin(t, recv.PacketCh(), wait, "the packet after the dropped one")
			if !bytes.Equal(p.Buf, good) {
				t.Fatalf("got %d bytes, want the %d-byte packet sent after the dropped one", len(p.Buf), len(good))
			}
			testutil.Eventually(t, wait, "the drop counted", func() bool { return rej.Get() == 1 })
			lines := rec.WithMessage("peering: memberlist")
			if len(lines) != 1 || !strings.Contains(lines[0].Text(), c.line) || !strings.Contains(lines[0].Text(), send.LocalAddr().String()) {
				t.Fatalf("logged %v, want one line with %q and the sender", lines, c.line)
			}
		})
	}
}

// TestNetTransportStreams: DialTimeout reaches another transport, whose StreamCh hands on
// the accepted stream, bytes flowing both ways; a dial to a closed port fails.
func TestNetTransportStreams(t *testing.T) {
	a, b := onLoopback(t, 0, quietLog), onLoopback(t, 0, quietLog)
	out, err := a.DialTimeout(b.addr(), wait)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	in := testutil.RecvWithin(t, b.StreamCh(), wait, "the dialled stream accepted")
	defer in.Close()
	_ = in.SetDeadline(time.Now().Add(wait))
	_ = out.SetDeadline(time.Now().Add(wait))
	for _, dir := range []struct{ from, to net.Conn }{{out, in}, {in, out}} {
		msg := []byte("push/pull " + dir.from.LocalAddr().String())
		if _, err := dir.from.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(dir.to, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("read %q, %v; want %q", got, err, msg)
		}
	}
	if in.RemoteAddr().String() != out.LocalAddr().String() {
		t.Fatalf("accepted from %s, dialled from %s", in.RemoteAddr(), out.LocalAddr())
	}
	if c, err := a.DialTimeout(testutil.FreeAddr(t), wait); err == nil {
		_ = c.Close()
		t.Fatal("a dial to a closed port succeeded")
	}
}

// TestNetTransportShutdown: Shutdown returns while a packet and a stream wait for a reader,
// ends every loop of the transport and of a limitTransport around it (no goroutine left),
// frees the port for both protocols, and may be called again.
func TestNetTransportShutdown(t *testing.T) {
	nt := onLoopback(t, 0, quietLog)
	lt := newLimitTransport(nt, wait, (&drops{}).drop)
	c, err := net.DialTimeout("tcp", nt.addr(), wait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(frameHeader(smallFrameBytes + 1)); err != nil {
		t.Fatal(err)
	}
	idle, err := net.DialTimeout("tcp", nt.addr(), wait) // waits for its frame header
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := udpSender(t).WriteToUDP([]byte("unread"), &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: nt.port}); err != nil {
		t.Fatal(err)
	}
	// The stream reaches limitTransport's admit, which waits for memberlist to take it (with
	// a slot: its frame is large); the idle one waits in the room; the packet waits in the
	// read loop's hand-off.
	testutil.Eventually(t, wait, "the stream waiting for memberlist", func() bool { return len(lt.slots) == 1 })
	testutil.Eventually(t, wait, "the idle stream in the room", func() bool { n, _ := lt.room.size(netip.AddrFrom4([4]byte{127, 0, 0, 1})); return n == 2 })
	testutil.Eventually(t, wait, "the packet waiting for memberlist", func() bool {
		return strings.HasPrefix(goroutineOf("peering.(*netTransport).readLoop"), "[select")
	})
	done := make(chan error, 1)
	go func() { done <- lt.Shutdown() }()
	if err := testutil.RecvWithin(t, done, wait, "Shutdown returned"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	testutil.Eventually(t, wait, "no transport goroutine left", func() bool {
		return !strings.Contains(goroutines(), "peering.(*netTransport)") && !strings.Contains(goroutines(), "peering.(*limitTransport)")
	})
	for _, c := range []net.Conn{c, idle} {
		if !closedWithin(c, wait) {
			t.Fatal("a waiting stream was not closed")
		}
	}
	again, err := listenNet("127.0.0.1", nt.port, 0, quietLog)
	if err != nil {
		t.Fatalf("port %d not freed: %v", nt.port, err)
	}
	_ = again.Shutdown()
	if err := nt.Shutdown(); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

// goroutines is every goroutine's stack.
func goroutines() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// goroutineOf is the state ("[select]", "[IO wait]", ...) and stack of the first goroutine
// whose stack names fn ("" if none).
func goroutineOf(fn string) string {
	for _, g := range strings.Split(goroutines(), "\n\n") {
		if strings.Contains(g, fn) {
			if i := strings.Index(g, "["); i >= 0 {
				return g[i:]
			}
		}
	}
	return ""
}

// TestNetTransportPorts: port 0 binds TCP and UDP on the same kernel-picked port; a fixed
// port whose UDP side is taken fails with EADDRINUSE and leaves its TCP side free; a host
// name binds its address.
func TestNetTransportPorts(t *testing.T) {
	nt := onLoopback(t, 0, quietLog)
	tp, up := nt.tcp.Addr().(*net.TCPAddr).Port, nt.udp.LocalAddr().(*net.UDPAddr).Port
	if nt.port == 0 || tp != nt.port || up != nt.port || nt.GetAutoBindPort() != nt.port {
		t.Fatalf("TCP port %d, UDP %d, reported %d; want one non-zero port", tp, up, nt.GetAutoBindPort())
	}
	port := udpOnlyPort(t)
	if _, err := newNetTransport("127.0.0.1", port, 0, quietLog); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("binding a taken UDP port: %v, want EADDRINUSE", err)
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatalf("the TCP side of a failed bind was not released: %v", err)
	}
	_ = ln.Close()
	named, err := listenNet("localhost", 0, 0, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer named.Shutdown()
	if !named.ip.IsLoopback() {
		t.Fatalf("localhost bound %v", named.ip)
	}
}

// udpOnlyPort is a 127.0.0.1 port taken for UDP (until the test's end) whose TCP side was
// free a moment ago (an ephemeral UDP port may be some TCP connection's local port).
func udpOnlyPort(t *testing.T) int {
	t.Helper()
	const tries = 20
	for range tries {
		port := udpSender(t).LocalAddr().(*net.UDPAddr).Port
		if ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}); err == nil {
			_ = ln.Close()
			return port
		}
	}
	t.Fatalf("no UDP port with its TCP side free in %d tries", tries)
	return 0
}

// TestAdvertiseIP: the advertised address is the explicit one, else the bound one, else
// (bound to all interfaces) a private address of the machine; FinalAdvertiseAddr pairs it
// with the explicit port or the bound one.
func TestAdvertiseIP(t *testing.T) {
	private := func(ip string, err error) func() (string, error) {
		return func() (string, error) { return ip, err }
	}
	failing := errors.New("no route table")
	for _, c := range []struct {
		name     string
		explicit string
		bound    string
		private  func() (string, error)
		want     string
		err      string
	}{
		{"explicit v4", "10.1.2.3", "127.0.0.1", nil, "10.1.2.3", ""},
		{"explicit v6", "fd00::1", "0.0.0.0", nil, "fd00::1", ""},
		{"explicit not an IP", "peer.example", "127.0.0.1", nil, "", "not an IP address"},
		{"bound", "", "127.0.0.1", nil, "127.0.0.1", ""},
		{"all interfaces", "", "0.0.0.0", private("192.168.7.9", nil), "192.168.7.9", ""},
		{"all interfaces v6", "", "::", private("10.0.0.5", nil), "10.0.0.5", ""},
		{"no private address", "", "0.0.0.0", private("", nil), "", "no private IP address"},
		{"lookup failed", "", "0.0.0.0", private("", failing), "", "no route table"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := advertiseIP(c.explicit, net.ParseIP(c.bound), c.private)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v, %v; want an error with %q", got, err, c.err)
				}
				return
			}
			if err != nil || !got.Equal(net.ParseIP(c.want)) {
				t.Fatalf("got %v, %v; want %s", got, err, c.want)
			}
			if got.To4() != nil && len(got) != net.IPv4len {
				t.Fatalf("IPv4 %v in %d bytes", got, len(got))
			}
		})
	}
	nt := onLoopback(t, 0, quietLog)
	for _, c := range []struct {
		ip         string
		port       int
		want       string
		wantPort   int
		explicitly bool
	}{
		{"", 0, "127.0.0.1", nt.port, false},
		{"", 9999, "127.0.0.1", nt.port, false},
		{"10.9.8.7", 7000, "10.9.8.7", 7000, true},
	} {
		ip, port, err := nt.FinalAdvertiseAddr(c.ip, c.port)
		if err != nil || !ip.Equal(net.ParseIP(c.want)) || port != c.wantPort {
			t.Fatalf("FinalAdvertiseAddr(%q, %d) = %v, %d, %v; want %s, %d", c.ip, c.port, ip, port, err, c.want, c.wantPort)
		}
	}
}

// BenchmarkPacketReceive is one 1400-byte packet (udpBufferSize, a full update) sent over
// 127.0.0.1 and taken from the transport's PacketCh: memberlist's NetTransport (a fresh
// 64 KiB buffer per packet) against netTransport (one scratch buffer, a copy of the packet's
// length). B/op is what the receiving replica allocates per packet, the sender's write
// included.
func BenchmarkPacketReceive(b *testing.B) {
	for _, c := range []struct {
		name   string
		listen func(b *testing.B) (memberlist.Transport, int)
	}{
		{"NetTransport", func(b *testing.B) (memberlist.Transport, int) {
			nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: quietLog})
			if err != nil {
				b.Fatal(err)
			}
			return nt, nt.GetAutoBindPort()
		}},
		{"netTransport", func(b *testing.B) (memberlist.Transport, int) {
			nt := onLoopback(b, 0, quietLog)
			return nt, nt.port
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			tr, port := c.listen(b)
			defer tr.Shutdown()
			send := udpSender(b)
			to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
			msg := payload(udpBufferSize, 4)
			timer := time.NewTimer(wait)
			defer timer.Stop()
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := send.WriteToUDP(msg, to); err != nil {
					b.Fatal(err)
				}
				timer.Reset(wait)
				select {
				case p := <-tr.PacketCh():
					if len(p.Buf) != len(msg) {
						b.Fatalf("got %d bytes", len(p.Buf))
					}
				case <-timer.C:
					b.Fatalf("no packet within %v", wait)
				}
			}
		})
	}
}

// TestDialedStreamDeadline: a stream dialled to a peer that accepts and never reads (a
// frozen process) cannot hold a writer past streamDeadline, which memberlist's join writes
// its whole state under before it sets a deadline of its own; after Shutdown a dial fails
// at once.
func TestDialedStreamDeadline(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	nt := onLoopback(t, 0, quietLog)
	c, err := nt.DialTimeout(silent.Addr().String(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 256<<20)) // far more than the socket buffers take
		done <- err
	}()
	if err := testutil.RecvWithin(t, done, wait, "the write ended"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write to a peer that never reads: %v, want the deadline", err)
	}
	if err := nt.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := nt.DialTimeout(silent.Addr().String(), wait); !errors.Is(err, errTransportClosed) {
		t.Fatalf("dial after Shutdown: %v", err)
	}
}
