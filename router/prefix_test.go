package router

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// Ties never go by list order: the same snapshot in any order picks the same backend, and
// different prompts pick different backends.
func TestTieBreakIndependentOfOrder(t *testing.T) {
	cs := []cand{{id: 11, weight: 1, matched: 3}, {id: 22, weight: 1, matched: 3}, {id: 33, weight: 1, matched: 3}, {id: 44, weight: 1, matched: 0}}
	in := costInput{promptTokens: int64(key.PrefixTokens(4, key.DefaultChunkTokens)), chunkTokens: key.DefaultChunkTokens}
	seen := map[uint64]bool{}
	for i := range 40 {
		chunks := chunkChain(nil).extend(fmt.Sprint("p", i), 4)
		a := slices.Clone(cs)
		estimate(a, in)
		j, _ := pickCost(chunks, a, testSel(0, false), nil)
		want := a[j].id
		rev := slices.Clone(cs)
		slices.Reverse(rev)
		estimate(rev, in)
		if k, _ := pickCost(chunks, rev, testSel(0, false), nil); rev[k].id != want {
			t.Fatalf("prompt %d: picked %d in one order, %d in the other", i, want, rev[k].id)
		}
		seen[want] = true
	}
	if len(seen) != 3 {
		t.Errorf("ties went to %d distinct backends over 40 prompts, want all 3 holders", len(seen))
	}
}

func TestPickFallbacks(t *testing.T) {
	bs := prefixBackends(t, 3)
	p, _ := newTestPrefix(t, bs)
	if d := p.Pick(routedKey(nil), nil); d.Backend != nil {
		t.Errorf("no candidates: picked %v", d.Backend.Name)
	}
	var rs inflight
	defer rs.releaseAll()
	rs.begin(bs[0], 10)
	rs.begin(bs[1], 10)
	// Passthrough and parse-fallback are the Decider's (decider_test.go); an unparsed body
	// has no chunks and is placed as a short prompt is.
	if d := p.Pick(&key.Key{Routed: true}, bs); d.Reason != ReasonLeastLoad || d.Backend != bs[2] {
		t.Errorf("unparsed: %s on %s, want least-load on the idle %s", d.Reason, d.Backend.Name, bs[2].Name)
	}
	short := &key.Key{Routed: true, OK: true, PromptTokens: 20} // no full chunk
	if d := p.Pick(short, bs); d.Reason != ReasonLeastLoad || d.Backend != bs[2] {
		t.Errorf("no chunks: %s on %s, want least-load on %s", d.Reason, d.Backend.Name, bs[2].Name)
	}
}

// Least-load (the mode, and prefix mode's short prompts) ranks by backend.Busy: a replica
// whose last scrape still lists this proxy's requests answered since is idle, and one whose
// scrape listed another sender's requests is not.
func TestLeastLoadedCountsOnlyOtherSendersFromTheScrape(t *testing.T) {
	bs := prefixBackends(t, 3)
	var rs inflight
	defer rs.releaseAll()
	// bs[0]: 4 of this proxy's, scraped with them, answered since (stale, not load); bs[1]:
	// scraped with 2 of another sender's; bs[2]: 1 of this proxy's in flight now.
	var ls [4]backend.Lease
	for i := range ls {
		ls[i].Begin(bs[0], 0, 0, false)
	}
	bs[0].SetScrapedLoad(4, 0)
	for i := range ls {
		ls[i].Release()
	}
	bs[1].SetScrapedLoad(2, 0)
	rs.begin(bs[2], 10)
	for start := range uint64(3) {
		if got := LeastLoaded(bs, start); got != bs[0] {
			t.Errorf("start %d: %s (busy %d %d %d), want %s, whose scraped requests were all answered", start, got.Name, bs[0].Busy(), bs[1].Busy(), bs[2].Busy(), bs[0].Name)
		}
	}
	short := &key.Key{Routed: true, OK: true, PromptTokens: 20} // no full chunk: short
	for _, pol := range []Policy{&LeastLoad{}, func() Policy { p, _ := newTestPrefix(t, bs); return p }()} {
		if d := pol.Pick(short, bs); d.Backend != bs[0] || d.Reason != ReasonLeastLoad {
			t.Errorf("%T: %s on %s, want least-load on %s", pol, d.Reason, d.Backend.Name, bs[0].Name)
		}
	}
}

// (a) Groups of requests sharing long system prompts: each group sticks to one backend while
// a round's requests overlap (the work its prefix saves outweighs the others' queues), its
// home is where the ring puts the group's first chunk when all backends are idle (a ring
// built here from the backends' names, as any prefixlb replica builds it; and a second,
// independent Prefix agrees), and the groups spread as the ring spreads keys.
func TestGroupsStickAndSpread(t *testing.T) {
	for _, groups := range []int{8, 64} {
		t.Run(fmt.Sprint(groups, " groups"), func(t *testing.T) {
			bs := prefixBackends(t, 4)
			p, clk := newTestPrefix(t, bs)
			sys := make([]chunkChain, groups)
			for g := range sys {
				sys[g] = chunkChain(nil).extend(fmt.Sprint("system prompt of group ", g), 32)
			}
			home := make([]*backend.Backend, groups)
			ownerHome := make([]bool, groups) // the first request went to the ring owner, unloaded
			var rs inflight
			stayed, later := 0, 0
			for round := range 10 {
				for g := range groups {
					k := routedKey(sys[g].extend(fmt.Sprintf("question %d", round), 4))
					owner := ringOwner(bs, sys[g][key.HeadChunks-1])
					ownerQueued := owner.PrefillTokens()
					least := ownerQueued
					for _, b := range bs {
						least = min(least, b.PrefillTokens())
					}
					d := pickAndLearn(t, p, k, bs, &rs)
					if round == 0 {
						home[g] = d.Backend
						// Cold everywhere: the ring owner unless its queue made it slower than
						// another by more than the near-tie margin.
						ownerHome[g] = ownerQueued == least && d.Backend == owner
						if d.Reason != ReasonCold || (ownerQueued == least && d.Backend != owner) {
							t.Errorf("group %d first request: %s (%s), want the ring owner %s (cold) unless it queued more (%d vs least %d)", g, d.Backend.Name, d.Reason, owner.Name, ownerQueued, least)
						}
						continue
					}
					// Later requests go where the group's prompt is held: its home, or another
					// replica it was sent to when the home's queue was longer.
					if d.Reason != ReasonMatch {
						t.Errorf("round %d group %d: %s (%s), want a holder (match)", round, g, d.Backend.Name, d.Reason)
					}
					if d.Backend == home[g] {
						stayed++
					}
					later++
				}
				rs.releaseAll() // a round's requests overlap, then finish
				clk.t = clk.t.Add(time.Second)
			}
			// Another prefixlb replica (its own Backend objects, listed in another order) sends
			// each group's first request where this one did when nothing was in flight.
			other := prefixBackends(t, 4)
			slices.Reverse(other)
			q, _ := newTestPrefix(t, other)
			agreed := 0
			for g := range groups {
				if !ownerHome[g] {
					continue
				}
				k := routedKey(sys[g].extend("question 0", 4))
				if d := q.Pick(k, other); d.Backend.Name != home[g].Name || d.Reason != ReasonCold {
					t.Errorf("group %d: an independent Prefix picks %s (%s), this one %s", g, d.Backend.Name, d.Reason, home[g].Name)
				}
				agreed++
			}
			t.Logf("%d of %d groups placed on an unloaded ring owner, checked against an independent Prefix; %d of %d later requests at the group's first home", agreed, groups, stayed, later)
			if stayed*10 < later*8 {
				t.Errorf("only %d of %d later requests went to their group's first home, want 80%%", stayed, later)
			}
			if agreed < groups/4 {
				t.Errorf("only %d of %d groups were placed on an unloaded ring owner; the agreement check is too weak", agreed, groups)
			}
			per := map[string]int{}
			for _, b := range home {
				per[b.Name]++
			}
			t.Logf("groups per backend: %v", per)
			if groups == 8 && len(per) < 3 {
				t.Errorf("8 groups landed on %d backends, want at least 3", len(per))
			}
			if groups == 64 {
				for _, b := range bs {
					if n := per[b.Name]; n < 8 || n > 24 {
						t.Errorf("%s is home to %d of 64 groups, want 8..24", b.Name, n)
					}
				}
			}
		})
	}
}

// (c) A saturated backend's prefix requests go elsewhere.
func TestSaturatedBackendOverflows(t *testing.T) {
	bs := prefixBackends(t, 4)
	p, _ := newTestPrefix(t, bs)
	doc := chunkChain(nil).extend("a long document", 40)
	p.Learn(routedKey(doc), bs[0], 0)
	p.Learn(routedKey(doc[:10]), bs[1], 0)
	k := routedKey(doc.extend("question", 2))
	if d := p.Pick(k, bs); d.Backend != bs[0] || d.Reason != ReasonMatch || d.MatchedChunks != 40 {
		t.Fatalf("idle: %s (%s, %d chunks), want %s (match, 40)", d.Backend.Name, d.Reason, d.MatchedChunks, bs[0].Name)
	}
	var rs inflight
	defer rs.releaseAll()
	for range 10 {
		rs.begin(bs[0], 1000)
	}
	// The cap is ceil(1.25·11/4)+2 = 6: bs[0] with 10 is over; bs[1] holds the next best.
	d := p.Pick(k, bs)
	if d.Backend != bs[1] || d.Reason != ReasonOverload || d.MatchedChunks != 10 {
		t.Errorf("saturated: %s (%s, %d chunks), want %s (overload-fallback, 10)", d.Backend.Name, d.Reason, d.MatchedChunks, bs[1].Name)
	}
	// Without a partial holder the ring places the overflow, still not on bs[0].
	d = p.Pick(k, []*backend.Backend{bs[0], bs[2], bs[3]})
	if d.Backend == bs[0] || d.Reason != ReasonOverload {
		t.Errorf("saturated, no partial holder: %s (%s), want another backend (overload-fallback)", d.Backend.Name, d.Reason)
	}
}

// (d) A removed or restarted backend loses its entries: matching no longer picks it.
func TestRemovedOrRestartedForgotten(t *testing.T) {
	for _, tt := range []struct {
		name   string
		forget func(p *Prefix, bs []*backend.Backend)
	}{
		{"removed and re-added", func(p *Prefix, bs []*backend.Backend) {
			p.SetBackends(bs[1:])
			for _, s := range p.Index().Stats(nil) {
				if s.Name == bs[0].Name {
					t.Errorf("removed backend still in the index: %+v", s)
				}
			}
			p.SetBackends(bs)
		}},
		{"restarted", func(_ *Prefix, bs []*backend.Backend) { bs[0].ResetCache() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bs := prefixBackends(t, 4)
			p, _ := newTestPrefix(t, bs)
			doc := chunkChain(nil).extend("doc", 20)
			p.Learn(routedKey(doc), bs[0], 0)
			if d := p.Pick(routedKey(doc), bs); d.Backend != bs[0] || d.Reason != ReasonMatch {
				t.Fatalf("before: %s (%s), want %s (match)", d.Backend.Name, d.Reason, bs[0].Name)
			}
			tt.forget(p, bs)
			d := p.Pick(routedKey(doc), bs)
			if d.Reason != ReasonCold || d.MatchedChunks != 0 {
				t.Errorf("after: %s (%s, %d chunks), want cold with no match", d.Backend.Name, d.Reason, d.MatchedChunks)
			}
		})
	}
}

// (e) Multi-turn: turn n+1 of a conversation goes where turn n went, under moderate load.
func TestMultiTurnFollowsConversation(t *testing.T) {
	bs := prefixBackends(t, 4)
	p, clk := newTestPrefix(t, bs)
	var background inflight
	defer background.releaseAll()
	for _, b := range bs {
		background.begin(b, 500)
		background.begin(b, 500)
	}
	sys := chunkChain(nil).extend("assistant system prompt", 4)
	const convs = 16
	conv := make([]chunkChain, convs)
	where := make([]*backend.Backend, convs)
	var rs inflight
	for turn := range 6 {
		for c := range convs {
			conv[c] = conv[c].extend(fmt.Sprintf("conv %d turn %d", c, turn), 6)
			if turn == 0 {
				conv[c] = append(slices.Clone(sys), conv[c]...)
			}
			d := pickAndLearn(t, p, routedKey(conv[c]), bs, &rs)
			if turn > 0 && (d.Backend != where[c] || d.Reason != ReasonMatch) {
				t.Errorf("conv %d turn %d: %s (%s), want %s where turn %d went", c, turn, d.Backend.Name, d.Reason, where[c].Name, turn-1)
			}
			where[c] = d.Backend
		}
		rs.releaseAll()
		clk.t = clk.t.Add(10 * time.Second)
	}
}

// (f) Two independent prefixlb replicas (separate Backend objects, lists in different
// order) place the same cold prefixes on the same backends.
func TestIndependentInstancesAgree(t *testing.T) {
	a, b := prefixBackends(t, 5), prefixBackends(t, 5)
	slices.Reverse(b)
	pa, _ := newTestPrefix(t, a)
	pb, _ := newTestPrefix(t, b)
	used := map[string]bool{}
	for i := range 200 {
		k := routedKey(chunkChain(nil).extend(fmt.Sprint("new prefix ", i), 8))
		da, db := pa.Pick(k, a), pb.Pick(k, b)
		if da.Backend.Name != db.Backend.Name || da.Reason != ReasonCold || db.Reason != ReasonCold {
			t.Fatalf("prefix %d: %s (%s) vs %s (%s)", i, da.Backend.Name, da.Reason, db.Backend.Name, db.Reason)
		}
		used[da.Backend.Name] = true
	}
	if len(used) != 5 {
		t.Errorf("200 cold prefixes used %d of 5 backends", len(used))
	}
}

// Prompts shorter than one chunk rotate among equally loaded backends instead of all going to
// the one a fixed tie hash prefers.
func TestShortPromptsRotate(t *testing.T) {
	var bs []*backend.Backend
	for i := 0; i < 3; i++ {
		b, _ := backend.New(fmt.Sprintf("http://short-%d:8000", i), 0, 1)
		bs = append(bs, b)
	}
	p := NewPrefix(PrefixOptions{}, nil)
	p.SetBackends(bs)
	seen := map[*backend.Backend]int{}
	for i := 0; i < 9; i++ {
		d := p.Pick(&key.Key{Routed: true, OK: true}, bs)
		if d.Reason != ReasonLeastLoad {
			t.Fatalf("reason %v, want least-load", d.Reason)
		}
		seen[d.Backend]++
	}
	if len(seen) != 3 {
		t.Errorf("9 short prompts went to %d backends, want 3", len(seen))
	}
}
