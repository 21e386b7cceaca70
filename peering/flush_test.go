package peering

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// TestFlushActive: the flusher ticks every FlushInterval only with something to tell or a
// local request in flight.
func TestFlushActive(t *testing.T) {
	for _, c := range []struct {
		items    int
		changed  bool
		inFlight int64
		want     bool
	}{
		{0, false, 0, false},
		{1, false, 0, true},
		{0, true, 0, true},
		{0, false, 1, true},
		{3, true, 2, true},
	} {
		if got := flushActive(c.items, c.changed, c.inFlight); got != c.want {
			t.Errorf("flushActive(%d, %v, %d) = %v, want %v", c.items, c.changed, c.inFlight, got, c.want)
		}
	}
}

// idleWatch is how long TestIdleFlusherSleeps counts wake-ups: 500 FlushIntervals.
const idleWatch = 500 * time.Millisecond

// TestIdleFlusherSleeps: peered replicas with nothing in flight and nothing learned wake
// about once a loadKeepalive (the keepalive load report), not once a FlushInterval; a Learn
// wakes the flusher at once, and what was learned still reaches the peer.
func TestIdleFlusherSleeps(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	before := a.node.flushes.Load()
	time.Sleep(idleWatch)
	woke := a.node.flushes.Load() - before
	// 5 keepalives in 500 ms, with slack for a late timer; a 1 ms ticker would wake ~500 times.
	if limit := uint64(idleWatch/loadKeepalive) * 3; woke > limit {
		t.Fatalf("idle flusher woke %d times in %v; want at most %d (one per %v)", woke, idleWatch, limit, loadKeepalive)
	}
	k := prompt(t, 11)
	url := a.notRing(k)
	a.node.Policy().Learn(k, a.byName(url), 0)
	testutil.Eventually(t, wait, "b routes to what a learned while idle", func() bool { return b.holds(k, url) })

	// A request in flight keeps the flusher ticking, and its end reaches the peer.
	var l backend.Lease
	l.Begin(a.byName(url), 100, 0, true)
	testutil.Eventually(t, wait, "b sees a's request", func() bool { return b.byName(url).PeerInFlight() == 1 })
	l.Release()
	testutil.Eventually(t, wait, "b sees a's request end", func() bool { return b.byName(url).PeerInFlight() == 0 })
}
