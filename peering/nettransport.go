// The peer port's packets and streams: memberlist's Transport, our own. Memberlist's
// NetTransport reads every UDP packet into a fresh 64 KiB buffer, while a packet here is at
// most udpBufferSize (1400) bytes; at the few thousand packets a second a routing replica
// sends each peer, that is hundreds of MB/s of garbage (and its clearing and GC marking) on
// every receiving replica. netTransport reads every packet into one
// scratch buffer and hands memberlist a copy of exactly the packet's length: memberlist may
// keep Packet.Buf after the hand-off (its user, alive and suspect messages wait in a queue
// for its packet handler), so the scratch itself is never handed to it. The updates go on
// the direct path (direct.go): the read loop hands a direct packet's scratch to the direct
// handler, which opens it into a buffer of its own before it returns.

package peering

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

const (
	// maxPacketBytes is the largest UDP packet received: 65,536 bytes, what memberlist's
	// NetTransport reads (a UDP payload over IPv4 is at most 65,507 bytes, so no real
	// packet is over it). The peers send at most udpBufferSize; memberlist's own messages
	// fit it too, this is only what the scratch buffer can hold.
	maxPacketBytes = 1 << 16
	// udpRecvBufBytes is the socket receive buffer asked for first: 2 MiB (≈ 1500 update
	// packets, 1.5 s of one busy peer's), halved until the kernel accepts one (memberlist's
	// NetTransport does the same; Linux caps it at net.core.rmem_max without an error).
	udpRecvBufBytes = 2 << 20
	// acceptRetryMin and acceptRetryMax bound the pause after a failed TCP accept (out of
	// file descriptors, say): 5 ms, doubled per failure in a row up to 1 s.
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
	// fromCacheSize bounds the cache of packet senders' addresses (one *net.UDPAddr per
	// peer, shared by its packets): a handful of replicas fit; past it the cache is cleared.
	fromCacheSize = 64
)

// netTransport is memberlist's Transport on one host:port, bound for both TCP (streams:
// join push/pulls, fallback pings) and UDP (packets: probes, gossip, the flusher's updates).
// Create it with listenNet; Shutdown closes both sockets and ends its loops. PacketCh and
// StreamCh are never closed (memberlist reads them until its own shutdown); a packet or
// stream still waiting for a reader at Shutdown is dropped (the stream closed).
type netTransport struct {
	tcp       *net.TCPListener
	udp       *net.UDPConn
	ip        net.IP // the bound address; unspecified: all interfaces
	port      int
	maxPacket int
	log       *log.Logger

	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	closing atomic.Bool
	// dialCtx is cancelled at Shutdown, ending the dials in progress.
	dialCtx    context.Context
	cancelDial context.CancelFunc
	once       sync.Once
	wg         sync.WaitGroup
	froms      map[netip.AddrPort]*net.UDPAddr // the UDP loop's own
	direct     atomic.Pointer[directHandler]   // direct packets' handler (direct.go); nil: dropped
}

var (
	_ memberlist.Transport = (*netTransport)(nil)
	_ directPath           = (*netTransport)(nil)
)

// SetDirect makes h the handler of the direct packets (first byte directMagic), which the
// read loop hands to it itself, not to memberlist.
func (t *netTransport) SetDirect(h directHandler) bool {
	t.direct.Store(&h)
	return true
}

// listenNet binds TCP and UDP on host:port (host an IP address, "0.0.0.0" or "::" for all
// interfaces, or a name resolved to its first address; port 0: one the kernel picks for
// TCP, then the same for UDP) and starts the accept and read loops. Packets over maxPacket
// bytes (<= 0: maxPacketBytes) and empty ones are dropped with a line on lg. Errors: a host
// that does not resolve, a port that cannot be bound for either protocol (the error wraps
// the system's, EADDRINUSE when taken), a receive buffer the kernel refuses at every size.
func listenNet(host string, port, maxPacket int, lg *log.Logger) (*netTransport, error) {
	ip := net.ParseIP(host)
	if ip == nil {
		a, err := net.ResolveIPAddr("ip", host)
		if err != nil {
			return nil, fmt.Errorf("resolve %q: %w", host, err)
		}
		ip = a.IP
	}
	if maxPacket <= 0 {
		maxPacket = maxPacketBytes
	}
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, err
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		_ = tcp.Close()
		return nil, err
	}
	if err := setReadBuffer(udp, udpRecvBufBytes); err != nil {
		_ = tcp.Close()
		_ = udp.Close()
		return nil, fmt.Errorf("UDP receive buffer: %w", err)
	}
	t := &netTransport{tcp: tcp, udp: udp, ip: ip, port: port, maxPacket: maxPacket, log: lg,
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{}),
		froms: map[netip.AddrPort]*net.UDPAddr{}}
	t.dialCtx, t.cancelDial = context.WithCancel(context.Background())
	t.wg.Add(2)
	go t.acceptLoop()
	go t.readLoop()
	return t, nil
}

// setReadBuffer sets c's receive buffer to size bytes, or the largest half, quarter, …
// the kernel accepts; the error is the last refusal's.
func setReadBuffer(c *net.UDPConn, size int) error {
	var err error
	for ; size > 0; size /= 2 {
		if err = c.SetReadBuffer(size); err == nil {
			return nil
		}
	}
	return err
}

// GetAutoBindPort is the bound port (the kernel's pick when listenNet was given 0); the
// name is memberlist.NetTransport's.
func (t *netTransport) GetAutoBindPort() int { return t.port }

// FinalAdvertiseAddr is the address peers reach this replica at (advertiseIP) and the port:
// the given one with an explicit address, else the bound one.
func (t *netTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	a, err := advertiseIP(ip, t.ip, sockaddr.GetPrivateIP)
	if err != nil {
		return nil, 0, err
	}
	if ip == "" {
		port = t.port
	}
	return a, port, nil
}

// advertiseIP is the address to advertise: explicit when not "" (an IP address, IPv4 in
// its 4-byte form), else the bound one, or for an unspecified bound one (all interfaces)
// the address private() names: memberlist uses go-sockaddr's GetPrivateIP, the first
// RFC 6890 private address of the interface with the default route, or of any interface.
// Errors: an explicit address that is not an IP, none private found, private's own.
func advertiseIP(explicit string, bound net.IP, private func() (string, error)) (net.IP, error) {
	s := explicit
	if s == "" {
		if !bound.IsUnspecified() {
			return normIP(bound), nil
		}
		var err error
		if s, err = private(); err != nil {
			return nil, fmt.Errorf("finding a private address to advertise: %w", err)
		}
		if s == "" {
			return nil, errors.New("no private IP address found to advertise (bound to all interfaces); set an explicit advertise address")
		}
	}
	a := net.ParseIP(s)
	if a == nil {
		return nil, fmt.Errorf("advertise address %q is not an IP address", s)
	}
	return normIP(a), nil
}

// normIP is ip with an IPv4 address in its 4-byte form.
func normIP(ip net.IP) net.IP {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip
}

// WriteTo sends b as one UDP packet to addr (host:port; an IP literal is sent to without a
// lookup, a name resolved) and returns the time the write returned.
func (t *netTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	var err error
	if ap, perr := netip.ParseAddrPort(addr); perr == nil {
		// An IPv4 socket takes only 4-byte addresses; a dual-stack one maps them itself.
		_, err = t.udp.WriteToUDPAddrPort(b, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	} else {
		var ua *net.UDPAddr
		if ua, err = net.ResolveUDPAddr("udp", addr); err != nil {
			return time.Time{}, err
		}
		_, err = t.udp.WriteToUDP(b, ua)
	}
	return time.Now(), err
}

// PacketCh delivers the packets received, each Buf its own (memberlist may keep it).
func (t *netTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout connects to a peer for a stream (a join push/pull, a fallback ping), giving up
// at Shutdown as well as after timeout; the connection comes with a deadline of
// streamDeadline(timeout), which memberlist's own later deadline replaces: it writes this
// replica's state before it sets one, so that a peer that accepts and never reads (frozen,
// or not a replica) would otherwise hold the write, and Close behind it, for good.
func (t *netTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.closing.Load() {
		return nil, errTransportClosed
	}
	ctx, cancel := context.WithTimeout(t.dialCtx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Now().Add(streamDeadline(timeout))); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// streamDeadline is how long a dialled stream may take before memberlist sets its own
// deadline: long enough to write a whole snapshot (maxSnapshotBytes) at 20 MB/s, and at
// least the dial's timeout.
func streamDeadline(timeout time.Duration) time.Duration {
	return max(timeout, time.Duration(maxStreamBytes/(20<<20)+1)*time.Second)
}

// errTransportClosed is DialTimeout's error after Shutdown.
var errTransportClosed = errors.New("peering: transport closed")

// StreamCh delivers the accepted TCP streams; the reader closes them.
func (t *netTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes both sockets and returns once the loops have ended. Safe to call more
// than once; the error is the first call's (closing a socket).
func (t *netTransport) Shutdown() error {
	var err error
	t.once.Do(func() {
		t.closing.Store(true)
		close(t.done)
		t.cancelDial()
		err = errors.Join(t.tcp.Close(), t.udp.Close())
		t.wg.Wait()
	})
	return err
}

// acceptLoop hands the accepted TCP streams to StreamCh until Shutdown.
func (t *netTransport) acceptLoop() {
	defer t.wg.Done()
	var pause time.Duration
	for {
		c, err := t.tcp.Accept()
		if err != nil {
			if t.closing.Load() {
				return
			}
			pause = min(max(2*pause, acceptRetryMin), acceptRetryMax)
			t.log.Printf("[ERR] memberlist: Error accepting TCP connection: %v", err)
			if !t.sleep(pause) {
				return
			}
			continue
		}
		pause = 0
		select {
		case t.streams <- c:
		case <-t.done:
			_ = c.Close()
			return
		}
	}
}

// readLoop reads UDP packets into one scratch buffer and hands a copy of each to PacketCh
// until Shutdown; an empty packet or one over maxPacket is dropped with a log line. A direct
// packet (direct.go) is handed, not copied, to the direct handler, in this loop.
func (t *netTransport) readLoop() {
	defer t.wg.Done()
	// One byte more than the largest packet taken: a read that fills it was longer (the
	// kernel cuts a datagram to the buffer and says nothing through ReadFrom).
	scratch := make([]byte, t.maxPacket+1)
	var pause time.Duration
	for {
		n, from, err := t.udp.ReadFromUDPAddrPort(scratch)
		ts := time.Now()
		if err != nil {
			if t.closing.Load() {
				return
			}
			pause = min(max(2*pause, acceptRetryMin), acceptRetryMax)
			t.log.Printf("[ERR] memberlist: Error reading UDP packet: %v", err)
			if !t.sleep(pause) {
				return
			}
			continue
		}
		pause = 0
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		switch {
		case n < 1:
			t.log.Printf("[ERR] memberlist: UDP packet too short (%d bytes) from=%s", n, from)
			continue
		case n > t.maxPacket:
			t.log.Printf("[ERR] memberlist: UDP packet too large (over %d bytes) from=%s", t.maxPacket, from)
			continue
		}
		if scratch[0] == directMagic {
			if h := t.direct.Load(); h != nil {
				(*h)(scratch[:n], from)
			} else {
				t.log.Printf("[ERR] memberlist: direct update packet not supported yet from=%s", from)
			}
			continue
		}
		buf := make([]byte, n)
		copy(buf, scratch)
		p := &memberlist.Packet{Buf: buf, From: t.fromAddr(from), Timestamp: ts}
		select {
		case t.packets <- p:
		case <-t.done:
			return
		}
	}
}

// fromAddr is the sender's address ap (IPv4 unmapped) as a net.Addr: a *net.UDPAddr, as
// memberlist's NetTransport gives it, one per sender, shared by its packets (memberlist
// only reads it).
func (t *netTransport) fromAddr(ap netip.AddrPort) net.Addr {
	if a, ok := t.froms[ap]; ok {
		return a
	}
	if len(t.froms) >= fromCacheSize {
		clear(t.froms)
	}
	a := net.UDPAddrFromAddrPort(ap)
	t.froms[ap] = a
	return a
}

// sleep waits d, or until Shutdown (then false).
func (t *netTransport) sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-t.done:
		return false
	}
}
