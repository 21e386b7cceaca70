// Recognising this replica among the join targets and its own snapshot among those merged:
// a join list may name this replica in another spelling (localhost for 127.0.0.1, the pod's
// IP for 0.0.0.0), and a join to itself would import its own index snapshot again on every
// rejoin.

package peering

import (
	"context"
	"hash/maphash"
	"net"
	"time"
)

const (
	// ownSnapshotsKept is how many of this replica's latest join snapshots are remembered to
	// recognise them if they come back: a join's push/pull makes one at a time, a handful of
	// concurrent joins a few.
	ownSnapshotsKept = 8
	// ownSnapshotTTL is how long a snapshot made here is recognised: two push/pull timeouts,
	// the longest it can take to come back over a join to this replica itself.
	ownSnapshotTTL = 2 * tcpTimeout
	// selfLookupTimeout bounds the resolution of one join target's host name.
	selfLookupTimeout = time.Second
)

// ownSnapshot is the fingerprint of a snapshot this replica made.
type ownSnapshot struct {
	sum uint64
	at  time.Time
}

// ownSnapshots remembers this replica's recent join snapshots (safe for concurrent use).
type ownSnapshots struct {
	seed maphash.Seed
	list []ownSnapshot // at most ownSnapshotsKept, oldest first
}

// add remembers buf, made at now.
func (o *ownSnapshots) add(n *Node, buf []byte, now time.Time) {
	sum := maphash.Bytes(o.seed, buf)
	n.snapMu.Lock()
	defer n.snapMu.Unlock()
	if len(o.list) == ownSnapshotsKept {
		o.list = append(o.list[:0], o.list[1:]...)
	}
	o.list = append(o.list, ownSnapshot{sum: sum, at: now})
}

// mine reports whether buf is one of the snapshots made here within ownSnapshotTTL of now.
// A peer's snapshot identical to one of this replica's would be recognised as well, and
// skipping it loses nothing.
func (o *ownSnapshots) mine(n *Node, buf []byte, now time.Time) bool {
	sum := maphash.Bytes(o.seed, buf)
	n.snapMu.Lock()
	defer n.snapMu.Unlock()
	for _, s := range o.list {
		if s.sum == sum && now.Sub(s.at) <= ownSnapshotTTL {
			return true
		}
	}
	return false
}

// isSelf reports whether the join target addr (host:port) is this replica: the same port as
// Addr's, and a host that resolves to the bound IP or the advertised one, or, when bound to
// all interfaces, to an address of one of this machine's interfaces.
func (n *Node) isSelf(ctx context.Context, addr string) bool {
	if addr == n.addr {
		return true
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	_, myPort, err := net.SplitHostPort(n.addr)
	if err != nil || port != myPort {
		return false
	}
	ips := []string{host}
	if net.ParseIP(host) == nil {
		ctx, cancel := context.WithTimeout(ctx, selfLookupTimeout)
		defer cancel()
		r := n.o.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		if ips, err = r.LookupHost(ctx, host); err != nil {
			return false
		}
	}
	bind, _, _ := splitHostPort(n.o.Listen)
	bindIP := net.ParseIP(bind)
	advHost, _, _ := net.SplitHostPort(n.addr)
	advIP := net.ParseIP(advHost)
	var local []net.Addr
	if bindIP == nil || bindIP.IsUnspecified() {
		local, _ = net.InterfaceAddrs()
	}
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			continue
		}
		if ip.Equal(advIP) || ip.Equal(bindIP) {
			return true
		}
		for _, a := range local {
			if in, ok := a.(*net.IPNet); ok && in.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}
