package peering

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
)

// idleWatch is how many of its flushes TestIdleFlusherSleeps looks at in each phase.
const idleWatch = 4

// TestIdleFlusherSleeps: peered replicas with nothing changing wake once a loadKeepalive,
// by their timer, not once a FlushInterval, whether or not a request is in flight, and send
// a keepalive load report only while one is; a Learn and a request's begin and end wake the
// flusher at once, and they reach the peer.
func TestIdleFlusherSleeps(t *testing.T) {
	rs := clusterOpts(t, 2, replicaOpts{recordFlushes: true})
	a, b := rs[0], rs[1]
	// asleep checks the flushes fs: each woken by the timer and then sleeping loadKeepalive,
	// a keepalive sent at each while busy, nothing while idle.
	asleep := func(what string, fs []flushed, busy bool) {
		t.Helper()
		for i, f := range fs {
			if f.kicked || f.next != loadKeepalive {
				t.Fatalf("%s, flush %d of %d: kicked %v, then asleep %v; want woken by the timer, asleep %v",
					what, i+1, len(fs), f.kicked, f.next, loadKeepalive)
			}
			if sent := i > 0 && f.sent != fs[i-1].sent; i > 0 && sent != busy {
				t.Fatalf("%s, flush %d of %d: a report sent %v, want %v (a keepalive only while busy)", what, i+1, len(fs), sent, busy)
			}
		}
	}
	// The first report (nothing in flight) goes out once b is a live peer, and is repeated
	// idleRepeats times a keepalive apart; then idleWatch flushes send nothing.
	var idle []flushed
	testutil.Eventually(t, wait, "a's flusher idle after its first reports", func() bool {
		fs := a.flushes.all()
		last := -1
		for i := 1; i < len(fs); i++ {
			if fs[i].sent != fs[i-1].sent {
				last = i
			}
		}
		if fs := fs[max(last, 0):]; last > 0 && len(fs) > idleWatch {
			idle = fs[:idleWatch+1] // the last report's flush, and idleWatch after it
			return true
		}
		return false
	})
	asleep("idle", idle[1:], false)
	k := prompt(t, 11)
	url := a.notRing(k)
	a.node.Policy().Learn(k, a.byName(url), 0)
	testutil.Eventually(t, wait, "b routes to what a learned while idle", func() bool { return b.holds(k, url) })

	// A request's begin reaches the peer; while it streams, nothing changes and the flusher
	// sleeps as when idle (it polled every FlushInterval before), sending keepalives; its end
	// reaches the peer.
	var l backend.Lease
	l.Begin(a.byName(url), 100, 0, true)
	testutil.Eventually(t, wait, "b sees a's request", func() bool { return b.byName(url).PeerInFlight() == 1 })
	l.FirstByte()
	testutil.Eventually(t, wait, "b sees its prefill done", func() bool { return b.byName(url).PeerPrefillTokens() == 0 })
	streaming := time.Now()
	// The flush that sent the first byte may be recorded just after: the flushes from the
	// one after it.
	from := len(a.flushes.all()) + 1
	var busy []flushed
	testutil.Eventually(t, wait, "a's flushes while the request streams", func() bool {
		fs := a.flushes.all()
		if len(fs) > from+idleWatch {
			busy = fs[from : from+idleWatch+1]
			return true
		}
		return false
	})
	asleep("streaming", busy, true)
	// The keepalives keep a's report from expiring while the request streams.
	time.Sleep(time.Until(streaming.Add(loadTTL + 2*loadKeepalive))) // the point: past the report's TTL
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
