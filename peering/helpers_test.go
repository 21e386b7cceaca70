package peering

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// wait bounds every wait on the peers (convergence takes milliseconds; failure detection
// about a second; a heal a rejoin interval and a join).
const wait = 20 * time.Second

var (
	secret = []byte("0123456789abcdef0123456789abcdef") // 32 bytes: AES-256
	other  = []byte("fedcba9876543210fedcba9876543210")
)

// backendURLs are the model-server replicas every test router is configured with; nothing
// listens there (routing decisions only).
var backendURLs = []string{"http://127.0.0.1:18001", "http://127.0.0.1:18002", "http://127.0.0.1:18003", "http://127.0.0.1:18004"}

// replica is one in-process prefixlb router: its own backends (same URLs as the others'),
// its prefix policy and its peering node on an ephemeral 127.0.0.1 port.
type replica struct {
	node *Node
	bs   []*backend.Backend
	logs *testutil.LogRecorder
	drop *dropTransport // nil unless started with dropping
	// flushes records every flush of the node's flusher (nil unless started with
	// recordFlushes).
	flushes *flushLog
}

type replicaOpts struct {
	secret   []byte
	join     []*replica
	dropping bool
	plain    bool     // a transport without the direct path (an older version's)
	listen   string   // "": 127.0.0.1:0
	joinAddr []string // join targets besides join's
	tieBreak router.TieBreak
	kvTokens int64    // each backend's KV cache, tokens (0: the default)
	urls     []string // the backends (nil: backendURLs)
	// tcpTimeout bounds a push/pull (0: peering's), snapshotTimeout the start's wait for
	// one (0: 5 s).
	tcpTimeout, snapshotTimeout time.Duration
	// recordFlushes records the flusher's flushes in replica.flushes.
	recordFlushes bool
}

func startReplica(t testing.TB, name string, ro replicaOpts) *replica {
	t.Helper()
	r := &replica{}
	urls := ro.urls
	if urls == nil {
		urls = backendURLs
	}
	for _, u := range urls {
		b, err := backend.New(u, ro.kvTokens, 1)
		if err != nil {
			t.Fatal(err)
		}
		r.bs = append(r.bs, b)
	}
	log, rec := testutil.RecordingLogger()
	r.logs = rec
	o := Options{Listen: "127.0.0.1:0", Secret: ro.secret, Name: name, Log: log,
		RejoinInterval: 200 * time.Millisecond, SnapshotTimeout: 5 * time.Second, tcpTimeout: ro.tcpTimeout}
	if ro.snapshotTimeout > 0 {
		o.SnapshotTimeout = ro.snapshotTimeout
	}
	if o.Secret == nil {
		o.Secret = secret
	}
	for _, j := range ro.join {
		o.Join = append(o.Join, j.node.Addr())
	}
	o.Join = append(o.Join, ro.joinAddr...)
	if ro.listen != "" {
		o.Listen = ro.listen
	}
	if ro.dropping {
		o.wrapTransport = func(inner memberlist.Transport) memberlist.Transport {
			r.drop = newDropTransport(inner)
			return r.drop
		}
	}
	if ro.plain {
		o.wrapTransport = func(inner memberlist.Transport) memberlist.Transport { return plainTransport{inner} }
	}
	n, err := New(o, router.NewPrefix(router.PrefixOptions{TieBreak: ro.tieBreak}, nil))
	if err != nil {
		t.Fatal(err)
	}
	r.node = n
	if ro.recordFlushes {
		r.flushes = &flushLog{}
		n.flushed = func(at time.Time, kicked bool, next time.Duration) {
			r.flushes.add(flushed{at: at, kicked: kicked, next: next, sent: n.m.bytesSent.Get()})
		}
	}
	n.Policy().SetBackends(r.bs)
	ctx, cancel := context.WithCancel(context.Background())
	n.Start(ctx)
	t.Cleanup(func() {
		cancel()
		_ = n.Close()
	})
	return r
}

// byName returns r's backend of url.
func (r *replica) byName(url string) *backend.Backend {
	for _, b := range r.bs {
		if b.Name == url {
			return b
		}
	}
	return nil
}

// prompt returns the key of a chat request whose prompt is unique to seed, of about 40
// chunks.
func prompt(t testing.TB, seed int) *key.Key {
	t.Helper()
	// The seed opens the text: prompts differ from their first chunk (4 tokens: the role and
	// the text's first bytes), so that no two share one.
	text := strings.Repeat(fmt.Sprintf("%d: conversation says something long enough to fill chunks. ", seed), 160)
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": text}}})
	k := &key.Key{}
	key.NewBuilder(0).Build([]byte("/v1/chat/completions"), body, k)
	if !k.OK || len(k.Chunks) < 10 {
		t.Fatalf("prompt %d: ok %v, %d chunks", seed, k.OK, len(k.Chunks))
	}
	return k
}

// pick routes k on r among all its backends.
func (r *replica) pick(k *key.Key) router.Decision { return r.node.Policy().Pick(k, r.bs) }

// holds reports whether r routes k to url because url holds all of k.
func (r *replica) holds(k *key.Key, url string) bool {
	d := r.pick(k)
	return d.Backend.Name == url && d.Reason == router.ReasonMatch && d.MatchedChunks == len(k.Chunks)
}

// barrier waits (bounded) until to has applied what from's flusher sends from now on: a
// request from begins on url and ends, and to sees both. One flusher sends a replica's
// updates in order and one read loop applies them in order (loopback UDP keeps it), so what
// from sent before has arrived, or was lost, by then: what a sleep's "time for it to
// arrive" waited for, without the sleep.
func barrier(t *testing.T, from, to *replica, url string) {
	t.Helper()
	before := to.byName(url).PeerInFlight()
	var l backend.Lease
	l.Begin(from.byName(url), 1, 0, false)
	testutil.Eventually(t, wait, "the barrier's request reaches the peer", func() bool { return to.byName(url).PeerInFlight() == before+1 })
	l.Release()
	testutil.Eventually(t, wait, "the barrier's end reaches the peer", func() bool { return to.byName(url).PeerInFlight() == before })
}

// flushed is one flush of a replica's flusher (Node.flushed).
type flushed struct {
	at     time.Time     // when it flushed
	kicked bool          // a kick woke it, not its timer
	next   time.Duration // the sleep it then chose, short of a kick
	sent   uint64        // the replica's update bytes sent so far, this flush's included
}

// flushLog is the flushes of a replica's flusher so far.
type flushLog struct {
	mu sync.Mutex
	fs []flushed
}

func (l *flushLog) add(f flushed) {
	l.mu.Lock()
	l.fs = append(l.fs, f)
	l.mu.Unlock()
}

// all returns the flushes so far.
func (l *flushLog) all() []flushed {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]flushed(nil), l.fs...)
}

// flushedSince waits (bounded) until r's flusher has flushed at or after at, and returns
// that flush: whatever that flush would send is sent by then.
func (r *replica) flushedSince(t *testing.T, at time.Time) flushed {
	t.Helper()
	var f flushed
	testutil.Eventually(t, wait, "a flush of "+r.node.Name(), func() bool {
		fs := r.flushes.all()
		i := slices.IndexFunc(fs, func(f flushed) bool { return !f.at.Before(at) })
		if i < 0 {
			return false
		}
		f = fs[i]
		return true
	})
	return f
}

// notRing returns a backend URL other than the one r places k on cold: learning k there is
// something no peer could guess.
func (r *replica) notRing(k *key.Key) string {
	cold := r.pick(k).Backend.Name
	for _, u := range backendURLs {
		if u != cold {
			return u
		}
	}
	return ""
}

// metric returns the value of a metric line of r's WriteMetrics ("" if absent).
func (r *replica) metric(name string) string {
	var sb strings.Builder
	r.node.WriteMetrics(&sb)
	for _, line := range strings.Split(sb.String(), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	return ""
}

// kill stops r as a crash would: no leave message, the port closed.
func (r *replica) kill() { r.node.Crash() }

// plainTransport is a network transport with memberlist's methods only: no direct path.
type plainTransport struct{ memberlist.Transport }

// dropTransport is a network transport that, while drop is set, loses every packet and
// refuses every stream both ways: a peer cut off by a partition.
type dropTransport struct {
	inner memberlist.Transport
	drop  atomic.Bool
	// failDirect makes every write of a direct update packet fail (memberlist's own
	// packets still go out, so the peers stay members).
	failDirect atomic.Bool
	packets    chan *memberlist.Packet
	streams    chan net.Conn
	done       chan struct{}
}

func newDropTransport(inner memberlist.Transport) *dropTransport {
	d := &dropTransport{inner: inner, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
	// inner's channels are never closed: both loops end at Shutdown.
	go func() {
		for {
			var p *memberlist.Packet
			select {
			case p = <-inner.PacketCh():
			case <-d.done:
				return
			}
			if !d.drop.Load() {
				select {
				case d.packets <- p:
				case <-d.done:
					return
				}
			}
		}
	}()
	go func() {
		for {
			var c net.Conn
			select {
			case c = <-inner.StreamCh():
			case <-d.done:
				return
			}
			if d.drop.Load() {
				_ = c.Close()
				continue
			}
			select {
			case d.streams <- c:
			case <-d.done:
				_ = c.Close()
				return
			}
		}
	}()
	return d
}

func (d *dropTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	a, p, err := d.inner.FinalAdvertiseAddr(ip, port)
	return a, p, err
}

func (d *dropTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if d.failDirect.Load() && len(b) > 0 && b[0] == directMagic {
		return time.Time{}, fmt.Errorf("write to %s: refused", addr)
	}
	if d.drop.Load() {
		return time.Now(), nil
	}
	return d.inner.WriteTo(b, addr)
}

func (d *dropTransport) PacketCh() <-chan *memberlist.Packet { return d.packets }

// SetDirect passes h on, losing the direct packets too while drop is set.
func (d *dropTransport) SetDirect(h directHandler) bool {
	return d.inner.(directPath).SetDirect(func(p []byte, from netip.AddrPort) {
		if !d.drop.Load() {
			h(p, from)
		}
	})
}

func (d *dropTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if d.drop.Load() {
		return nil, fmt.Errorf("partitioned: %s", addr)
	}
	return d.inner.DialTimeout(addr, timeout)
}

func (d *dropTransport) StreamCh() <-chan net.Conn { return d.streams }

func (d *dropTransport) Shutdown() error {
	close(d.done)
	return d.inner.Shutdown()
}
