// Package peering makes several prefixlb replicas route as one: each tells the others what
// it learned (a routed request's chunk hashes on a backend) and what it has in flight per
// backend, so that every replica's prefix index and load view converge within a flush
// interval or two (about 10 ms) without a shared store.
//
// Membership and failure detection are hashicorp/memberlist's (SWIM, as in Consul, Loki,
// Mimir and Cortex), bound to a peer port of its own, never the public listener, and
// authenticated and encrypted with a shared secret (AES-GCM; memberlist's SecretKey): a
// replica with another secret can neither join nor inject updates. Its packets and streams
// go through this package's transport (nettransport.go: one receive buffer, not 64 KiB
// allocated per packet as memberlist's own does). Memberlist reads a TCP push/pull whole
// (up to 20 MiB) before it can authenticate it: inbound streams are therefore capped
// (transport.go: 17 MiB each, 8 at once above 64 KiB), which bounds what an unauthenticated
// sender can make a replica hold to a few hundred MiB; and a connection must send its frame
// header within a second and the rest at a minimum rate, with at most 8 unauthenticated
// streams per source address (guard.go), so that idle connections cannot hold the port
// from the peers; a NetworkPolicy that admits only the other replicas to the peer port is
// still the defence. A join tries its targets one after another, the next as soon as one
// fails or after a second without an answer (join.go). The updates themselves are not
// gossiped: a flusher sends what changed in one compact batch (wire.go), at most every
// FlushInterval (1 ms), by UDP to every live peer, on a path of its own beside memberlist's
// (direct.go: sealed with XChaCha20-Poly1305 under a key derived from the secret, opened and
// applied by the receiving transport's read loop, not handed through memberlist's
// goroutines). The peer records the hashes in its own index for its own backend of the same
// ID and never forwards them, so nothing loops. Batches larger than a packet are split
// (packetBudget). The loads each peer reports are summed into the backends'
// PeerInFlight and PeerPrefillTokens, which the prefix policy's cost model and bounded-load
// cap add to the local counts; a report older than loadTTL, or of a peer that died or
// left, no longer counts. Each replica also sends the prefill observations it made itself
// (a streamed request's time to first token against its prefill work, kindSamples), which
// every peer folds into its model of that backend (backend.PrefillModel): with N replicas
// each would otherwise learn a backend's rate from 1/N of its requests.
//
// A replica that starts joins the configured peers (a static list, or the A records of a
// headless Service) before it reports ready: memberlist's join push/pull carries a snapshot
// of the peer's index (the most recent entries, up to maxSnapshotBytes, with their ages),
// merged before Ready; a snapshot that comes first from a peer joining this replica (its
// rejoin loop) makes it ready too. With no peer to ask, or none answering within
// SnapshotTimeout, it is ready anyway with what it has, and says so in a log line. A replica
// whose peers are all gone routes on its own state, as without peering; it logs the loss and
// the recovery once each, and prefixlb_peers_alive shows it. Dead peers are joined again
// every RejoinInterval, which exchanges snapshots, so that after a partition heals the
// indexes converge: each side merges the other's entries among its own by age
// (index.Merge), and keeps the newest of both within the capacity.
package peering

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/discovery"
	"github.com/prefixlb/prefixlb/router"
)

// Defaults of Options left at zero, and memberlist's tuning.
const (
	// DefaultFlushInterval is 1 ms, the shortest time between two batches of updates: a
	// learned prefix and a load change reach the peers within about 1 ms plus a loopback or
	// LAN hop (≈ 0.1 ms), while a batch carries every request routed meanwhile, so that at
	// 10,000 requests/s a peer gets at most 1000 packets/s. The flusher sleeps between
	// changes (flushLoop): a replica with requests streaming and nothing new to tell sends a
	// keepalive every loadKeepalive. Longer intervals let peered replicas' decisions cross
	// and raise TTFT p95 on shared prompts (bench suite, shared-prefix, prefix-x3+peer).
	DefaultFlushInterval = 1 * time.Millisecond
	// DefaultSnapshotTimeout bounds how long a starting replica waits for a peer's index
	// snapshot before it reports ready anyway: 5 s, ample for 16 MiB on a LAN.
	DefaultSnapshotTimeout = 5 * time.Second
	// DefaultRejoinInterval is how often a replica joins its dead peers again (and, when it
	// has no live peer, the configured ones): 5 s, so that a healed partition converges
	// within seconds without a join storm.
	DefaultRejoinInterval = 5 * time.Second
	// DefaultPort is the peer port when Listen names none: memberlist's own default.
	DefaultPort = 7946

	// loadKeepalive is the longest gap between two load reports to a peer when nothing
	// changed and something is in flight, and the idle flusher's period (flushLoop); loads
	// that change are sent with the next flush. A replica with nothing in flight repeats
	// that report idleRepeats times and then sends no keepalive: its last report, none in
	// flight, means what its expiry means (busy). Three idle replicas sending keepalives
	// woke one another 60 times a second.
	loadKeepalive = 100 * time.Millisecond
	// loadTTL is how long a peer's load report counts: five keepalives, so that a lost
	// packet or two does not drop it, and a dead peer's in-flight requests stop counting
	// within half a second even before memberlist declares it dead.
	loadTTL = 5 * loadKeepalive
	// udpBufferSize is memberlist's UDP packet size (its default, 1400 bytes: under the
	// 1500-byte Ethernet MTU with room for IP, UDP and a tunnel's headers).
	udpBufferSize = 1400
	// packetReserve is what memberlist adds to a user message: its type byte, a 5-byte CRC
	// and the AES-GCM framing (1 version byte, 12 nonce, 16 tag), rounded up; a direct
	// packet's framing (directOverhead, 41 bytes) fits in it too.
	packetReserve = 64
	// packetBudget is the most bytes of one update: about 160 chunk hashes.
	packetBudget = udpBufferSize - packetReserve
	// maxSnapshotBytes bounds a join snapshot: 16 MiB (≈ 2M entries), under memberlist's
	// 20 MiB limit on a push/pull's state.
	maxSnapshotBytes = 16 << 20
	// Memberlist's failure detector, tuned from its LAN defaults (1 s probes, 200 ms
	// gossip) for a handful of replicas on one network: a probe every 200 ms answered within
	// 100 ms, membership news gossiped every 100 ms (memberlist's LAN default is 200, its
	// local one 100; shorter costs idle replicas CPU in wake-ups), a suspect declared dead
	// after 4 probe intervals (0.8 s) unless others confirm it sooner.
	probeInterval  = 200 * time.Millisecond
	probeTimeout   = 100 * time.Millisecond
	gossipInterval = 100 * time.Millisecond
	suspicionMult  = 4
	// tcpTimeout bounds one push/pull (join snapshot) connection.
	tcpTimeout = 3 * time.Second
	// lostForget is how long a dead peer is still joined again: 10 minutes, then it is taken
	// for gone (scaled down) and forgotten.
	lostForget = 10 * time.Minute
	// maxNameBytes bounds a member name, which every update carries: a host name is at
	// most 64 bytes (Linux HOST_NAME_MAX), plus the random suffix.
	maxNameBytes = 128
	// leaveTimeout bounds Close's announcement that this replica leaves.
	leaveTimeout = time.Second
)

// Options configure a Node.
type Options struct {
	// Listen is the peer port's host:port, bound for memberlist's TCP and UDP ("" host: all
	// interfaces; port 0: an ephemeral one, see Addr).
	Listen string
	// Advertise is the host:port peers reach this replica at ("": the bound address, or with
	// an unspecified host a private address of this machine, as memberlist picks it).
	Advertise string
	// Join is a static list of peers' host:port.
	Join []string
	// DNS is a headless Service name whose A/AAAA records are peers, at Listen's port.
	DNS string
	// Secret authenticates and encrypts peer traffic: 16, 24 or 32 bytes (AES-128/192/256).
	// Required.
	Secret []byte
	// Name is this replica's unique member name ("": host name plus a random suffix).
	Name string
	// Resolver answers the DNS lookups (nil: the system resolver).
	Resolver discovery.Resolver
	// Log gets the node's lines (nil: none).
	Log *zap.Logger
	// SnapshotTimeout, FlushInterval and RejoinInterval: 0 takes the defaults above.
	SnapshotTimeout time.Duration
	FlushInterval   time.Duration
	RejoinInterval  time.Duration
	// HandshakeTimeout is how long an inbound stream at the peer port may take to send its
	// frame header, and the grace its first frame gets (guard.go): 0 takes
	// DefaultHandshakeTimeout (1 s). Connections that send nothing are closed after it.
	HandshakeTimeout time.Duration
	// SettleWait is how long a long request waits, its decision sent to the peers, before
	// it goes to its backend, so that a peer's decision made at the same instant arrives and
	// the later of the two is made again with the earlier in view (settle.go): 0 takes
	// DefaultSettleWait, a negative value turns settling off.
	SettleWait time.Duration

	// wrapTransport, in tests, wraps the network transport (to drop traffic).
	wrapTransport func(memberlist.Transport) memberlist.Transport
	// tcpTimeout, in tests, replaces tcpTimeout (0: it).
	tcpTimeout time.Duration
}

// Node is one replica's membership in the peer group. Create it with New, Start it, and
// Close it when done.
type Node struct {
	o    Options
	log  *zap.Logger
	ml   *memberlist.Memberlist
	pol  *Policy
	name string
	addr string

	q           queue
	flushes     atomic.Uint64 // flusher wake-ups, for the idle test
	rejoins     atomic.Uint64 // rejoin rounds begun, for the tests that watch for joins
	samplesMsgs atomic.Uint64 // samples messages sent (once per peer), for the batching test
	pushes      atomic.Uint64 // join snapshots made (one per join push/pull), for the tests
	loads       *loadTable
	backends    atomic.Pointer[backendSet]
	m           metricSet

	// flushed, set by tests before Start (nil otherwise), is called after each flush with the
	// time it flushed at, whether a kick woke it, and how long it then sleeps short of one.
	flushed func(at time.Time, kicked bool, next time.Duration)

	mu      sync.Mutex
	members map[string]*memberlist.Node        // live peers by name: copies (copyNode)
	peers   atomic.Pointer[[]*memberlist.Node] // the same, for the flusher (livePeers)
	lost    map[string]lostPeer                // dead or left peers, joined again until lostForget
	leaving map[string]time.Time               // peers whose leaving notice came, when (kindLeaving)
	alone   bool                               // logged as without live peers
	closing atomic.Bool                        // Close has begun: the metadata says so (metaLeaving)

	// loadKick (capacity 1) is signalled by the backends when their load here changes
	// (backend.NotifyLoad), to wake the flusher; the queue's kick, when a decision is queued.
	loadKick chan struct{}

	// codec seals and opens the direct update packets (direct.go); tr is the transport
	// they are written to (memberlist's, with any wrappers); direct is whether tr hands
	// them to receiveDirect (a directPath), else updates go through memberlist.
	codec     *directCodec
	tr        memberlist.Transport
	direct    bool
	directBuf []byte       // receiveDirect's scratch (the transport's read loop's)
	mlog      *levelWriter // memberlist's log lines, and rejected direct packets'

	recvMu     sync.Mutex // the receive scratch
	recvLoads  []peerLoad
	recvHashes []uint64
	recvSample []peerSample
	recent     recentLearns // the peers' recent learned groups, for their forgets
	arrivals   arrivals     // the peers' recent decisions, for Release

	ready     chan struct{}
	readyOnce sync.Once
	merged    atomic.Bool // a peer's snapshot was taken (merge)
	stop      chan struct{}
	stopOnce  sync.Once
	wg        sync.WaitGroup
}

type lostPeer struct {
	addr  string
	since time.Time
}

// New creates the node of the prefix policy p and binds its peer port; peers' updates go into
// p's index. Route with Policy() in p's place. Errors: a bad Listen or Advertise, a secret
// that is not 16, 24 or 32 bytes, a port that cannot be bound.
func New(o Options, p *router.Prefix) (*Node, error) {
	if p == nil {
		return nil, errors.New("peering: a prefix policy is required")
	}
	if !validKeyLen(len(o.Secret)) {
		return nil, fmt.Errorf("peering: the secret is %d bytes; want 16, 24 or 32 (AES-128, -192 or -256)", len(o.Secret))
	}
	if o.SnapshotTimeout <= 0 {
		o.SnapshotTimeout = DefaultSnapshotTimeout
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.RejoinInterval <= 0 {
		o.RejoinInterval = DefaultRejoinInterval
	}
	if o.SettleWait == 0 {
		o.SettleWait = DefaultSettleWait
	}
	lg := o.Log
	if lg == nil {
		lg = zap.NewNop()
	}
	name := o.Name
	if name == "" {
		host, _ := os.Hostname()
		var suffix [4]byte
		_, _ = rand.Read(suffix[:])
		name = host + "-" + hex.EncodeToString(suffix[:])
	}
	if len(name) > maxNameBytes {
		return nil, fmt.Errorf("peering: the member name is %d bytes, over %d", len(name), maxNameBytes)
	}
	n := &Node{o: o, log: lg, name: name, loads: newLoadTable(loadTTL), members: map[string]*memberlist.Node{},
		lost: map[string]lostPeer{}, leaving: map[string]time.Time{}, ready: make(chan struct{}), stop: make(chan struct{})}
	n.q.kick = make(chan struct{}, 1)
	n.loadKick = make(chan struct{}, 1)
	n.pol = &Policy{Prefix: p, n: n}
	p.CountPeerRoutes()
	n.backends.Store(&backendSet{byID: nil})
	n.m = newMetrics(func() float64 { return float64(n.Alive()) })
	var err error
	if n.codec, err = newDirectCodec(o.Secret); err != nil {
		return nil, err
	}
	n.directBuf = make([]byte, 0, maxDirectPacket)

	conf, err := n.config()
	if err != nil {
		return nil, err
	}
	n.ml, err = memberlist.Create(conf)
	if err != nil {
		return nil, fmt.Errorf("peering: listen %s: %w", o.Listen, err)
	}
	n.addr = n.ml.LocalNode().Address()
	return n, nil
}

// config builds memberlist's configuration.
func (n *Node) config() (*memberlist.Config, error) {
	host, port, err := splitHostPort(n.o.Listen)
	if err != nil {
		return nil, fmt.Errorf("peering.listen: %w", err)
	}
	conf := memberlist.DefaultLANConfig()
	conf.Name = n.name
	conf.BindAddr, conf.BindPort = host, port
	conf.AdvertisePort = port
	if n.o.Advertise != "" {
		ah, ap, err := splitHostPort(n.o.Advertise)
		if err != nil {
			return nil, fmt.Errorf("peering.advertise: %w", err)
		}
		conf.AdvertiseAddr, conf.AdvertisePort = ah, ap
	}
	conf.SecretKey = n.o.Secret
	conf.EnableCompression = false // random hashes do not compress
	conf.UDPBufferSize = udpBufferSize
	conf.ProbeInterval, conf.ProbeTimeout = probeInterval, probeTimeout
	conf.GossipInterval, conf.SuspicionMult = gossipInterval, suspicionMult
	conf.TCPTimeout = tcpTimeout
	if n.o.tcpTimeout > 0 {
		conf.TCPTimeout = n.o.tcpTimeout
	}
	conf.Delegate = delegate{n}
	conf.Events = events{n}
	n.mlog = newLevelWriter(n.log, n.m.rejected)
	conf.Logger = log.New(n.mlog, "", 0)
	nt, err := newNetTransport(host, port, maxPacketBytes, conf.Logger)
	if err != nil {
		return nil, fmt.Errorf("peering: listen %s: %w", n.o.Listen, err)
	}
	if port == 0 {
		conf.BindPort = nt.GetAutoBindPort()
		if n.o.Advertise == "" || conf.AdvertisePort == 0 {
			conf.AdvertisePort = conf.BindPort
		}
	}
	conf.Transport = newLimitTransport(nt, n.o.HandshakeTimeout, n.dropStream)
	if n.o.wrapTransport != nil {
		conf.Transport = n.o.wrapTransport(conf.Transport)
	}
	n.tr = conf.Transport
	if d, ok := n.tr.(directPath); ok {
		n.direct = d.SetDirect(n.receiveDirect)
	}
	return conf, nil
}

// netTransportTries is how often an ephemeral port (0) is drawn again when its UDP side is
// taken (memberlist's own retry count).
const netTransportTries = 10

// newNetTransport binds the peer port's TCP and UDP on host:port (listenNet: packets up to
// maxPacket bytes, <= 0 for maxPacketBytes); port 0 draws one free for both, retried up to
// netTransportTries times.
func newNetTransport(host string, port, maxPacket int, lg *log.Logger) (*netTransport, error) {
	tries := 1
	if port == 0 {
		tries = netTransportTries
	}
	var err error
	for range tries {
		var nt *netTransport
		nt, err = listenNet(host, port, maxPacket, lg)
		if err == nil {
			return nt, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, err
}

// splitHostPort parses host:port ("" host: 0.0.0.0; no port: DefaultPort).
func splitHostPort(s string) (string, int, error) {
	if s == "" {
		return "0.0.0.0", DefaultPort, nil
	}
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		if !strings.Contains(err.Error(), "missing port") {
			return "", 0, err
		}
		host, ps = s, strconv.Itoa(DefaultPort)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", s)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// Policy is the prefix policy to route with: p's, learning for the peers as well.
func (n *Node) Policy() *Policy { return n.pol }

// Name is this replica's member name.
func (n *Node) Name() string { return n.name }

// Addr is the host:port peers reach this replica at (the bound port when Listen's was 0).
func (n *Node) Addr() string { return n.addr }

// Alive is the number of live peers (this replica not counted).
func (n *Node) Alive() int { return len(n.livePeers()) }

// Start joins the peers (taking a snapshot of one's index; Ready then says so) and starts the
// flusher and the rejoin loop, until Close or ctx is done.
func (n *Node) Start(ctx context.Context) {
	n.wg.Add(3)
	go func() { defer n.wg.Done(); n.initialJoin(ctx) }()
	go func() { defer n.wg.Done(); n.flushLoop() }()
	go func() { defer n.wg.Done(); n.rejoinLoop(ctx) }()
	go func() {
		select {
		case <-ctx.Done():
			_ = n.Close()
		case <-n.stop:
		}
	}()
}

// Ready returns nil once the replica took its starting snapshot (or gave up waiting, see the
// package comment), else an error saying what it waits for: /readyz reports it.
func (n *Node) Ready() error {
	select {
	case <-n.ready:
		return nil
	default:
		return errors.New("waiting for a peer's index snapshot (peering)")
	}
}

// WaitReady blocks until Ready or ctx is done.
func (n *Node) WaitReady(ctx context.Context) error {
	select {
	case <-n.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (n *Node) markReady() { n.readyOnce.Do(func() { close(n.ready) }) }

// Close leaves the group (peers forget this replica at once rather than after a failed
// probe) and frees the peer port. Safe to call more than once.
func (n *Node) Close() error {
	var err error
	n.stopOnce.Do(func() {
		close(n.stop)
		n.markReady()
		// The peers hear first that this replica is leaving, so that they log its
		// departure as one, not as a loss (setMember): a notice to each, and its metadata.
		// Not the metadata alone: gossiped, it reaches a peer a gossip round or more later,
		// and what of it is still queued when the leave's own message about this replica
		// is queued is dropped unsent (memberlist keeps one broadcast per node name).
		n.closing.Store(true)
		n.mlog.closing.Store(true)
		n.sendLeaving()
		_ = n.ml.UpdateNode(leaveTimeout / 2)
		_ = n.ml.Leave(leaveTimeout)
		err = n.ml.Shutdown()
	})
	n.wg.Wait()
	return err
}

// now is the node's clock.
func (n *Node) now() time.Time { return time.Now() }

var _ io.Writer = (*levelWriter)(nil)
