package peering

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

func TestUnseenAhead(t *testing.T) {
	var a arrivals
	for _, x := range []arrival{
		{id: 1, stamp: 100, work: 10, arrived: 150},                       // sent at once, earlier, arrived after 120: unseen
		{id: 1, stamp: 110, work: 20, arrived: 115},                       // earlier, arrived before 120: seen
		{id: 1, stamp: 130, work: 40, arrived: 160},                       // sent at once, later than 125
		{id: 2, stamp: 100, work: 80, arrived: 150},                       // another backend
		{id: 1, stamp: 0, work: 160, arrived: 150},                        // no stamp (a prompt under one chunk)
		{id: 1, stamp: 90, work: 320, class: classFlexible, arrived: 150}, // held flexible, earliest
		{id: 1, stamp: 135, work: 640, class: classMatch, arrived: 150},   // held match, latest
	} {
		a.add(x)
	}
	for _, tc := range []struct {
		id      uint64
		c       class
		stamp   int64
		decided int64
		work    int64
		yield   bool
	}{
		// A held match: what was sent at once and the matches stamped before it weigh; no
		// flexible one does.
		{1, classMatch, 125, 120, 10, false},
		{1, classMatch, 140, 120, 50 + 640, false},
		{1, classMatch, 100, 120, 0, false}, // the earliest keeps its backend
		{1, classMatch, 125, 160, 0, false}, // decided after all arrived: seen
		{2, classMatch, 125, 120, 80, false},
		{3, classMatch, 125, 120, 0, false},
		// A held flexible one: the held match makes it yield whatever its stamp; what was sent
		// at once and the flexible ones stamped before it weigh.
		{1, classFlexible, 80, 120, 0, true},
		{1, classFlexible, 125, 120, 10 + 320, true},
		{1, classFlexible, 140, 120, 50 + 320, true},
		{1, classFlexible, 140, 155, 40, false}, // only the one that arrived at 160 unseen
		{2, classFlexible, 80, 120, 0, false},   // sent at once, stamped after it
	} {
		work, yield := a.unseenAhead(tc.id, tc.c, tc.stamp, tc.decided)
		if work != tc.work || yield != tc.yield {
			t.Errorf("unseenAhead(%d, class %d, %d, %d) = %d, %v; want %d, %v", tc.id, tc.c, tc.stamp, tc.decided, work, yield, tc.work, tc.yield)
		}
	}
	// The ring keeps the last maxArrivals: older ones are overwritten.
	for i := 0; i < maxArrivals; i++ {
		a.add(arrival{id: 9, stamp: 1, work: 1, arrived: 1})
	}
	if work, yield := a.unseenAhead(1, classFlexible, 140, 120); work != 0 || yield {
		t.Errorf("after %d more arrivals the old ones still count: %d, %v", maxArrivals, work, yield)
	}
}

func TestRank(t *testing.T) {
	for _, tc := range []struct {
		c    class
		s    int64
		xc   class
		xs   int64
		want verdict
	}{
		{classMatch, 2, classMatch, 1, weighs}, // two alike: the earlier stamp
		{classMatch, 1, classMatch, 2, unaffected},
		{classFlexible, 2, classFlexible, 1, weighs},
		{classFlexible, 1, classFlexible, 2, unaffected},
		{classFlexible, 1, classMatch, 2, yields}, // a held match before a flexible one, whatever the stamps
		{classFlexible, 2, classMatch, 1, yields},
		{classMatch, 2, classFlexible, 1, unaffected},
		{classMatch, 1, classFlexible, 2, unaffected},
		{classMatch, 2, classSent, 1, weighs}, // sent at once: by stamp against any
		{classMatch, 1, classSent, 2, unaffected},
		{classFlexible, 2, classSent, 1, weighs},
		{classFlexible, 1, classSent, 2, unaffected},
		{classMatch, 1, classMatch, 1, unaffected}, // equal stamps: neither weighs
		{classFlexible, 1, classFlexible, 1, unaffected},
		{classFlexible, 1, classSent, 1, unaffected},
		{classFlexible, 1, classMatch, 1, yields},
	} {
		if got := rank(tc.c, tc.s, tc.xc, tc.xs); got != tc.want {
			t.Errorf("rank(class %d stamp %d, against class %d stamp %d) = %d, want %d", tc.c, tc.s, tc.xc, tc.xs, got, tc.want)
		}
	}
}

// TestSettleWait: only a request whose own prefill takes settleShare × the wait or more is
// held, only while a peer is alive, and never with settling off.
func TestSettleWait(t *testing.T) {
	rs := cluster(t, 2)
	alone := startReplica(t, "alone", replicaOpts{})
	// Unlearned, a backend prefills at backend.DefaultPrefillRate: the threshold is the work
	// of settleShare × DefaultSettleWait at that rate.
	edge := int64(settleShare * DefaultSettleWait.Seconds() * backend.DefaultPrefillRate)
	for _, tc := range []struct {
		name string
		r    *replica
		work int64
		off  bool
		want time.Duration
	}{
		{"long", rs[0], 4 * edge, false, DefaultSettleWait},
		{"at the edge", rs[0], edge, false, DefaultSettleWait},
		{"short", rs[0], edge / 2, false, 0},
		{"no prediction", rs[0], 0, false, 0},
		{"no live peer", alone, 4 * edge, false, 0},
		{"off", rs[0], 4 * edge, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.r.node.o.SettleWait
			if tc.off {
				tc.r.node.o.SettleWait = -1
			}
			defer func() { tc.r.node.o.SettleWait = o }()
			d := router.Decision{Backend: tc.r.bs[0], PrefillWork: tc.work}
			if got := tc.r.node.Policy().SettleWait(nil, d); got != tc.want {
				t.Errorf("SettleWait = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestContendedShare(t *testing.T) {
	for _, tc := range []struct {
		unseen, work int64
		want         bool
	}{
		{0, 1000, false},
		{99, 1000, false}, // under a tenth of the request's own work
		{100, 1000, true},
		{5000, 1000, true},
		{1, 0, true}, // no prediction of its own: anything ahead counts
	} {
		if got := contended(tc.unseen, tc.work); got != tc.want {
			t.Errorf("contended(%d, %d) = %v, want %v", tc.unseen, tc.work, got, tc.want)
		}
	}
}

// TestSettleBurst: three peered replicas each hold a long prompt on one backend, one after
// another, before any of them hears of the others (a burst spread over them). Hold sends the
// decision and no chunks. Once every decision has reached every replica, the first made
// keeps the backend and the two later ones are decided again, in the replicas that made
// them: the stamps order them alike everywhere. The kept decision's chunks then reach the
// peers; the two withdrawn ones never left, so no forget is sent.
func TestSettleBurst(t *testing.T) {
	rs := cluster(t, 3)
	url := backendURLs[1]
	type held struct {
		k       *key.Key
		d       router.Decision
		l       router.Learned
		decided time.Time
	}
	hs := make([]held, len(rs))
	for i, r := range rs {
		h := &hs[i]
		h.k = prompt(t, 900+i)
		h.d = router.Decision{Backend: r.byName(url), Reason: router.ReasonCold, PrefillWork: r.node.Policy().RoutedWork(h.k, 0)}
	}
	// All decided before any Hold is sent: a Hold flushed at once could reach the next
	// replica before it decides, and then it was seen.
	for i := range hs {
		hs[i].decided = time.Now()
	}
	for i, r := range rs {
		if hs[i].l = r.node.Policy().Hold(hs[i].k, hs[i].d); hs[i].l == 0 {
			t.Fatalf("r%d held nothing", i)
		}
	}
	for i, r := range rs {
		testutil.Eventually(t, wait, fmt.Sprintf("r%d has the other two decisions", i), func() bool {
			n := 0
			for j := range rs {
				if j != i && r.node.arrivals.has(r.byName(url).ID, int64(hs[j].l)) {
					n++
				}
			}
			return n == 2
		})
		for j := range rs {
			if j != i && r.holds(hs[j].k, url) {
				t.Errorf("r%d holds r%d's held prompt before its Release", i, j)
			}
		}
	}
	for i, r := range rs {
		again := r.node.Policy().Release(hs[i].k, hs[i].d, hs[i].l, hs[i].decided)
		if want := i > 0; again != want {
			t.Errorf("r%d (decision %d of 3): again %v, want %v", i, i+1, again, want)
		}
	}
	for i, r := range rs {
		testutil.Eventually(t, wait, fmt.Sprintf("r%d holds r0's kept prompt on %s", i, url),
			func() bool { return r.holds(hs[0].k, url) })
		for j := 1; j < len(rs); j++ {
			if r.holds(hs[j].k, url) {
				t.Errorf("r%d holds r%d's prompt, which was decided again", i, j)
			}
		}
		if got := r.metric("prefixlb_peer_forgets_sent_total"); got != "0" {
			t.Errorf("r%d sent %s forgets; a hold decided again sent no chunks to withdraw", i, got)
		}
		want := "0"
		if i > 0 {
			want = "1"
		}
		if got := r.metric("prefixlb_peer_resettles_total"); got != want {
			t.Errorf("r%d counted %s resettles, want %s", i, got, want)
		}
	}
}

// TestSettleMatchKeepsItsBackend: of two held decisions on one backend, made by two peered
// replicas before either heard of the other, the match keeps the backend and the one placed
// by load (ReasonCold) is decided again, whichever was stamped first; both replicas agree.
func TestSettleMatchKeepsItsBackend(t *testing.T) {
	for _, matchFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("match stamped first %v", matchFirst), func(t *testing.T) {
			rs := cluster(t, 2)
			url := backendURLs[2]
			reasons := []router.Reason{router.ReasonCold, router.ReasonMatch}
			if matchFirst {
				reasons[0], reasons[1] = reasons[1], reasons[0]
			}
			ks := make([]*key.Key, 2)
			ds := make([]router.Decision, 2)
			ls := make([]router.Learned, 2)
			for i, r := range rs {
				ks[i] = prompt(t, 970+i)
				ds[i] = router.Decision{Backend: r.byName(url), Reason: reasons[i], PrefillWork: r.node.Policy().RoutedWork(ks[i], 0)}
			}
			decided := time.Now() // both decided before either Hold is sent
			for i, r := range rs {
				if ls[i] = r.node.Policy().Hold(ks[i], ds[i]); ls[i] == 0 {
					t.Fatalf("r%d held nothing", i)
				}
			}
			for i, r := range rs {
				other := ls[1-i]
				testutil.Eventually(t, wait, fmt.Sprintf("r%d has r%d's decision", i, 1-i),
					func() bool { return r.node.arrivals.has(r.byName(url).ID, int64(other)) })
			}
			for i, r := range rs {
				again := r.node.Policy().Release(ks[i], ds[i], ls[i], decided)
				if want := ds[i].Reason != router.ReasonMatch; again != want {
					t.Errorf("r%d (%v, stamped %s): again %v, want %v", i, ds[i].Reason, map[bool]string{true: "first", false: "second"}[i == 0], again, want)
				}
			}
		})
	}
}

// TestSettleAgainstSentAtOnce: a decision sent at once (Learn: too short to hold) cannot move
// and ranks by its stamp: a held decision, a flexible one included, is decided again for one
// stamped before it and keeps its backend against one stamped after it.
func TestSettleAgainstSentAtOnce(t *testing.T) {
	for _, sentFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("sent at once first %v", sentFirst), func(t *testing.T) {
			rs := cluster(t, 2)
			url := backendURLs[2]
			held, sent := prompt(t, 980), prompt(t, 981)
			d := router.Decision{Backend: rs[0].byName(url), Reason: router.ReasonCold, PrefillWork: rs[0].node.Policy().RoutedWork(held, 0)}
			decided := time.Now() // before either goes out
			learn := func() router.Learned {
				l := rs[1].node.Policy().Learn(sent, rs[1].byName(url), 0)
				if l == 0 {
					t.Fatal("r1 learned nothing")
				}
				return l
			}
			var ls router.Learned
			if sentFirst {
				ls = learn()
			}
			l := rs[0].node.Policy().Hold(held, d)
			if l == 0 {
				t.Fatal("r0 held nothing")
			}
			if !sentFirst {
				ls = learn()
			}
			testutil.Eventually(t, wait, "r0 has r1's decision",
				func() bool { return rs[0].node.arrivals.has(d.Backend.ID, int64(ls)) })
			if again := rs[0].node.Policy().Release(held, d, l, decided); again != sentFirst {
				t.Errorf("held cold decision: again %v, want %v (the decision sent at once stamped %s)", again, sentFirst, map[bool]string{true: "before it", false: "after it"}[sentFirst])
			}
		})
	}
}

// has reports whether the decision stamped stamp on backend id arrived.
func (a *arrivals) has(id uint64, stamp int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, x := range a.ring {
		if x.id == id && x.stamp == stamp {
			return true
		}
	}
	return false
}

// TestHeldDecisionCountedOnce: a held request that keeps its backend reaches a peer as two
// groups, the decision (Hold) and its hashes (Release, work 0); the peer counts one decision
// of the Hold's work (a second count, even of work 0, would tick the recent share's decay
// clock) and records the hashes.
func TestHeldDecisionCountedOnce(t *testing.T) {
	a, b := loadPair(t)
	url := backendURLs[3]
	k := prompt(t, 950)
	d := router.Decision{Backend: a.byName(url), PrefillWork: a.node.Policy().RoutedWork(k, 0)}
	decided := time.Now()
	l := a.node.Policy().Hold(k, d)
	if l == 0 {
		t.Fatal("nothing held")
	}
	if a.node.Policy().Release(k, d, l, decided) {
		t.Fatal("decided again with no peer decision ahead")
	}
	testutil.Eventually(t, wait, "b records the kept hashes", func() bool { return b.node.Policy().Index().Entries() > 0 })
	barrier(t, a, b, url) // a group counted twice has arrived by then
	got := b.node.Policy().RecentWork(b.byName(url))
	if want := float64(d.PrefillWork); math.Abs(got-want) > 1e-9*want {
		t.Errorf("b's recent work on %s is %.6f, want %.0f: the held decision counted once", url, got, want)
	}
	if !b.node.arrivals.has(d.Backend.ID, int64(l)) {
		t.Error("b did not record the held decision's arrival")
	}
	if sent := delayCount(a.node.Stats().SendDelay); sent != 1 {
		t.Errorf("a observed the held decision's send %d times, want once (its Hold's)", sent)
	}
}

// TestUnstampedDecisionNoDelay: a decision that recorded nothing (a prompt under one chunk)
// has no stamp: the peer counts it in the backend's recent share, and neither the sender's
// send delay nor the peer's decision delay observes it (a stamp of 0 would read as 56 years).
func TestUnstampedDecisionNoDelay(t *testing.T) {
	a, b := loadPair(t)
	url := backendURLs[1]
	a.node.q.push(a.byName(url).ID, 0, 1000, nil, &a.node.m)
	testutil.Eventually(t, wait, "b counts the unstamped decision", func() bool {
		return b.node.Policy().RecentWork(b.byName(url)) > 0
	})
	for _, c := range []struct {
		who string
		bs  []DelayBucket
	}{{"b's decision delay", b.node.Stats().DecisionDelay}, {"a's send delay", a.node.Stats().SendDelay}} {
		if len(c.bs) != 0 {
			t.Errorf("%s observed %v for an unstamped decision, want nothing", c.who, c.bs)
		}
	}
}

// TestAbandonSendsNoForget: a held request whose client left is withdrawn from the holding
// replica's index, and nothing goes to the peers, whose only news of it was the Hold's
// decision (no chunks): an Unlearn there would send a forget of the whole prompt.
func TestAbandonSendsNoForget(t *testing.T) {
	a, b := loadPair(t)
	url := backendURLs[3]
	k := prompt(t, 950)
	bk := a.byName(url)
	l := a.node.Policy().Hold(k, router.Decision{Backend: bk, Reason: router.ReasonCold})
	if l == 0 {
		t.Fatal("nothing held")
	}
	testutil.Eventually(t, wait, "b hears of the held decision", func() bool { return b.node.arrivals.has(bk.ID, int64(l)) })
	if a.node.Policy().Index().Entries() == 0 {
		t.Fatal("the hold learned nothing locally")
	}
	a.node.Policy().Abandon(k, bk, l)
	if n := a.node.Policy().Index().Entries(); n != 0 {
		t.Errorf("a still lists %d entries of the abandoned request", n)
	}
	barrier(t, a, b, bk.Name) // a forget sent has arrived by then
	if n := a.node.m.forgetsSent.Get(); n != 0 {
		t.Errorf("a sent %d forgets for a request whose chunks never went out", n)
	}
	if n := b.node.m.forgetsRecv.Get(); n != 0 {
		t.Errorf("b received %d forgets", n)
	}
	if n := b.node.Policy().Index().Entries(); n != 0 {
		t.Errorf("b lists %d entries of a request it never got chunks of", n)
	}
}

// TestQueueBoundsDecisions: decisions without hashes (a Hold's, a prompt held whole) are
// bounded too: past maxQueuedItems waiting for a flush, they are dropped and counted.
func TestQueueBoundsDecisions(t *testing.T) {
	m := newMetrics(func() float64 { return 0 })
	var q queue
	for i := range maxQueuedItems + 10 {
		q.push(1, int64(i+1), 100, nil, &m)
	}
	if n := len(q.items); n != maxQueuedItems {
		t.Errorf("%d decisions queued, want the bound %d", n, maxQueuedItems)
	}
	if n := m.dropped.Get(); n != 10 {
		t.Errorf("%d drops counted, want 10", n)
	}
}
