package configs

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/prefixlb/prefixlb/peering"
)

// Peering makes several prefixlb replicas route as one (package peering): they share what
// each learned and what each has in flight per backend. Off when the section is absent.
type Peering struct {
	// Listen is the peer port (TCP and UDP), host:port: never the data listener's.
	Listen string `yaml:"listen"`
	// Advertise is the host:port peers reach this replica at (default: the bound address or
	// a private address of the machine).
	Advertise string `yaml:"advertise"`
	// Join is a static list of peers' host:port.
	Join []string `yaml:"join"`
	// DNS is a headless Service name whose A/AAAA records are the peers, at Listen's port.
	DNS string `yaml:"dns"`
	// SecretFile and SecretEnv name where the shared secret is: a file (a mounted Kubernetes
	// Secret) or an environment variable; exactly one. The secret is 16, 24 or 32 bytes, raw
	// or base64 (peering.ParseSecret).
	SecretFile string `yaml:"secret_file"`
	SecretEnv  string `yaml:"secret_env"`
	// SettleWait is how long a long request waits, its decision sent to the peers, before it
	// goes to its backend, so that a peer's decision made at the same instant is seen and the
	// later of the two is made again (nil: peering.DefaultSettleWait, 3 ms; 0: off). Only
	// requests whose own prefill is predicted at 20× the wait or more are held.
	SettleWait *Duration `yaml:"settle_wait"`
}

// SettleWaitOption is SettleWait as peering.Options takes it: 0 for the default, negative
// for off.
func (p *Peering) SettleWaitOption() time.Duration {
	switch {
	case p.SettleWait == nil:
		return 0
	case *p.SettleWait <= 0:
		return -1
	}
	return p.SettleWait.D()
}

// minSettleWait and maxSettleWait bound peering.settle_wait: a peer's decision goes out a
// flush interval after it was made (peering.DefaultFlushInterval, 1 ms, plus the timer's
// lateness, about 0.1 ms here) and crosses the network, so a wait under two intervals sees
// none; every held request waits it, up to twice.
const (
	minSettleWait = 2 * peering.DefaultFlushInterval
	maxSettleWait = 100 * time.Millisecond
)

// DefaultPeeringListen is the peer port on all interfaces: memberlist's default port.
var DefaultPeeringListen = ":" + strconv.Itoa(peering.DefaultPort)

func (p *Peering) applyDefaults() {
	if p != nil {
		setS(&p.Listen, DefaultPeeringListen)
	}
}

// validate checks the section (nil: off) against the rest of c.
func (p *Peering) validate(c *Config) error {
	if p == nil {
		return nil
	}
	listenErr, advertiseErr := checkPeerPort(p.Listen, true), error(nil)
	if p.Advertise != "" {
		advertiseErr = checkPeerPort(p.Advertise, false)
	}
	switch {
	case listenErr != nil:
		return fmt.Errorf("peering.listen: %w", listenErr)
	case samePort(p.Listen, c.Listen) || samePort(p.Listen, c.AdminListen):
		return fmt.Errorf("peering.listen: %q is the data or admin listener; peers need a port of their own", p.Listen)
	case advertiseErr != nil:
		return fmt.Errorf("peering.advertise: %w", advertiseErr)
	case p.Advertise != "" && unspecifiedHost(p.Advertise):
		return fmt.Errorf("peering.advertise: %q names no host peers can reach; give this replica's address (or leave advertise out)", p.Advertise)
	case (p.SecretFile == "") == (p.SecretEnv == ""):
		return errors.New("peering: exactly one of secret_file and secret_env is required (peer traffic is authenticated)")
	case p.SettleWait != nil && *p.SettleWait != 0 && (p.SettleWait.D() < minSettleWait || p.SettleWait.D() > maxSettleWait):
		return fmt.Errorf("peering.settle_wait: %s; want 0 (off) or %s to %s", p.SettleWait.D(), minSettleWait, maxSettleWait)
	case c.Mode != "prefix":
		return fmt.Errorf("peering: mode %q keeps no index to share; peering needs mode prefix", c.Mode)
	}
	for i, j := range p.Join {
		if err := checkPeerPort(j, false); err != nil {
			return fmt.Errorf("peering.join[%d]: %w", i, err)
		}
	}
	return nil
}

// checkPeerPort checks that s is host:port with a numeric port in 1..65535 (0 too when
// zeroOK: a listener on an ephemeral port), as memberlist reads one: a service name or a
// port of 0 that peers are told to dial would pass memberlist's start and fail every join.
func checkPeerPort(s string, zeroOK bool) error {
	if err := checkHostPort(s); err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(s)
	n, err := strconv.ParseUint(port, 10, 16)
	switch {
	case err != nil:
		return fmt.Errorf("%q: the port %q is not a number in 1..%d", s, port, maxPort)
	case n == 0 && !zeroOK:
		return fmt.Errorf("%q: port 0 cannot be dialled; give the port peers reach", s)
	}
	return nil
}

// samePort reports whether two host:port listeners name the same fixed port (port 0 is an
// ephemeral one each).
func samePort(a, b string) bool {
	_, pa, errA := net.SplitHostPort(a)
	_, pb, errB := net.SplitHostPort(b)
	return errA == nil && errB == nil && pa == pb && pa != "0"
}

// unspecifiedHost reports whether host:port s has no host or an unspecified address
// (0.0.0.0, ::), which a listener may bind but no peer can dial.
func unspecifiedHost(s string) bool {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}
