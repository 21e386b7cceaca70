package peering

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// flood holds idle TCP connections to a peer port, as an attacker without the secret does:
// conns from each of sources, each reopened as soon as the port closes it, after sending
// first (nil: nothing). It stops at the test's end, or after 3×wait.
type flood struct {
	opened   atomic.Int64 // connections opened, reopenings included
	dialErrs atomic.Int64
}

func startFlood(t *testing.T, addr string, sources []netip.Addr, perSource int, first []byte) *flood {
	t.Helper()
	f := &flood{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*wait)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, src := range sources {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: time.Second}
		for range perSource {
			wg.Go(func() {
				for ctx.Err() == nil {
					c, err := d.DialContext(ctx, "tcp", addr)
					if err != nil {
						f.dialErrs.Add(1)
						pause(ctx, 50*time.Millisecond)
						continue
					}
					f.opened.Add(1)
					stop := context.AfterFunc(ctx, func() { _ = c.Close() })
					began := time.Now()
					if len(first) > 0 {
						_, _ = c.Write(first)
					}
					_, _ = io.Copy(io.Discard, c) // until the port closes it
					stop()
					_ = c.Close()
					if time.Since(began) < 50*time.Millisecond {
						pause(ctx, 50*time.Millisecond) // refused at once: no busy loop
					}
				}
			})
		}
	}
	return f
}

// pause waits d or until ctx is done.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// loopbackSources are k source addresses of 127.0.0.0/8 from 127.0.0.2 on (127.0.0.1 is the
// replicas').
func loopbackSources(k int) []netip.Addr {
	out := make([]netip.Addr, k)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)})
	}
	return out
}

// frameHeader is the start of an encrypted memberlist stream announcing a frame of size
// bytes: what a sender without the secret can still send.
func frameHeader(size uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{streamEncrypted}, size)
}

// TestJoinThroughFloodedPeerPort: a replica joins through a peer whose peer port holds 72
// connections from senders without the secret, reopened as they close (idle; or a frame
// header and then nothing), and is ready on that peer's snapshot: the connections do not
// hold the port's stream slots.
func TestJoinThroughFloodedPeerPort(t *testing.T) {
	for _, tc := range []struct {
		name    string
		first   []byte
		reasons []dropReason // what a counts them as
	}{
		{"idle", nil, []dropReason{dropIdle}},
		{"small header then idle", frameHeader(1000), []dropReason{dropSlow}},
		// 8 at a time have a slot and are slow; the others wait for one in vain.
		{"large header then idle", frameHeader(4 << 20), []dropReason{dropSlow, dropBusy}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startReplica(t, "a", replicaOpts{})
			const prompts = 20
			urls := make([]string, prompts)
			for i := range prompts {
				k := prompt(t, 7000+i)
				urls[i] = a.notRing(k)
				a.node.Policy().Learn(k, a.byName(urls[i]), 0)
			}
			testutil.Eventually(t, wait, "a's flusher took the learns", func() bool { return a.node.q.size.Load() == 0 })
			// 9 sources × 8: each within the per-source limit, 72 in all, what filled the
			// 8 stream slots and the 64 waiting for one.
			f := startFlood(t, a.node.Addr(), loopbackSources(9), 8, tc.first)
			testutil.Eventually(t, wait, "72 connections open", func() bool { return f.opened.Load() >= 72 })
			b := startReplica(t, "b", replicaOpts{join: []*replica{a}, snapshotTimeout: wait})
			ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
			defer cancel()
			if err := b.node.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			if !b.node.merged.Load() {
				t.Fatalf("b ready without a's snapshot (alive %d); its log: %v", b.node.Alive(), b.logs.WithMessage("peering: no peer answered; ready with an empty index"))
			}
			for i := range prompts {
				if k := prompt(t, 7000+i); !b.holds(k, urls[i]) {
					t.Fatalf("prompt %d: ready without a's prefix", i)
				}
			}
			testutil.Eventually(t, wait, "b sees a alive", func() bool { return b.node.Alive() == 1 })
			// a drops the flood's connections, counted by reason, in a few log lines.
			dropped := func() int {
				n := 0
				for _, r := range tc.reasons {
					v, _ := strconv.Atoi(a.metric(`prefixlb_peer_streams_dropped_total{reason="` + string(r) + `"}`))
					n += v
				}
				return n
			}
			testutil.Eventually(t, wait, "the flood's connections dropped", func() bool { return dropped() >= 72 })
			lines := len(a.logs.WithMessage("peering: inbound stream dropped"))
			if lines == 0 || lines > 10*len(tc.reasons) {
				t.Fatalf("%d lines for %d streams dropped, want a few (a line a second per reason)", lines, dropped())
			}
			if f.dialErrs.Load() > 0 {
				t.Logf("%d dials failed", f.dialErrs.Load())
			}
		})
	}
}

// TestJoinMovesPastStuckTargets: a replica whose first join targets accept and never
// answer (frozen replicas, or ports flooded as above) joins the next one without waiting
// out their push/pull timeout, and is ready on its snapshot.
func TestJoinMovesPastStuckTargets(t *testing.T) {
	c := startReplica(t, "c", replicaOpts{})
	k := prompt(t, 7100)
	url := c.notRing(k)
	c.node.Policy().Learn(k, c.byName(url), 0)
	testutil.Eventually(t, wait, "c's flusher took the learn", func() bool { return c.node.q.size.Load() == 0 })
	var stuck []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the kernel does), never reads
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		stuck = append(stuck, ln.Addr().String())
	}
	// A push/pull with a stuck target would wait 2×wait; the start waits wait for a snapshot.
	b := startReplica(t, "b", replicaOpts{joinAddr: append(stuck, c.node.Addr()), tcpTimeout: 2 * wait, snapshotTimeout: wait})
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	if err := b.node.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.node.merged.Load() || !b.holds(k, url) {
		t.Fatalf("b ready without c's snapshot (merged %v)", b.node.merged.Load())
	}
}
