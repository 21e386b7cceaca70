package peering

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// idleWatch is how long TestIdleFlusherSleeps counts wake-ups: 500 FlushIntervals.
const idleWatch = 500 * time.Millisecond

// TestIdleFlusherSleeps: peered replicas with nothing changing wake about once a
// loadKeepalive, not once a FlushInterval, whether or not a request is in flight, and send
// a keepalive load report only while one is; a Learn and a request's begin and end wake the
// flusher at once, and they reach the peer.
func TestIdleFlusherSleeps(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	// The first report (nothing in flight) goes out once b is a live peer.
	testutil.Eventually(t, wait, "a's first load report", func() bool { return a.node.m.bytesSent.Get() > 0 })
	before, sent := a.node.flushes.Load(), a.node.m.bytesSent.Get()
	time.Sleep(idleWatch)
	woke := a.node.flushes.Load() - before
	// 5 wake-ups in 500 ms, with slack for a late timer; a 1 ms ticker would wake ~500 times.
	if limit := uint64(idleWatch/loadKeepalive) * 3; woke > limit {
		t.Fatalf("idle flusher woke %d times in %v; want at most %d (one per %v)", woke, idleWatch, limit, loadKeepalive)
	}
	if got := a.node.m.bytesSent.Get() - sent; got != 0 {
		t.Fatalf("idle replica sent %d bytes in %v; want none (a report of nothing in flight needs no keepalive)", got, idleWatch)
	}
	k := prompt(t, 11)
	url := a.notRing(k)
	a.node.Policy().Learn(k, a.byName(url), 0)
	testutil.Eventually(t, wait, "b routes to what a learned while idle", func() bool { return b.holds(k, url) })

	// A request's begin reaches the peer; while it streams, nothing changes and the flusher
	// sleeps as when idle (it polled every FlushInterval before); its end reaches the peer.
	var l backend.Lease
	l.Begin(a.byName(url), 100, 0, true)
	testutil.Eventually(t, wait, "b sees a's request", func() bool { return b.byName(url).PeerInFlight() == 1 })
	l.FirstByte()
	testutil.Eventually(t, wait, "b sees its prefill done", func() bool { return b.byName(url).PeerPrefillTokens() == 0 })
	before, sent = a.node.flushes.Load(), a.node.m.bytesSent.Get()
	time.Sleep(idleWatch)
	woke = a.node.flushes.Load() - before
	if limit := uint64(idleWatch/loadKeepalive) * 3; woke > limit {
		t.Fatalf("flusher woke %d times in %v with a request streaming; want at most %d (one per %v)", woke, idleWatch, limit, loadKeepalive)
	}
	if a.node.m.bytesSent.Get() == sent {
		t.Fatalf("no keepalive in %v with a request in flight (its report would expire after %v)", idleWatch, loadTTL)
	}
	l.Release()
	testutil.Eventually(t, wait, "b sees a's request end", func() bool { return b.byName(url).PeerInFlight() == 0 })
}
