package flowcontrol

import (
	"strings"
	"testing"
)

// The round-robin fairness option (Config.Fairness, llm-d's default between flows): the
// backlogged flows of a band take turns, one request each, whatever a request costs, and a
// flow's settled work does not move its turn; VTC beside it on the same pushes orders by
// work. Each case pushes its items in order, then pops (dispatching and settling each at
// once unless told otherwise) and checks the flows' order.
func TestRoundRobinFairness(t *testing.T) {
	type push struct {
		flow  string
		n     int
		cost  Cost
		prio  int
		after int // pushed once this many items have been popped (0: before the first pop)
	}
	small := Cost{UncachedPrefillTokens: 100, OutputTokens: 50} // work 200
	large := Cost{UncachedPrefillTokens: 4000}                  // work 4000: 20× small
	for _, tc := range []struct {
		name     string
		fairness string
		pushes   []push
		// settle is the real cost Settle charges a popped item (nil: its predicted cost).
		settle  func(it *Item) Cost
		requeue int // pop this many, put the last back, then pop the rest (0: none)
		pops    int
		want    string // the popped items' flows, one letter each
	}{
		{name: "round-robin alternates flows of 20x different cost", fairness: FairnessRoundRobin,
			pushes: []push{{flow: "a", n: 4, cost: large}, {flow: "b", n: 4, cost: small}},
			pops:   8, want: "abababab"},
		{name: "vtc on the same pushes serves the cheap flow by work", fairness: FairnessVTC,
			pushes: []push{{flow: "a", n: 4, cost: large}, {flow: "b", n: 4, cost: small}},
			pops:   5, want: "abbbb"},
		{name: "default is vtc", fairness: "",
			pushes: []push{{flow: "a", n: 4, cost: large}, {flow: "b", n: 4, cost: small}},
			pops:   5, want: "abbbb"},
		{name: "round-robin three flows one request each per round", fairness: FairnessRoundRobin,
			pushes: []push{{flow: "a", n: 3, cost: small}, {flow: "b", n: 3, cost: large}, {flow: "c", n: 3, cost: small}},
			pops:   9, want: "abcabcabc"},
		{name: "round-robin ignores the settled work", fairness: FairnessRoundRobin,
			pushes: []push{{flow: "a", n: 3, cost: small}, {flow: "b", n: 3, cost: small}},
			settle: func(it *Item) Cost {
				if it.Flow == "a" {
					return Cost{UncachedPrefillTokens: 200_000} // a's requests cost 1000× their prediction
				}
				return it.Cost
			},
			pops: 6, want: "ababab"},
		{name: "vtc charges the settled work", fairness: FairnessVTC,
			pushes: []push{{flow: "a", n: 3, cost: small}, {flow: "b", n: 3, cost: small}},
			settle: func(it *Item) Cost {
				if it.Flow == "a" {
					return Cost{UncachedPrefillTokens: 200_000}
				}
				return it.Cost
			},
			pops: 4, want: "abbb"},
		{name: "round-robin: a flow arriving late joins the rotation without a burst", fairness: FairnessRoundRobin,
			pushes: []push{{flow: "a", n: 6, cost: small}, {flow: "b", n: 6, cost: small}, {flow: "c", n: 6, cost: small, after: 4}},
			pops:   10, want: "abababcabc"}, // c joins at the end of the round it arrives in
		{name: "round-robin: requeue gives the turn back", fairness: FairnessRoundRobin,
			pushes:  []push{{flow: "a", n: 3, cost: small}, {flow: "b", n: 3, cost: small}},
			requeue: 1, pops: 4, want: "abab"},
		{name: "round-robin: FCFS within a flow, bands strict with no share", fairness: FairnessRoundRobin,
			pushes: []push{{flow: "lo", n: 2, cost: small, prio: 0}, {flow: "a", n: 2, cost: large, prio: 1}, {flow: "b", n: 2, cost: small, prio: 1}},
			pops:   6, want: "a b a b lo lo "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew(t, Config{Fairness: tc.fairness, MinBandShare: -1})
			items := map[*Item]int{} // push order within its flow
			seqs := map[string]int{}
			pushAt := func(popped int) {
				for _, p := range tc.pushes {
					if p.after != popped {
						continue
					}
					for range p.n {
						it := &Item{Flow: p.flow, Priority: p.prio, Cost: p.cost}
						if err := q.Push(it, true); err != nil {
							t.Fatal(err)
						}
						items[it] = seqs[p.flow]
						seqs[p.flow]++
					}
				}
			}
			pushAt(0)
			if tc.requeue > 0 {
				var last *Item
				for range tc.requeue {
					last = q.Next(t0)
				}
				if !q.Requeue(last) {
					t.Fatal("Requeue refused a popped item")
				}
			}
			var got strings.Builder
			next := map[string]int{}
			for i := range tc.pops {
				it := q.Next(t0)
				if it == nil {
					t.Fatalf("pop %d: queue empty, got %q so far", i, got.String())
				}
				if items[it] != next[it.Flow] {
					t.Fatalf("flow %s: popped its request %d before %d (FCFS within a flow)", it.Flow, items[it], next[it.Flow])
				}
				next[it.Flow]++
				got.WriteString(it.Flow)
				if len(it.Flow) > 1 || strings.Contains(tc.want, " ") {
					got.WriteString(" ")
				}
				q.Dispatched(it)
				c := it.Cost
				if tc.settle != nil {
					c = tc.settle(it)
				}
				q.Settle(it, c)
				pushAt(i + 1)
			}
			if got.String() != tc.want {
				t.Fatalf("order %q, want %q", got.String(), tc.want)
			}
		})
	}
}

// Fairness is validated, and a reload may switch it: the queue keeps its items and orders
// them by the new policy from then on.
func TestFairnessConfig(t *testing.T) {
	if _, err := New(Config{Fairness: "wfq"}); err == nil || !strings.Contains(err.Error(), "Fairness") {
		t.Fatalf("New with Fairness wfq: err %v, want one naming Fairness", err)
	}
	q := mustNew(t, Config{})
	if got := q.Config().Fairness; got != FairnessVTC {
		t.Fatalf("default Fairness %q, want %q", got, FairnessVTC)
	}
	for range 3 {
		for _, f := range []string{"a", "b"} {
			c := Cost{UncachedPrefillTokens: 100}
			if f == "a" {
				c.UncachedPrefillTokens = 4000
			}
			if err := q.Push(&Item{Flow: f, Cost: c}, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	it := q.Next(t0) // vtc: a (older head at equal counters), charged 4000
	q.Dispatched(it)
	q.Settle(it, it.Cost)
	if err := q.Reconfigure(Config{Fairness: "wfq"}); err == nil {
		t.Fatal("Reconfigure accepted Fairness wfq")
	}
	if err := q.Reconfigure(Config{Fairness: FairnessRoundRobin}); err != nil {
		t.Fatal(err)
	}
	var got string
	for it := q.Next(t0); it != nil; it = q.Next(t0) {
		got += it.Flow
		q.Dispatched(it)
		q.Settle(it, it.Cost)
	}
	// Levelled at the switch, then one turn each: b's head is older than a's second item.
	if got != "babab" {
		t.Fatalf("after switching to round-robin: order %q, want babab", got)
	}
}
