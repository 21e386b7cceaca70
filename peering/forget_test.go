package peering

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// TestUnlearnPropagates: a Learn that a backend then refused is withdrawn on the peers too
// (sent, then forgotten; or dropped from the queue before the flush), and what a peer's
// backend held before that Learn stays.
func TestUnlearnPropagates(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	pol := a.node.Policy()

	// Sent, then withdrawn: b had recorded it.
	k := prompt(t, 20)
	url := a.notRing(k)
	l := pol.Learn(k, a.byName(url), 0)
	testutil.Eventually(t, wait, "b gets a's learn", func() bool { return b.holds(k, url) })
	pol.Unlearn(k, a.byName(url), l)
	testutil.Eventually(t, wait, "b forgets it", func() bool { return b.pick(k).MatchedChunks == 0 })
	if a.pick(k).MatchedChunks != 0 {
		t.Fatal("a still holds its own withdrawn learn")
	}
	if got := b.metric("prefixlb_peer_forgets_received_total"); got != "1" {
		t.Fatalf("b received %s forgets, want 1", got)
	}

	// Withdrawn at once (before the flush, or just after: either way b ends without it);
	// a later learn that b gets marks that the first had its chance to arrive.
	k2, k3 := prompt(t, 21), prompt(t, 22)
	url2, url3 := a.notRing(k2), a.notRing(k3)
	pol.Unlearn(k2, a.byName(url2), pol.Learn(k2, a.byName(url2), 0))
	pol.Learn(k3, a.byName(url3), 0)
	testutil.Eventually(t, wait, "b gets the later learn", func() bool { return b.holds(k3, url3) })
	testutil.Eventually(t, wait, "b holds nothing of the withdrawn one", func() bool { return b.pick(k2).MatchedChunks == 0 })

	// b's backend held the prompt before a's learn (b learned it itself): a's forget leaves it.
	k4 := prompt(t, 23)
	url4 := b.notRing(k4)
	b.node.Policy().Learn(k4, b.byName(url4), 0)
	before := b.metric("prefixlb_peer_updates_received_total")
	l4 := pol.Learn(k4, a.byName(url4), 0)
	testutil.Eventually(t, wait, "b gets a's learn of k4", func() bool { return b.metric("prefixlb_peer_updates_received_total") != before })
	forgets := b.metric("prefixlb_peer_forgets_received_total")
	pol.Unlearn(k4, a.byName(url4), l4)
	testutil.Eventually(t, wait, "b gets a's forget of k4", func() bool { return b.metric("prefixlb_peer_forgets_received_total") != forgets })
	if !b.holds(k4, url4) {
		t.Fatalf("a's forget removed what b's backend held before: %+v", b.pick(k4))
	}
}

// TestQueueCancel: a Learn withdrawn before the flush leaves the queue with none of its
// chunks to send, only its decision and prefill work (an empty group, which the peers count as
// this replica did); one not queued (sent already) is not found, and its forget encodes as a
// forget.
func TestQueueCancel(t *testing.T) {
	n := &Node{name: "q", m: newMetrics(func() float64 { return 0 })}
	n.q.push(7, 1000, 300, []uint64{1, 2, 3}, &n.m)
	n.q.push(7, 1002, 200, []uint64{4, 5}, &n.m)
	if !n.q.cancel(7, 1000) || n.q.cancel(8, 1002) || n.q.cancel(7, 999) {
		t.Fatal("cancel found the wrong items")
	}
	n.q.pushForget(7, 900, []uint64{9}, &n.m)
	items, hashes := n.q.take(nil, nil)
	type sent struct {
		group
		n int
	}
	var got []sent
	for _, pkt := range n.encode(nil, nil, items, hashes) {
		var ls []peerLoad
		var hs []uint64
		if err := decodeUpdate(pkt, &ls, &hs, func(string, []peerLoad) {}, func(g group, h []uint64) {
			got = append(got, sent{g, len(h)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	want := []sent{{group{id: 7, stamp: 1000, work: 300}, 0}, {group{id: 7, stamp: 1002, work: 200}, 2}, {group{id: 7, stamp: 900, forget: true}, 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("encoded groups %+v, want %+v (the cancelled learn's chunks left out, its decision and work kept)", got, want)
	}
}

// TestRecentLearnsWindow: a peer's learned group can be withdrawn for half a window at least
// and not past a whole one; the parts of a split prompt are all found.
func TestRecentLearnsWindow(t *testing.T) {
	var r recentLearns
	t0 := time.Unix(1000, 0)
	r.add("p", 1, 10, 100, t0)
	r.add("p", 1, 10, 102, t0) // a second part of the same prompt
	r.add("p", 1, 11, 104, t0)
	if got := r.forget("p", 1, 10, t0); len(got) != 2 || got[0] != 100 || got[1] != 102 {
		t.Fatalf("forget %v, want both parts", got)
	}
	// A forget split across packets: its second part withdraws its hashes under the same
	// stamps, and a part of the group still to come is not recorded.
	if got := r.forget("p", 1, 10, t0); len(got) != 2 {
		t.Fatalf("the forget's second part got %v, want both stamps again", got)
	}
	if !r.forgotten("p", 1, 10) || r.forgotten("p", 1, 11) {
		t.Fatal("forgotten marks the wrong group")
	}
	// A forget that arrives before its group: nothing to withdraw, and the group is not
	// recorded when it comes.
	if got := r.forget("p", 2, 30, t0); got != nil || !r.forgotten("p", 2, 30) {
		t.Fatalf("forget before the group: %v, forgotten %v", got, r.forgotten("p", 2, 30))
	}
	r.add("q", 1, 12, 106, t0.Add(forgetWindow/2)) // rotates: stamp 11 is now the older generation
	if !r.forgotten("p", 1, 10) || !r.forgotten("p", 2, 30) {
		t.Fatal("a forget of the older generation no longer marks its group")
	}
	if got := r.forget("p", 1, 11, t0.Add(forgetWindow/2)); len(got) != 1 {
		t.Fatalf("within the window: %v", got)
	}
	r.add("q", 1, 13, 108, t0.Add(forgetWindow)) // rotates again: stamp 12's generation is the older
	r.add("q", 1, 14, 110, t0.Add(3*forgetWindow/2))
	if got := r.forget("q", 1, 12, t0.Add(3*forgetWindow/2)); got != nil {
		t.Fatalf("past the window: %v", got)
	}
	if got := r.forget("q", 1, 14, t0.Add(3*forgetWindow/2)); len(got) != 1 {
		t.Fatalf("the newest: %v", got)
	}
}

// TestSplitForgetWithdrawsAll: a prompt learned in several packets and then withdrawn (a
// backend refused it after its chunks went out) leaves none of its chunks at the peer: every
// part of the forget withdraws its own hashes.
func TestSplitForgetWithdrawsAll(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	url := backendURLs[2]
	long := &key.Key{OK: true, Routed: true}
	for i := range 3 * packetBudget / hashBytes { // three packets' worth
		long.Chunks = append(long.Chunks, uint64(i+7)*0x9e3779b97f4a7c15)
	}
	long.PromptTokens = len(long.Chunks) * key.DefaultChunkTokens
	l := a.node.Policy().Learn(long, a.byName(url), 0)
	if l == 0 {
		t.Fatal("nothing learned")
	}
	n := int64(len(long.Chunks))
	testutil.Eventually(t, wait, "b records the whole prompt", func() bool { return b.node.Policy().Index().Entries() >= n })
	a.node.Policy().Unlearn(long, a.byName(url), l)
	testutil.Eventually(t, wait, "b withdraws every chunk of it", func() bool { return b.node.Policy().Index().Entries() == 0 })
}

// learnQueue returns a peering Policy over b alone, with no transport, and a function that
// takes what its Learns queued for the peers and returns how many hashes that was.
func learnQueue(b *backend.Backend) (*Policy, func() int) {
	pre := router.NewPrefix(router.PrefixOptions{}, nil)
	pre.SetBackends([]*backend.Backend{b})
	n := &Node{name: "q", m: newMetrics(func() float64 { return 0 })}
	return &Policy{Prefix: pre, n: n}, func() int {
		_, hs := n.q.take(nil, nil)
		return len(hs)
	}
}

// TestLearnSendsWhatIsNew: a Learn queues only the chunks beyond what the backend held when
// the request was routed, except every fullChainEvery-th, which queues the whole chain; a
// first learn (nothing held) queues it all.
func TestLearnSendsWhatIsNew(t *testing.T) {
	b, err := backend.New("http://127.0.0.1:1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, queued := learnQueue(b)
	k := prompt(t, 1)
	const held = 6
	p.Learn(k, b, 0)
	if got := queued(); got != len(k.Chunks) {
		t.Fatalf("first learn queued %d hashes, want the whole chain's %d", got, len(k.Chunks))
	}
	full := 0
	for i := range 2 * fullChainEvery {
		p.Learn(k, b, held)
		switch got := queued(); got {
		case len(k.Chunks):
			full++
		case len(k.Chunks) - held:
		default:
			t.Fatalf("learn %d queued %d hashes, want %d (new) or %d (whole)", i, got, len(k.Chunks)-held, len(k.Chunks))
		}
	}
	if full != 2 {
		t.Errorf("%d of %d learns sent the whole chain, want 2", full, 2*fullChainEvery)
	}
	p.Learn(k, b, len(k.Chunks))
	if got := queued(); got != 0 {
		t.Errorf("a fully held prompt queued %d hashes, want none", got)
	}
}

// TestLearnSendsOnlyWhatFits: for a prompt that weighs more than the backend's capacity, a
// Learn queues for the peers only the chunks this replica's own Record kept (index.Index.Fit),
// whole or past the held prefix: a peer sent the rest recorded coarse chunks this replica never
// held and evicted its own copy of the prefix for them (index.TestFitKeepsPeersInStep).
func TestLearnSendsOnlyWhatFits(t *testing.T) {
	const capacity = 200 // chunks of 64 tokens: 128 fine ones and 9 coarse ones of 8 fit
	b, err := backend.New("http://127.0.0.1:1", capacity*key.DefaultChunkTokens, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, queued := learnQueue(b)
	text := strings.Repeat("a long agent context that runs well past eight thousand tokens. ", 1500) // ~96 KB
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": text}}})
	k := &key.Key{}
	key.NewBuilder(0).Build([]byte("/v1/chat/completions"), body, k)
	fit := key.FineChunks + (capacity-key.FineChunks)/key.CoarseFactor
	if !k.OK || len(k.Chunks) <= fit {
		t.Fatalf("key OK %v with %d chunks, want more than the %d that fit", k.OK, len(k.Chunks), fit)
	}
	p.Learn(k, b, 0)
	if got := queued(); got != fit {
		t.Fatalf("a first learn queued %d hashes, want the %d that fit", got, fit)
	}
	const held = 130
	for i := range fullChainEvery {
		p.Learn(k, b, held)
		if got := queued(); got != fit-held && got != fit {
			t.Fatalf("learn %d queued %d hashes, want %d (new) or %d (whole)", i, got, fit-held, fit)
		}
	}
}

// BenchmarkRecentLearnsAdd is add as the receiver calls it for every group a busy peer sends
// (bench overhead at 16 KB: about 11,000 a second on 2 backends), at the steady state, where
// the generations rotate on maxRecentLearns/2 entries.
func BenchmarkRecentLearnsAdd(b *testing.B) {
	var r recentLearns
	now := time.Unix(1000, 0)
	stamp := int64(1_000_000)
	add := func() {
		stamp += 2
		now = now.Add(90 * time.Microsecond)
		r.add("prefixlb-7f9c2d1e-a", uint64(stamp>>1&1), stamp, index.Stamp(stamp), now)
	}
	for range maxRecentLearns {
		add()
	}
	b.ReportAllocs()
	for b.Loop() {
		add()
	}
}
