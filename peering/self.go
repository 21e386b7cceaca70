// Recognising this replica among the join targets: a join list may name this replica in
// another spelling (localhost for 127.0.0.1, the pod's IP for 0.0.0.0), and a join to itself
// is a push/pull with itself on every rejoin (its own snapshot, which names it, is then not
// taken: merge).

package peering

import (
	"context"
	"net"
	"time"
)

// selfLookupTimeout bounds the resolution of one join target's host name.
const selfLookupTimeout = time.Second

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
