package peering

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// quietRounds is how many rounds of a replica's rejoin loop a test watches for joins that
// should not happen.
const quietRounds = 5

// rejoinRounds waits (bounded) until r's rejoin loop has gone through n more rounds: a join
// that a round makes is over before the next round begins.
func rejoinRounds(t *testing.T, r *replica, n uint64) {
	t.Helper()
	until := r.node.rejoins.Load() + n + 1
	testutil.Eventually(t, wait, fmt.Sprintf("%d rejoin rounds of %s", n, r.node.Name()), func() bool { return r.node.rejoins.Load() >= until })
}

// imports counts r's "index snapshot imported" lines so far.
func imports(r *replica) int {
	return r.logs.Count(func(e testutil.LogEntry) bool { return e.Message == "peering: index snapshot imported" })
}

// lostAddrs returns the addresses r still joins again as lost peers.
func lostAddrs(r *replica) []string {
	r.node.mu.Lock()
	defer r.node.mu.Unlock()
	var out []string
	for _, l := range r.node.lost {
		out = append(out, l.addr)
	}
	return out
}

// TestRestartSameAddressNoRejoinStorm: a replica that crashes and comes back at the same
// address under a new name replaces the dead one; its peer stops joining that address (each
// join a full snapshot exchange), and the new replica imports one snapshot, not one per
// rejoin interval.
func TestRestartSameAddressNoRejoinStorm(t *testing.T) {
	a := startReplica(t, "a", replicaOpts{})
	b1 := startReplica(t, "b1", replicaOpts{join: []*replica{a}})
	testutil.Eventually(t, wait, "a and b1 peered", func() bool { return a.node.Alive() == 1 && b1.node.Alive() == 1 })
	addr := b1.node.Addr()
	b1.kill()
	testutil.Eventually(t, wait, "a declares b1 dead", func() bool { return a.node.Alive() == 0 })
	if got := lostAddrs(a); len(got) != 1 || got[0] != addr {
		t.Fatalf("a's lost peers %v, want [%s]", got, addr)
	}
	// a's index differs from an empty one, so that b2 imports a's snapshot (not its own).
	a.node.Policy().Learn(prompt(t, 3), a.bs[0], 0)
	b2 := startReplica(t, "b2", replicaOpts{join: []*replica{a}, listen: addr})
	testutil.Eventually(t, wait, "a and b2 peered", func() bool { return a.node.Alive() == 1 && b2.node.Alive() == 1 })
	testutil.Eventually(t, wait, "b2 imported a's snapshot", func() bool { return imports(b2) >= 1 })
	testutil.Eventually(t, wait, "b1's entry dropped", func() bool { return len(lostAddrs(a)) == 0 })
	before, pushes := imports(b2), b2.node.pushes.Load()
	rejoinRounds(t, a, quietRounds)
	// A storm is one join per round of a's rejoin loop; one join already on its way when b1's
	// entry went (or one exchange as a peer reappears) may land, and import once more (under
	// load).
	if after := imports(b2); after > before+1 {
		t.Fatalf("b2 imported %d more snapshots in %d rejoin rounds of a after it joined: a still joins b1's address", after-before, quietRounds)
	}
	if after := b2.node.pushes.Load(); after > pushes+1 {
		t.Fatalf("b2 answered %d more join push/pulls in %d rejoin rounds of a after it joined: a still joins b1's address", after-pushes, quietRounds)
	}
}

// freePort returns a 127.0.0.1 port free for TCP and UDP a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if u, err := net.ListenPacket("udp", l.Addr().String()); err == nil {
			_ = u.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// TestSelfJoinOtherSpelling: a join list naming the replica itself as localhost:its port is
// recognised; the replica never imports its own snapshot.
func TestSelfJoinOtherSpelling(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	r := startReplica(t, "self", replicaOpts{listen: "127.0.0.1:" + port, joinAddr: []string{"localhost:" + port}})
	if err := r.node.WaitReady(contextWithin(t, wait)); err != nil {
		t.Fatal(err)
	}
	if !r.node.isSelf(context.Background(), "localhost:"+port) {
		t.Fatalf("localhost:%s not recognised as %s", port, r.node.Addr())
	}
	rejoinRounds(t, r, quietRounds) // alone, it joins its join list each round
	if n := imports(r); n != 0 {
		t.Fatalf("the replica imported its own snapshot %d times", n)
	}
}

// TestOwnSnapshotNotMerged: a snapshot this replica made, merged back (a join to itself that
// isSelf did not recognise), is not imported; a peer's is, even with the same entries (two
// empty indexes).
func TestOwnSnapshotNotMerged(t *testing.T) {
	a := startReplica(t, "a", replicaOpts{})
	b := startReplica(t, "b", replicaOpts{})
	k := prompt(t, 1)
	a.node.Policy().Learn(k, a.bs[0], 0)
	own := a.node.snapshot(true)
	a.node.merge(own, true)
	if n := imports(a); n != 0 {
		t.Fatalf("a imported its own snapshot (%d lines)", n)
	}
	a.node.merge(b.node.snapshot(true), true)
	if n := imports(a); n != 1 {
		t.Fatalf("a imported %d snapshots of b's, want 1", n)
	}
	c := startReplica(t, "c", replicaOpts{})
	c.node.snapshot(true)
	c.node.merge(b.node.snapshot(true), true)
	if n := imports(c); n != 1 {
		t.Fatalf("c took %d snapshots of b's as empty as its own, want 1", n)
	}
}

// TestIsSelf: the spellings of this replica's address, and others'.
func TestIsSelf(t *testing.T) {
	r := startReplica(t, "me", replicaOpts{})
	_, port, _ := net.SplitHostPort(r.node.Addr())
	other := strconv.Itoa(freePort(t))
	for _, c := range []struct {
		addr string
		want bool
	}{
		{r.node.Addr(), true},
		{"localhost:" + port, true},
		{"127.0.0.1:" + other, false},
		{"localhost:" + other, false},
		{"127.0.0.2:" + port, false},
		{"no-such-host.invalid:" + port, false},
		{"garbage", false},
	} {
		if got := r.node.isSelf(context.Background(), c.addr); got != c.want {
			t.Errorf("isSelf(%q) = %v, want %v", c.addr, got, c.want)
		}
	}
}

// contextWithin is a context done after d or at the test's end.
func contextWithin(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
