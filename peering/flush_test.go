package peering

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
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
	// The first report (nothing in flight) goes out once b is a live peer, and is repeated
	// idleRepeats times a keepalive apart.
	testutil.Eventually(t, wait, "a's first load report", func() bool { return a.node.m.bytesSent.Get() > 0 })
	time.Sleep((idleRepeats+1)*loadKeepalive + 50*time.Millisecond) // the point: past the repeats, into idleness
	before, sent := a.node.flushes.Load(), a.node.m.bytesSent.Get()
	time.Sleep(idleWatch) // the point: the window whose wake-ups are counted
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
	time.Sleep(idleWatch) // the point: the window whose wake-ups are counted
	woke = a.node.flushes.Load() - before
	if limit := uint64(idleWatch/loadKeepalive) * 3; woke > limit {
		t.Fatalf("flusher woke %d times in %v with a request streaming; want at most %d (one per %v)", woke, idleWatch, limit, loadKeepalive)
	}
	// The keepalives keep a's report from expiring while the request streams.
	time.Sleep(loadTTL + 2*loadKeepalive - idleWatch) // the point: past the report's TTL
	if got := b.byName(url).PeerInFlight(); got != 1 {
		t.Fatalf("b counts %d of a's requests after %v of streaming, want 1 (a's report expired: no keepalive)", got, loadTTL+2*loadKeepalive)
	}
	l.Release()
	testutil.Eventually(t, wait, "b sees a's request end", func() bool { return b.byName(url).PeerInFlight() == 0 })
}

// TestFlusherWiring: a Learn signals the flusher's decision kick, a lease's begin, first
// byte and end on a backend of the peered policy its load kick; a backend the policy no
// longer holds (a reload replaced it) neither. The node is not started, so nothing takes the kick but the test.
func TestFlusherWiring(t *testing.T) {
	log, _ := testutil.RecordingLogger()
	n, err := New(Options{Listen: "127.0.0.1:0", Secret: secret, Name: "w", Log: log}, router.NewPrefix(router.PrefixOptions{}, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	mk := func() *backend.Backend {
		b, err := backend.New(backendURLs[0], 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	old := mk()
	n.Policy().SetBackends([]*backend.Backend{old})
	kicked := func(c chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	var l backend.Lease
	for _, step := range []struct {
		name       string
		do         func()
		load, told bool // loadKick, the queue's kick
	}{
		{"begin", func() { l.Begin(old, 100, 100, true) }, true, false},
		{"first byte", l.FirstByte, true, false},
		{"release", l.Release, true, false},
		{"learn", func() { n.Policy().Learn(prompt(t, 1), old, 0) }, false, true},
		{"begin before the reload", func() { l.Begin(old, 100, 100, true) }, true, false},
		{"reload with a new backend of the same URL", func() { n.Policy().SetBackends([]*backend.Backend{mk()}) }, false, false},
		{"the replaced backend's release", l.Release, false, false},
	} {
		step.do()
		if load, told := kicked(n.loadKick), kicked(n.q.kick); load != step.load || told != step.told {
			t.Errorf("%s: load kick %v, decision kick %v; want %v, %v", step.name, load, told, step.load, step.told)
		}
	}
	set := n.backends.Load()
	l.Begin(set.list[0], 100, 100, true)
	if !kicked(n.loadKick) {
		t.Error("the new backend's begin: not kicked")
	}
	l.Release()
}

// TestRemovedBackendReportedIdle: a backend a replica no longer holds, whose last report was
// busy, is reported idle once, while the replica's keepalives go on for another backend
// (the peers merge reports by backend, so without it they would count its requests for as
// long as the replica stays busy).
func TestRemovedBackendReportedIdle(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	x, y := backendURLs[0], backendURLs[1]
	var lx, ly backend.Lease
	lx.Begin(a.byName(x), 100, 0, true)
	ly.Begin(a.byName(y), 100, 0, true)
	defer lx.Release()
	defer ly.Release()
	testutil.Eventually(t, wait, "b sees a's requests", func() bool {
		return b.byName(x).PeerInFlight() == 1 && b.byName(y).PeerInFlight() == 1
	})
	var keep []*backend.Backend
	for _, be := range a.bs {
		if be.Name != x {
			keep = append(keep, be)
		}
	}
	a.node.Policy().SetBackends(keep)
	testutil.Eventually(t, wait, "b stops counting a's request on the backend a dropped", func() bool { return b.byName(x).PeerInFlight() == 0 })
	time.Sleep(loadTTL + 2*loadKeepalive) // the point: past the report's TTL, which keepalives must renew
	if got := b.byName(y).PeerInFlight(); got != 1 {
		t.Fatalf("b counts %d of a's requests on the backend a kept, want 1", got)
	}
}

// TestLoadOfUnreportedBackendExpires: a backend a peer stops reporting (removed there, its
// idle record lost) stops counting a load TTL after its last report, though the peer goes on
// reporting the others.
func TestLoadOfUnreportedBackendExpires(t *testing.T) {
	x, err := backend.New(backendURLs[0], 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	y, err := backend.New(backendURLs[1], 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[uint64]*backend.Backend{x.ID: x, y.ID: y}
	tab := newLoadTable(loadTTL)
	t0 := time.Unix(1_800_000_000, 0)
	tab.report("a", []peerLoad{{id: x.ID, inFlight: 3}, {id: y.ID, inFlight: 2}}, t0, byID)
	var now time.Time
	for now = t0; now.Sub(t0) <= loadTTL+loadKeepalive; now = now.Add(loadKeepalive) {
		tab.report("a", []peerLoad{{id: y.ID, inFlight: 2}}, now, byID)
		tab.apply(byID, now)
	}
	if x.PeerInFlight() != 0 || y.PeerInFlight() != 2 {
		t.Fatalf("after %s: x counts %d of a's requests (want 0), y %d (want 2)", now.Sub(t0), x.PeerInFlight(), y.PeerInFlight())
	}
}
