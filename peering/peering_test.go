package peering

import (
	"context"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// cluster starts n peered replicas, each joining the first, and waits until every one sees
// all the others.
func cluster(t *testing.T, n int) []*replica {
	t.Helper()
	return clusterOpts(t, n, replicaOpts{})
}

// clusterOpts is cluster with each replica started with ro (its join list replaced).
func clusterOpts(t *testing.T, n int, ro replicaOpts) []*replica {
	t.Helper()
	ro.join = nil
	rs := []*replica{startReplica(t, "r0", ro)}
	for i := 1; i < n; i++ {
		ro.join = rs[:1]
		rs = append(rs, startReplica(t, fmt.Sprintf("r%d", i), ro))
	}
	for i, r := range rs {
		testutil.Eventually(t, wait, fmt.Sprintf("r%d sees %d peers", i, n-1), func() bool { return r.node.Alive() == n-1 })
	}
	return rs
}

// TestPeersConverge: a prefix one replica learned on a backend the ring would not pick is
// routed there, as a match of every chunk, by each other replica: with two and with three.
func TestPeersConverge(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			rs := cluster(t, n)
			for src := range rs {
				k := prompt(t, 100*n+src)
				url := rs[src].notRing(k)
				if l := rs[src].node.Policy().Learn(k, rs[src].byName(url), 0); l == 0 {
					t.Fatal("nothing learned")
				}
				for dst, r := range rs {
					testutil.Eventually(t, wait, fmt.Sprintf("r%d routes r%d's prefix to %s by match", dst, src, url),
						func() bool { return r.holds(k, url) })
				}
			}
			if got := rs[0].metric("prefixlb_peer_updates_sent_total"); got != fmt.Sprint(n-1) {
				t.Fatalf("r0 sent %s updates, want one per peer (%d)", got, n-1)
			}
			if got := rs[1].metric("prefixlb_peer_updates_received_total"); got != fmt.Sprint(n-1) {
				t.Fatalf("r1 received %s updates, want one from each other replica (%d): nothing is forwarded", got, n-1)
			}
		})
	}
}

// TestPeerLoadInCost: requests in flight through one replica count in another's cost
// estimate (queued prefill tokens, in-flight for the cap) until they end.
func TestPeerLoadInCost(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	url := backendURLs[2]
	var ls [3]backend.Lease
	for i := range ls {
		ls[i].Begin(a.byName(url), 5000, 0, true)
	}
	k := prompt(t, 7)
	queued := func() (int64, int64) {
		for j, c := range b.node.Policy().Explain(k, b.bs) {
			if b.bs[j].Name == url {
				return c.QueuedTokens, c.InFlight
			}
		}
		return -1, -1
	}
	// The reported 15000 tokens drain from the report at the replica's rate (10k tokens/s
	// unlearned, so for 1.5 s): the estimate counts what is left of them.
	testutil.Eventually(t, wait, "b's estimate counts a's 3 requests and 15000 prefill tokens", func() bool {
		q, inf := queued()
		return q > 0 && q <= 15000 && inf == 3 && b.byName(url).PeerPrefillTokens() == 15000
	})
	if p := b.byName(url).PeerInFlight(); p != 3 {
		t.Fatalf("PeerInFlight %d", p)
	}
	ls[0].FirstByte()
	for i := range ls {
		ls[i].Release()
	}
	testutil.Eventually(t, wait, "a's finished requests no longer count on b", func() bool {
		q, inf := queued()
		return q == 0 && inf == 0
	})
}

// TestBadSecret: a replica with another secret is not a member, and what it sends never
// lands in the others' indexes.
func TestBadSecret(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	bad := startReplica(t, "bad", replicaOpts{secret: other, join: rs[:1]})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := bad.node.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// It learns a prefix and sends it straight to a's peer port as an update.
	k := prompt(t, 1)
	url := a.notRing(k)
	bad.node.Policy().Learn(k, bad.byName(url), 0)
	it, hs := bad.node.q.take(nil, nil)
	pkts := bad.node.encode(nil, nil, it, hs)
	for _, pkt := range pkts {
		if err := bad.node.ml.SendToAddress(memberlist.Address{Addr: a.node.Addr(), Name: a.node.Name()}, pkt); err != nil {
			t.Fatal(err)
		}
	}
	// Then b, a member, sends one: once it has arrived, the earlier injection would have too.
	k2 := prompt(t, 2)
	url2 := a.notRing(k2)
	b.node.Policy().Learn(k2, b.byName(url2), 0)
	testutil.Eventually(t, wait, "a gets b's update", func() bool { return a.holds(k2, url2) })
	if a.holds(k, url) || a.pick(k).MatchedChunks != 0 {
		t.Fatal("a recorded the update of a replica with another secret")
	}
	// The same update as a direct packet (direct.go), sealed under the other secret's key.
	rejected := func() int { v, _ := strconv.Atoi(a.metric("prefixlb_peer_packets_rejected_total")); return v }
	before := rejected()
	host, port, err := splitHostPort(a.node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	to := &memberlist.Node{Name: a.node.Name(), Addr: net.ParseIP(host), Port: uint16(port), Meta: []byte{metaDirect}}
	for _, pkt := range pkts {
		if _, err := bad.node.sendUpdate(nil, to, pkt); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, wait, "a rejects the direct packet", func() bool { return rejected() > before })
	// Its own line (rejoins of bad, which a cannot decrypt either, count as rejected too).
	testutil.Eventually(t, wait, "a logs the direct packet refused", func() bool {
		for _, e := range a.logs.WithMessage("peering: rejected update packet") {
			if e.Fields["from"] == bad.node.Addr() {
				return true
			}
		}
		return false
	})
	if a.holds(k, url) || a.pick(k).MatchedChunks != 0 {
		t.Fatal("a recorded the direct update of a replica with another secret")
	}
	if a.node.Alive() != 1 || bad.node.Alive() != 0 || a.node.ml.NumMembers() != 2 {
		t.Fatalf("members: a sees %d peers (%d members), bad sees %d", a.node.Alive(), a.node.ml.NumMembers(), bad.node.Alive())
	}
	if got := a.metric("prefixlb_peer_updates_received_total"); got != "1" {
		t.Fatalf("a received %s updates, want only b's", got)
	}
}

// TestSendErrorsNotCountedAsSent: an update packet whose send fails counts in
// prefixlb_peer_send_errors_total, and the update it held is not counted as sent.
func TestSendErrorsNotCountedAsSent(t *testing.T) {
	a := startReplica(t, "a", replicaOpts{dropping: true})
	b := startReplica(t, "b", replicaOpts{join: []*replica{a}})
	testutil.Eventually(t, wait, "a and b see each other", func() bool { return a.node.Alive() == 1 && b.node.Alive() == 1 })
	a.drop.failDirect.Store(true)
	k := prompt(t, 1)
	url := a.notRing(k)
	a.node.Policy().Learn(k, a.byName(url), 0)
	// The flush that took it has ended once a later one has begun (one flusher goroutine).
	testutil.Eventually(t, wait, "the flusher takes the update", func() bool { return a.node.q.size.Load() == 0 })
	f0 := a.node.flushes.Load()
	testutil.Eventually(t, wait, "that flush ends", func() bool { return a.node.flushes.Load() >= f0+2 })
	if a.metric("prefixlb_peer_send_errors_total") == "0" {
		t.Fatal("the failed send not counted")
	}
	if got := a.metric("prefixlb_peer_updates_sent_total"); got != "0" {
		t.Fatalf("updates sent %s after a failed send, want 0", got)
	}
	a.drop.failDirect.Store(false)
	k2 := prompt(t, 2)
	url2 := a.notRing(k2)
	a.node.Policy().Learn(k2, a.byName(url2), 0)
	testutil.Eventually(t, wait, "b gets the next update", func() bool { return b.holds(k2, url2) })
	// Counted once the flush's sends have returned, which may be after b applied it.
	testutil.Eventually(t, wait, "the update that went out counted", func() bool {
		return a.metric("prefixlb_peer_updates_sent_total") == "1"
	})
	if b.holds(k, url) {
		t.Fatal("b holds the prompt whose update was never sent")
	}
}

// TestOlderPeerThroughMemberlist: a replica without the direct path (an older version,
// during a rolling update) says so in its metadata, and updates go both ways through
// memberlist between it and a replica that has the path.
func TestOlderPeerThroughMemberlist(t *testing.T) {
	old := startReplica(t, "old", replicaOpts{plain: true})
	b := startReplica(t, "b", replicaOpts{join: []*replica{old}})
	testutil.Eventually(t, wait, "old and b see each other", func() bool { return old.node.Alive() == 1 && b.node.Alive() == 1 })
	if old.node.direct || !b.node.direct {
		t.Fatalf("direct path: old %v, b %v; want false, true", old.node.direct, b.node.direct)
	}
	for _, m := range b.node.livePeers() {
		if takesDirect(m.Meta) {
			t.Fatalf("b reads %s as taking direct packets (meta %v)", m.Name, m.Meta)
		}
	}
	for i, c := range []struct{ from, to *replica }{{b, old}, {old, b}} {
		k := prompt(t, i+1)
		url := c.to.notRing(k)
		c.from.node.Policy().Learn(k, c.from.byName(url), 0)
		testutil.Eventually(t, wait, "the update arrives", func() bool { return c.to.holds(k, url) })
	}
	if got := b.metric("prefixlb_peer_packets_rejected_total"); got != "0" {
		t.Fatalf("b rejected %s packets", got)
	}
	if got := old.metric("prefixlb_peer_packets_rejected_total"); got != "0" {
		t.Fatalf("old rejected %s packets: sent direct packets it cannot take", got)
	}
}

// TestPeerKilled: a replica that dies without a word is declared dead by the others, its
// in-flight requests stop counting, the metric and one log line say so, and the survivors
// keep sharing what they learn.
func TestPeerKilled(t *testing.T) {
	rs := cluster(t, 3)
	a, b, c := rs[0], rs[1], rs[2]
	url := backendURLs[1]
	var l backend.Lease
	l.Begin(c.byName(url), 1000, 0, true)
	testutil.Eventually(t, wait, "a sees c's request", func() bool { return a.byName(url).PeerInFlight() == 1 })
	c.kill()
	for _, r := range []*replica{a, b} {
		testutil.Eventually(t, wait, "c declared dead", func() bool {
			return r.node.Alive() == 1 && r.metric("prefixlb_peers_alive") == "1"
		})
	}
	if a.byName(url).PeerInFlight() != 0 {
		t.Fatal("a dead peer's in-flight requests still count")
	}
	k := prompt(t, 3)
	dst := a.notRing(k)
	a.node.Policy().Learn(k, a.byName(dst), 0)
	testutil.Eventually(t, wait, "b still gets a's updates", func() bool { return b.holds(k, dst) })
	if n := len(a.logs.WithMessage("peering: no live peers; routing on this replica's own state")); n != 0 {
		t.Fatalf("a logged %d losses of all peers with b alive", n)
	}
	if lost := a.logs.WithMessage("peering: peer lost"); len(lost) != 1 || lost[0].Fields["peer"] != c.node.Name() {
		t.Fatalf("a logged %v for c's death; want one line naming it", lost)
	}
	l.Release()
}

// TestPeerLeaves: a replica's arrival is a line on its peers ("peer joined"); one that closes
// says so first, and its peers log its departure at info as "peer left" (and the loss of the
// last peer at info too), never as a loss, which a crash still is (TestPeerKilled); its
// in-flight requests stop counting.
func TestPeerLeaves(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	if joined := a.logs.WithMessage("peering: peer joined"); len(joined) != 1 || joined[0].Fields["peer"] != b.node.Name() {
		t.Fatalf("a logged %v for b's arrival; want one line naming it", joined)
	}
	url := backendURLs[1]
	var l backend.Lease
	l.Begin(b.byName(url), 1000, 0, true)
	defer l.Release()
	testutil.Eventually(t, wait, "a sees b's request", func() bool { return a.byName(url).PeerInFlight() == 1 })
	if err := b.node.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, "a sees b gone", func() bool { return a.node.Alive() == 0 })
	if a.byName(url).PeerInFlight() != 0 {
		t.Fatal("a departed peer's in-flight requests still count")
	}
	left := a.logs.WithMessage("peering: peer left")
	if len(left) != 1 || left[0].Fields["peer"] != b.node.Name() || left[0].Level != zapcore.InfoLevel {
		t.Fatalf("a logged %v for b's departure; want one info line naming it", left)
	}
	if left[0].Fields["by"] != "notice" { // Close sends it before memberlist's leave
		t.Fatalf("a knew of b's departure by %v; want its leaving notice", left[0].Fields["by"])
	}
	if lost := a.logs.WithMessage("peering: peer lost"); len(lost) != 0 {
		t.Fatalf("a logged %v: a departure taken for a loss", lost)
	}
	alone := a.logs.WithMessage("peering: no live peers; routing on this replica's own state")
	if len(alone) != 1 || alone[0].Level != zapcore.InfoLevel {
		t.Fatalf("a logged %v on its last peer's departure; want one info line", alone)
	}
}

// TestPartitionHeal: a replica whose traffic is dropped both ways is declared dead; it keeps
// routing on its own state and logs it; once the traffic flows again all rejoin and what was
// learned on either side meanwhile is known on both.
func TestPartitionHeal(t *testing.T) {
	a := startReplica(t, "a", replicaOpts{})
	b := startReplica(t, "b", replicaOpts{join: []*replica{a}})
	c := startReplica(t, "c", replicaOpts{join: []*replica{a}, dropping: true})
	for _, r := range []*replica{a, b, c} {
		testutil.Eventually(t, wait, "joined", func() bool { return r.node.Alive() == 2 })
	}
	c.drop.drop.Store(true)
	testutil.Eventually(t, wait, "c cut off", func() bool {
		return a.node.Alive() == 1 && b.node.Alive() == 1 && c.node.Alive() == 0
	})
	testutil.Eventually(t, wait, "c logs that it is alone", func() bool {
		return len(c.logs.WithMessage("peering: no live peers; routing on this replica's own state")) == 1
	})
	if c.metric("prefixlb_peers_alive") != "0" {
		t.Fatal("prefixlb_peers_alive on c")
	}
	// Each side learns something during the partition.
	kA, kC := prompt(t, 10), prompt(t, 11)
	urlA, urlC := a.notRing(kA), c.notRing(kC)
	a.node.Policy().Learn(kA, a.byName(urlA), 0)
	c.node.Policy().Learn(kC, c.byName(urlC), 0)
	testutil.Eventually(t, wait, "b gets a's update", func() bool { return b.holds(kA, urlA) })
	if !c.holds(kC, urlC) || c.pick(kA).MatchedChunks != 0 {
		t.Fatal("c routes on its own state only")
	}
	c.drop.drop.Store(false)
	defer func() {
		if t.Failed() {
			for _, r := range []*replica{a, c} {
				es := r.logs.Take()
				for _, e := range es[max(len(es)-40, 0):] {
					t.Log(e.Text())
				}
				for _, m := range r.node.ml.Members() {
					t.Logf("member %s %v", m.Name, m.State)
				}
			}
		}
	}()
	for _, r := range []*replica{a, b, c} {
		testutil.Eventually(t, wait, "rejoined after the heal", func() bool {
			return r.node.Alive() == 2
		})
	}
	testutil.Eventually(t, wait, "c knows a's prefix, a and b know c's", func() bool {
		return c.holds(kA, urlA) && a.holds(kC, urlC) && b.holds(kC, urlC)
	})
	if back := c.logs.WithMessage("peering: peer back"); len(back) != 2 {
		t.Fatalf("c logged %d peers back; want one line for each of a and b", len(back))
	}
	if n := len(c.logs.WithMessage("peering: peers regained")); n != 1 {
		t.Fatalf("c logged %d recoveries", n)
	}
}

// TestPartitionHealAtCapacity: two replicas whose backend is at capacity learn apart during a
// partition; after the heal each holds both learns. The join snapshot's entries go among the
// receiver's own by age: taken as of their arrival, each side's would have evicted what the
// other learned meanwhile (their indexes swapped, each side's own learn gone).
func TestPartitionHealAtCapacity(t *testing.T) {
	ro := replicaOpts{kvTokens: 64 * 200} // 200 chunks a backend: 5 prompts
	a := startReplica(t, "a", ro)
	ro.join, ro.dropping = []*replica{a}, true
	c := startReplica(t, "c", ro)
	for _, r := range []*replica{a, c} {
		testutil.Eventually(t, wait, "joined", func() bool { return r.node.Alive() == 1 })
	}
	url := backendURLs[0]
	for i := range 8 { // both at capacity on url, learned by a
		k := prompt(t, 3000+i)
		a.node.Policy().Learn(k, a.byName(url), 0)
		testutil.Eventually(t, wait, "c gets a's learn", func() bool { return c.holds(k, url) })
	}
	c.drop.drop.Store(true)
	testutil.Eventually(t, wait, "c cut off", func() bool { return a.node.Alive() == 0 && c.node.Alive() == 0 })
	kA, kC := prompt(t, 3100), prompt(t, 3101)
	a.node.Policy().Learn(kA, a.byName(url), 0)
	time.Sleep(10 * time.Millisecond) // the point: c's learn is the later by the clock
	c.node.Policy().Learn(kC, c.byName(url), 0)
	if c.pick(kA).MatchedChunks != 0 || a.pick(kC).MatchedChunks != 0 {
		t.Fatal("a learn crossed the partition")
	}
	c.drop.drop.Store(false)
	for _, r := range []*replica{a, c} {
		testutil.Eventually(t, wait, "rejoined after the heal", func() bool { return r.node.Alive() == 1 })
	}
	testutil.Eventually(t, wait, "a and c hold both partition learns", func() bool {
		return a.holds(kA, url) && a.holds(kC, url) && c.holds(kA, url) && c.holds(kC, url)
	})
	// And stay so: the later exchanges (each side's rejoin, memberlist's own) change nothing.
	time.Sleep(500 * time.Millisecond) // the point: a window for later exchanges, which would change what they hold
	for _, r := range []*replica{a, c} {
		if !r.holds(kA, url) || !r.holds(kC, url) {
			t.Fatalf("%s lost a partition learn after the heal", r.node.Name())
		}
	}
}

// TestReadyOnPeersSnapshot: a replica whose join target does not answer (a listener that
// never reads) or refuses (nothing listening) is ready as soon as another peer's join brings
// it a snapshot within the snapshot timeout, and says it joined, not that no peer answered.
func TestReadyOnPeersSnapshot(t *testing.T) {
	for _, refused := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused=%v", refused), func(t *testing.T) {
			silent, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			target := silent.Addr().String()
			if refused {
				_ = silent.Close() // the port refuses at once
			} else {
				defer silent.Close()
			}
			// The join to the silent listener waits out a push/pull's timeout (here 2×wait),
			// and the start's wait for a snapshot is longer still.
			late := startReplica(t, "late", replicaOpts{joinAddr: []string{target}, tcpTimeout: 2 * wait, snapshotTimeout: 3 * wait})
			if refused { // the join to the refusing port fails first
				testutil.Eventually(t, wait, "late's join to the refusing port fails", func() bool {
					return late.logs.Count(func(e testutil.LogEntry) bool {
						l, _ := e.Fields["line"].(string)
						return e.Message == "peering: memberlist" && strings.Contains(l, "failed to join")
					}) > 0
				})
			}
			a := startReplica(t, "a", replicaOpts{join: []*replica{late}})
			// a learns once its join has made late a live peer, as a served replica does (its
			// /readyz waits for the join): a Learn flushed before that reached no one, and late
			// then held it only after a push/pull, past the wait (under load).
			testutil.Eventually(t, wait, "a sees late", func() bool { return a.node.Alive() == 1 })
			k := prompt(t, 4000)
			url := a.notRing(k)
			a.node.Policy().Learn(k, a.byName(url), 0)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if err := late.node.WaitReady(ctx); err != nil {
				t.Fatalf("not ready on a's snapshot: %v", err)
			}
			testutil.Eventually(t, wait, "late holds a's prefix", func() bool { return late.holds(k, url) })
			testutil.Eventually(t, wait, "late logs that it joined", func() bool {
				return len(late.logs.WithMessage("peering: joined")) == 1
			})
			if n := len(late.logs.WithMessage("peering: no peer answered; ready with an empty index")); n != 0 {
				t.Fatal("late logged that no peer answered")
			}
		})
	}
}

// TestUnknownBackendLogged: updates for a backend a replica does not have (the replicas'
// backend URLs differ) are counted and said in a warning, at most one a second; the rest of
// the update is taken. (It asked for exactly 5 counted, and failed whenever the machine was
// busy enough that the flusher batched the five 40-chunk groups and split one.)
func TestUnknownBackendLogged(t *testing.T) {
	a := startReplica(t, "a", replicaOpts{})
	b := startReplica(t, "b", replicaOpts{join: []*replica{a}, urls: []string{"http://localhost:18001", backendURLs[1]}})
	testutil.Eventually(t, wait, "joined", func() bool { return a.node.Alive() == 1 && b.node.Alive() == 1 })
	for i := range 5 {
		a.node.Policy().Learn(prompt(t, 5000+i), a.byName(backendURLs[0]), 0) // b's spelling differs
	}
	k := prompt(t, 5100)
	a.node.Policy().Learn(k, a.byName(backendURLs[1]), 0)
	testutil.Eventually(t, wait, "b takes the learn on the backend it has", func() bool { return b.holds(k, backendURLs[1]) })
	// Five groups, or more parts: a flush that batches them splits one across packets, and
	// each part counts (metrics.go).
	testutil.Eventually(t, wait, "b counts the others", func() bool {
		n, _ := strconv.Atoi(b.metric("prefixlb_peer_updates_unknown_backend_total"))
		return n >= 5
	})
	msg := "peering: a peer's update names a backend this replica does not have (an ID from its URL); give every replica the same backend URLs"
	if n := len(b.logs.WithMessage(msg)); n != 1 {
		t.Fatalf("%d warnings for 5 updates within a second, want 1", n)
	}
	if e := b.logs.WithMessage(msg)[0]; !strings.Contains(e.Text(), "http://localhost:18001") || !strings.Contains(e.Text(), "peer=a") {
		t.Fatalf("the warning names neither the peer nor this replica's backends: %s", e.Text())
	}
	// A replica that joins later, with the other spelling, is told of the snapshot's too.
	c := startReplica(t, "c", replicaOpts{join: []*replica{a}, urls: []string{"http://localhost:18001"}})
	testutil.Eventually(t, wait, "c warns of a's snapshot", func() bool {
		return len(c.logs.WithMessage("peering: a peer's snapshot names a backend this replica does not have (an ID from its URL); give every replica the same backend URLs")) >= 1
	})
}

// TestLateJoinerSnapshot: a replica that starts after the others learned is ready only once
// it holds their index: every prefix routes by match the moment Ready says so.
func TestLateJoinerSnapshot(t *testing.T) {
	a := startReplica(t, "a", replicaOpts{})
	const prompts = 50
	urls := make([]string, prompts)
	for i := range prompts {
		k := prompt(t, 1000+i)
		urls[i] = a.notRing(k)
		a.node.Policy().Learn(k, a.byName(urls[i]), 0)
	}
	// The learns wait for a's next flush, which drops them (no peer yet): a peer that joined
	// before it would get them as updates instead.
	testutil.Eventually(t, wait, "a's flusher took the learns", func() bool { return a.node.q.size.Load() == 0 })
	late := startReplica(t, "late", replicaOpts{join: []*replica{a}})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := late.node.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range prompts {
		if k := prompt(t, 1000+i); !late.holds(k, urls[i]) {
			t.Fatalf("prompt %d: ready without a's prefix (%+v)", i, late.pick(k))
		}
	}
	if got := late.metric("prefixlb_peer_updates_received_total"); got != "0" {
		t.Fatalf("the prefixes came as %s updates, not in the snapshot", got)
	}
}

// TestAloneReady: a replica with no peer to ask is ready at once and says so.
func TestAloneReady(t *testing.T) {
	r := startReplica(t, "solo", replicaOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := r.node.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if len(r.logs.WithMessage("peering: no peer to take an index snapshot from; ready with an empty index")) != 1 {
		t.Fatal("no log line")
	}
}

// TestNewRejectsBadSecret: a secret of a length AES does not take is refused.
func TestNewRejectsBadSecret(t *testing.T) {
	for _, n := range []int{0, 8, 31} {
		if _, err := New(Options{Listen: "127.0.0.1:0", Secret: make([]byte, n)}, router.NewPrefix(router.PrefixOptions{}, nil)); err == nil {
			t.Fatalf("secret of %d bytes accepted", n)
		}
	}
}

// TestPeersCountDecisions: every request a peer routes counts once, at the prefill work the
// peer counted for it (router.Prefix.RoutedWork), in this replica's recent share of the
// backend it went to (router.Prefix.NotePeerRouted), by which peered replicas (TieBreakLoad)
// rank near-ties: a prompt learned new, one the backend held whole and one under a chunk
// (empty groups on the wire), and one split across several packets (parts of one group, which
// memberlist may hand over in any order) are four decisions.
func TestPeersCountDecisions(t *testing.T) {
	a, b := loadPair(t)
	url := backendURLs[2]
	k := prompt(t, 7)
	long := &key.Key{OK: true, Routed: true}
	for i := range 3 * packetBudget / hashBytes { // three packets' worth
		long.Chunks = append(long.Chunks, uint64(i+1)*0x9e3779b97f4a7c15)
	}
	long.PromptTokens = len(long.Chunks) * key.DefaultChunkTokens
	short := &key.Key{OK: true, Routed: true, PromptTokens: 12}
	pol := a.node.Policy()
	if pol.Learn(k, a.byName(url), 0) == 0 || pol.Learn(k, a.byName(url), len(k.Chunks)) == 0 || pol.Learn(long, a.byName(url), 0) == 0 {
		t.Fatal("nothing learned")
	}
	pol.Learn(short, a.byName(url), 0)
	works := []int64{pol.RoutedWork(k, 0), pol.RoutedWork(k, len(k.Chunks)), pol.RoutedWork(long, 0), pol.RoutedWork(short, 0)}
	if works[1] >= works[0] || works[2] <= works[0] {
		t.Fatalf("routed work %v: want a held prompt lighter than the same one cold, the long one heaviest", works)
	}
	got := func() float64 { return b.node.Policy().RecentWork(b.byName(url)) }
	heavyFirst := slices.Clone(works)
	slices.Sort(heavyFirst)
	slices.Reverse(heavyFirst)
	least := decayedSum(heavyFirst...) // the heaviest counted first decays most: the least any order reads
	testutil.Eventually(t, wait, "r1 counts r0's four decisions", func() bool { return got() >= least-1e-9 })
	barrier(t, a, b, url) // a part counted twice has arrived by then
	if v := got(); !inSomeOrder(v, works) {
		t.Fatalf("r1's recent work on %s is %.4f, want the decayed sum of %v in some order (four decisions, each once)", url, v, works)
	}
	for _, other := range backendURLs {
		if other != url && b.node.Policy().RecentWork(b.byName(other)) != 0 {
			t.Fatalf("r1 counted a decision on %s, where r0 sent none", other)
		}
	}
	if !a.holds(long, url) || !b.holds(long, url) {
		t.Fatal("the split prompt is not held whole on both replicas")
	}
}

// loadPair starts two peered replicas that break near-ties by load, where each counts the
// other's decisions in its recent share (router.Prefix.NotePeerRouted), and waits until they
// see each other.
func loadPair(t *testing.T) (a, b *replica) {
	t.Helper()
	a = startReplica(t, "r0", replicaOpts{tieBreak: router.TieBreakLoad})
	b = startReplica(t, "r1", replicaOpts{tieBreak: router.TieBreakLoad, join: []*replica{a}})
	for _, r := range []*replica{a, b} {
		testutil.Eventually(t, wait, "peers see each other", func() bool { return r.node.Alive() == 1 })
	}
	return a, b
}

// decayedSum is a backend's recent share (router.Prefix.RecentWork) after decisions of ws
// one tick apart, read at the last: each decays the sum before it by 2^(−1 ÷ half-life).
func decayedSum(ws ...int64) float64 {
	v := 0.0
	for _, w := range ws {
		v = v*math.Exp2(-1/float64(router.RecentHalfLife)) + float64(w)
	}
	return v
}

// inSomeOrder reports whether v is decayedSum of ws in some order (ws is permuted in place).
func inSomeOrder(v float64, ws []int64) bool {
	if len(ws) <= 1 {
		return math.Abs(v-decayedSum(ws...)) <= 1e-9*max(1, v)
	}
	for i := range ws {
		ws[0], ws[i] = ws[i], ws[0]
		// The first counted decays len−1 ticks: peel it off and check the rest.
		rest := v - float64(ws[0])*math.Exp2(-float64(len(ws)-1)/float64(router.RecentHalfLife))
		ok := inSomeOrder(rest, ws[1:])
		ws[0], ws[i] = ws[i], ws[0]
		if ok {
			return true
		}
	}
	return false
}

// TestSplitGroupCountedOnceInAnyOrder: the packets of one flush, a prompt split across them
// between other groups, handed to the receiver in reverse order (memberlist takes queued
// messages newest first when its handler falls behind) count one decision per group.
func TestSplitGroupCountedOnceInAnyOrder(t *testing.T) {
	a := startReplica(t, "r0", replicaOpts{tieBreak: router.TieBreakLoad})
	b := startReplica(t, "r1", replicaOpts{tieBreak: router.TieBreakLoad})
	id := b.byName(backendURLs[1]).ID
	var hashes []uint64
	var items []queued
	works := []int64{100, 2000, 300}
	for g, n := range []int{40, 3 * packetBudget / hashBytes, 40} {
		items = append(items, queued{id: id, stamp: int64(1000 + 2*g), work: works[g], off: len(hashes), n: n})
		for i := range n {
			hashes = append(hashes, uint64(g*100000+i+1)*0x9e3779b97f4a7c15)
		}
	}
	packets := a.node.encode(nil, nil, items, hashes)
	if len(packets) < 3 {
		t.Fatalf("%d packets, want the long prompt split over several", len(packets))
	}
	for i := len(packets) - 1; i >= 0; i-- {
		b.node.receive(packets[i])
	}
	if v := b.node.Policy().RecentWork(b.byName(backendURLs[1])); !inSomeOrder(v, works) {
		t.Fatalf("recent work %.4f after %d packets in reverse, want the decayed sum of %v in some order (three decisions, each once)", v, len(packets), works)
	}
}

// TestLeavingNotice: a peer's leaving notice (sent by Close before memberlist's leave, whose
// gossip may not carry the leaving metadata to every peer in time) makes its departure a
// "peer left" even when it is noticed as a failure; a notice older than leavingNoticeTTL
// does not hide a loss.
func TestLeavingNotice(t *testing.T) {
	for _, tc := range []struct {
		name  string
		age   time.Duration // how old the notice is made before b goes silent
		msg   string
		level zapcore.Level
	}{
		{name: "fresh notice", msg: "peering: peer left", level: zapcore.InfoLevel}, // by notice: b's metadata never said it
		{name: "stale notice", age: 2 * leavingNoticeTTL, msg: "peering: peer lost", level: zapcore.WarnLevel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startReplica(t, "a", replicaOpts{})
			b := startReplica(t, "b", replicaOpts{join: []*replica{a}, dropping: true})
			testutil.Eventually(t, wait, "joined", func() bool { return a.node.Alive() == 1 && b.node.Alive() == 1 })
			b.node.sendLeaving()
			noticed := func() (time.Time, bool) {
				a.node.mu.Lock()
				defer a.node.mu.Unlock()
				at, ok := a.node.leaving[b.node.Name()]
				return at, ok
			}
			testutil.Eventually(t, wait, "a has b's notice", func() bool { _, ok := noticed(); return ok })
			if tc.age > 0 {
				a.node.mu.Lock()
				a.node.leaving[b.node.Name()] = time.Now().Add(-tc.age)
				a.node.mu.Unlock()
			}
			// b goes silent without leaving: a finds it dead by its probes, as when the
			// leave's gossip did not reach it.
			b.drop.drop.Store(true)
			testutil.Eventually(t, wait, "a sees b gone", func() bool { return a.node.Alive() == 0 })
			lines := a.logs.WithMessage(tc.msg)
			if len(lines) != 1 || lines[0].Fields["peer"] != b.node.Name() || lines[0].Level != tc.level {
				t.Fatalf("a logged %v for b's departure; want one %s line %q naming it", lines, tc.level, tc.msg)
			}
			if _, ok := noticed(); ok {
				t.Fatal("the notice is kept after the departure it explained")
			}
		})
	}
}

// TestDecodeLeaving: a leaving notice round-trips; another kind, a cut sender or trailing
// bytes are errors.
func TestDecodeLeaving(t *testing.T) {
	good := appendHeader(nil, kindLeaving, "replica-1")
	for _, tc := range []struct {
		name string
		buf  []byte
		want string
		err  bool
	}{
		{name: "round trip", buf: good, want: "replica-1"},
		{name: "an update", buf: appendHeader(nil, kindUpdate, "replica-1"), err: true},
		{name: "cut sender", buf: good[:len(good)-1], err: true},
		{name: "trailing bytes", buf: append(slices.Clone(good), 0), err: true},
		{name: "empty", buf: nil, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeLeaving(tc.buf)
			if (err != nil) != tc.err || (!tc.err && got != tc.want) {
				t.Fatalf("decodeLeaving = %q, %v; want %q, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// TestUpdateMember: the flusher's copy of a peer follows memberlist's updates of it (its
// metadata), and an update of a node that is no member adds none.
func TestUpdateMember(t *testing.T) {
	n := &Node{name: "self", members: map[string]*memberlist.Node{}, lost: map[string]lostPeer{}, leaving: map[string]time.Time{},
		log: zap.NewNop()}
	peer := &memberlist.Node{Name: "p", Addr: net.IPv4(127, 0, 0, 2), Port: 7946, Meta: []byte{metaDirect | metaNotices}}
	n.setMember(copyNode(peer), true, false)
	peer.Meta[0] = metaNotices // memberlist's own node, changed in place: the copy must not see it
	if ps := n.livePeers(); len(ps) != 1 || !takesDirect(ps[0].Meta) {
		t.Fatalf("live peers %v; want p, taking direct packets", ps)
	}
	n.updateMember(copyNode(&memberlist.Node{Name: "p", Addr: peer.Addr, Port: peer.Port, Meta: []byte{metaNotices | metaLeaving}}))
	n.updateMember(copyNode(&memberlist.Node{Name: "stranger", Addr: peer.Addr, Port: 7947}))
	ps := n.livePeers()
	if len(ps) != 1 || takesDirect(ps[0].Meta) || !leavingMeta(ps[0].Meta) {
		t.Fatalf("live peers %v; want p alone, leaving, without the direct path", ps)
	}
}

// TestClosingNodeQuiet: once a node is closing, memberlist's warnings (its probes failing on
// its own closed sockets) are logged at debug, and a peer's departure is not recorded or
// logged (memberlist's suspicion timers still fire after its Shutdown, declaring live peers
// dead: the bench's shutdowns logged "peer lost" for the survivors).
func TestClosingNodeQuiet(t *testing.T) {
	lg, rec := testutil.RecordingLogger()
	w := newLevelWriter(lg, metrics.NewSet().NewCounter("rejected"))
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	n := &Node{name: "self", members: map[string]*memberlist.Node{}, lost: map[string]lostPeer{}, leaving: map[string]time.Time{},
		log: lg, mlog: w}
	peer := &memberlist.Node{Name: "p", Addr: net.IPv4(127, 0, 0, 2), Port: 7946, Meta: []byte{metaNotices}}
	n.setMember(copyNode(peer), true, false)
	ping := "[WARN] memberlist: Failed to send UDP ping: write udp 127.0.0.1:1->127.0.0.1:2: use of closed network connection\n"
	for i, closing := range []bool{false, true} {
		n.closing.Store(closing)
		w.closing.Store(closing)
		now = now.Add(mlogInterval)
		rec.Take()
		if _, err := w.Write([]byte(ping)); err != nil {
			t.Fatal(err)
		}
		want := zapcore.WarnLevel
		if closing {
			want = zapcore.DebugLevel
		}
		if got := rec.Take(); len(got) != 1 || got[0].Level != want {
			t.Fatalf("step %d: memberlist's warning logged as %v; want one line at %v", i, got, want)
		}
	}
	n.setMember(copyNode(peer), false, false)
	if got := rec.Take(); len(got) != 0 || n.Alive() != 1 {
		t.Fatalf("a closing node logged %v and sees %d peers; want nothing and its peer as it was", got, n.Alive())
	}
}

// TestDecisionDelay: a peer's decision is measured once where it is counted, from its
// stamp, and once where it was sent; the histograms are exported, and the bench's quantiles
// come from their buckets.
func TestDecisionDelay(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	k := prompt(t, 7)
	url := b.notRing(k)
	a.node.Policy().Learn(k, a.byName(url), 0)
	testutil.Eventually(t, wait, "b gets a's decision", func() bool { return b.holds(k, url) })
	d := b.node.Stats().DecisionDelay
	if n := delayCount(d); n != 1 || DelayQuantile(d, 0.5) <= 0 || DelayQuantile(d, 0.5) > wait.Seconds() {
		t.Fatalf("b's delay buckets %v: want one decision, measured within the wait", d)
	}
	var sb strings.Builder
	b.node.WriteMetrics(&sb)
	if !strings.Contains(sb.String(), "prefixlb_peer_decision_delay_seconds_count 1") {
		t.Fatalf("metrics lack the delay histogram:\n%s", sb.String())
	}
	// Sent once, by a alone (observed once its write returned, which may be after b counted
	// it); b decided nothing.
	var sd []DelayBucket
	testutil.Eventually(t, wait, "a observes its send", func() bool {
		sd = a.node.Stats().SendDelay
		return len(sd) > 0
	})
	if n := delayCount(sd); n != 1 || DelayQuantile(sd, 0.5) <= 0 || DelayQuantile(sd, 0.5) > wait.Seconds() {
		t.Fatalf("a's send delay buckets %v: want one decision, sent within the wait", sd)
	}
	if got := b.node.Stats().SendDelay; len(got) != 0 {
		t.Fatalf("b's send delay buckets %v; b decided nothing", got)
	}
	sb.Reset()
	a.node.WriteMetrics(&sb)
	if !strings.Contains(sb.String(), "prefixlb_peer_send_delay_seconds_count 1") {
		t.Fatalf("metrics lack the send delay histogram:\n%s", sb.String())
	}
}

// delayCount is how many observations bs holds.
func delayCount(bs []DelayBucket) (n uint64) {
	for _, b := range bs {
		n += b.Count
	}
	return n
}

// TestDelayQuantile: quantiles are the upper bound of the bucket that holds them, merged
// across nodes by bound; nothing observed reads 0.
func TestDelayQuantile(t *testing.T) {
	a := []DelayBucket{{0.001, 5}, {0.002, 4}}
	b := []DelayBucket{{0.002, 1}, {0.01, 10}}
	m := MergeDelays(a, b, nil)
	if want := []DelayBucket{{0.001, 5}, {0.002, 5}, {0.01, 10}}; !slices.Equal(m, want) {
		t.Fatalf("merged %v, want %v", m, want)
	}
	for _, tc := range []struct {
		bs   []DelayBucket
		q    float64
		want float64
	}{
		{m, 0, 0.001}, {m, 0.25, 0.001}, {m, 0.26, 0.002}, {m, 0.5, 0.002}, {m, 0.51, 0.01}, {m, 1, 0.01},
		{nil, 0.5, 0},
	} {
		if got := DelayQuantile(tc.bs, tc.q); got != tc.want {
			t.Errorf("DelayQuantile(%v, %g) = %g, want %g", tc.bs, tc.q, got, tc.want)
		}
	}
}
