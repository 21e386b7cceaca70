package router

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/hashring"
	"github.com/prefixlb/prefixlb/router/key"
)

// ringOwner is the backend that owns key on a ring built from bs's names and weights, as
// every prefixlb replica builds it: an oracle independent of the Prefix under test.
func ringOwner(bs []*backend.Backend, key uint64) *backend.Backend {
	ms := make([]hashring.Member, len(bs))
	for i, b := range bs {
		ms[i] = hashring.Member{Name: b.Name, Weight: b.Weight()}
	}
	return bs[hashring.New(ms).Lookup(key, nil)]
}

// (b) Every request shares one long system prompt and then differs: the load spreads
// within the cap (pickLearn checks every pick against it) instead of all going to the
// first backend that learned the prompt. Once every backend holds the prompt it no longer
// decides, and requests are placed by what follows it.
func TestHotSharedPrefixSpreads(t *testing.T) {
	bs := prefixBackends(t, 4)
	p, _ := newTestPrefix(t, bs)
	sys := chunkChain(nil).extend("the one system prompt", 48)
	var rs inflight
	run := func(requests, window int) (served map[*backend.Backend]int, reasons map[Reason]int) {
		served, reasons = map[*backend.Backend]int{}, map[Reason]int{}
		for i := range requests {
			if len(rs) >= window {
				rs.releaseOldest()
			}
			d := pickAndLearn(t, p, routedKey(sys.extend(fmt.Sprint("user ", window, i), 6)), bs, &rs)
			served[d.Backend]++
			reasons[d.Reason]++
		}
		return served, reasons
	}
	// Moderate load: 24 in flight, a cap of 10. Three holders can carry it all within
	// the cap, so the fourth may stay idle; none is over the cap.
	served, reasons := run(400, 24)
	t.Logf("24 in flight: %v", reasons)
	if len(served) < 3 {
		t.Errorf("24 in flight: %d backends used, want at least 3", len(served))
	}
	for b, n := range served {
		if n > 400*45/100 {
			t.Errorf("24 in flight: %s served %d of 400", b.Name, n)
		}
	}
	// High load: 160 in flight, a cap of 52: the fourth backend must take its share,
	// learns the prompt, and from then on requests spread by their own first chunk.
	served, reasons = run(800, 160)
	t.Logf("160 in flight: %v", reasons)
	for _, b := range bs {
		if n := served[b]; n < 800*15/100 || n > 800*35/100 {
			t.Errorf("160 in flight: %s served %d of 800, want 15..35%%", b.Name, n)
		}
	}
	if reasons[ReasonCold] < 600 {
		t.Errorf("160 in flight: reasons %v, want most placed cold", reasons)
	}
	rs.releaseAll()
}

// A thin match (a block every request starts with, a small part of the prompt) does not
// concentrate overlapping requests on its holder: its saving is outweighed as soon as the
// holder's queue is longer by as much. A fat match (a conversation's history) stays on its
// holder under the same load.
func TestThinMatchDoesNotConcentrateLoad(t *testing.T) {
	bs := prefixBackends(t, 4)
	p, _ := newTestPrefix(t, bs)
	hot := chunkChain(nil).extend("block every request starts with", 4) // 16 + 3×64 = 208 tokens
	p.Learn(routedKey(hot), bs[0], 0)
	var held inflight
	defer held.releaseAll()
	thinHits := map[*backend.Backend]int{}
	for i := 0; i < 40; i++ {
		// Requests overlap: each stays in flight, its prefill queued where it went.
		req := routedKey(append(slices.Clone(hot), chunkChain(nil).extend(fmt.Sprintf("request %d", i), 20)...))
		d := pickAndLearn(t, p, req, bs, &held)
		thinHits[d.Backend]++
	}
	// The shared block saves 208 of ~1500 tokens: once the holder has that much more queued
	// than the others it is no near-tie, so the requests spread about evenly.
	for _, b := range bs {
		if n := thinHits[b]; n < 6 || n > 14 {
			t.Errorf("thin matches: %s got %d of 40, want about 10 each (%v)", b.Name, n, thinHits)
		}
	}
	fat := routedKey(append(slices.Clone(hot), chunkChain(nil).extend("a long conversation", 30)...))
	p.Learn(fat, bs[0], 0)
	if d := p.Pick(fat, bs); d.Backend != bs[0] || d.Reason != ReasonMatch {
		t.Errorf("fat match: %s (%s), want the holder %s (match)", d.Backend.Name, d.Reason, bs[0].Name)
	}
}

// Near-ties follow the ring: a prefixlb replica that has a little of its own prefill queued on
// the ring owner of a cold prompt still sends it there, as an idle replica does, so the two
// agree where the prefix lives; with exact ties only (NoTieMargin) the small queue decides and
// they disagree. A queue far beyond the margin moves the prompt in either setting.
func TestNearTiesFollowTheRing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		margin float64
		queued int // tokens queued on the ring owner by this replica
		agree  bool
	}{
		{"default margin, small queue", 0, 40, true},
		{"exact ties only, small queue", NoTieMargin, 40, false},
		{"default margin, long queue", 0, 5000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idleBs, busyBs := prefixBackends(t, 4), prefixBackends(t, 4)
			idle := NewPrefix(PrefixOptions{TieMargin: tc.margin}, nil)
			idle.SetBackends(idleBs)
			// The busy replica's clock stands at the queue's start, so that its few queued
			// tokens do not drain (backend.QueuedPrefill) while a slow machine gets to Pick.
			start := time.Now()
			busy := NewPrefix(PrefixOptions{TieMargin: tc.margin}, func() time.Time { return start })
			busy.SetBackends(busyBs)
			prompt := chunkChain(nil).extend("a cold conversation", 16) // 1024 tokens
			owner := 0
			for i, b := range idleBs {
				if b == ringOwner(idleBs, prompt[key.HeadChunks-1]) {
					owner = i
				}
			}
			var rs inflight
			defer rs.releaseAll()
			rs.begin(busyBs[owner], tc.queued)
			a, b := idle.Pick(routedKey(prompt), idleBs), busy.Pick(routedKey(prompt), busyBs)
			if a.Backend != idleBs[owner] || a.Reason != ReasonCold {
				t.Fatalf("idle replica: %s (%s), want the ring owner %s (cold)", a.Backend.Name, a.Reason, idleBs[owner].Name)
			}
			if agree := a.Backend.Name == b.Backend.Name; agree != tc.agree {
				t.Fatalf("replicas agree: %v (%s vs %s), want %v", agree, a.Backend.Name, b.Backend.Name, tc.agree)
			}
		})
	}
}

// tieBreakSetup is the tie-break tests' ring of n equal backends (IDs 100, 101, ...) and the
// cost input of a 4-chunk cold prompt.
func tieBreakSetup(n int) (*placement, []uint64, costInput) {
	ms := make([]hashring.Member, n)
	ids := make([]uint64, n)
	for i := range n {
		ms[i] = hashring.Member{Name: fmt.Sprint("http://b", i), Weight: 1}
		ids[i] = uint64(100 + i)
	}
	in := costInput{promptTokens: int64(key.PrefixTokens(4, key.DefaultChunkTokens)), chunkTokens: key.DefaultChunkTokens}
	return &placement{ring: hashring.New(ms), ids: ids}, ids, in
}

// TestTieBreakLoad: with TieBreakLoad a cold prompt's near-ties go to the least loaded
// (in-flight per weight), the ring deciding only among equally loaded ones; with TieBreakRing
// the ring decides whatever the loads, so the ring's own choice is the same in every replica.
func TestTieBreakLoad(t *testing.T) {
	const n = 4
	place, ids, in := tieBreakSetup(n)
	mk := func(loads [n]int64) []cand {
		cs := make([]cand, n)
		for i := range cs {
			cs[i] = cand{id: ids[i], weight: 1, inFlight: loads[i], rate: 10_000, base: 0.02}
		}
		estimate(cs, in)
		return cs
	}
	ringMoved, loadMoved := 0, 0
	for i := range 64 {
		chunks := chunkChain(nil).extend(fmt.Sprint("cold", i), 4)
		idle := mk([n]int64{0, 0, 0, 0})
		r, _ := pickCost(chunks, idle, testSel(0.5, false), place)
		l, _ := pickCost(chunks, idle, testSel(0.5, true), place)
		if r != l {
			t.Fatalf("prompt %d, equal loads: ring picked %d, load-first %d (want the ring's choice)", i, r, l)
		}
		// Load everyone but one backend that is not the ring's choice.
		free := (r + 1 + i%(n-1)) % n
		var loads [n]int64
		for j := range loads {
			if j != free {
				loads[j] = 1
			}
		}
		busy := mk(loads)
		if j, _ := pickCost(chunks, busy, testSel(0.5, true), place); j != free {
			t.Fatalf("prompt %d: load-first picked %d (in-flight %d), want the idle %d", i, j, busy[j].inFlight, free)
		} else if j != r {
			loadMoved++
		}
		if j, _ := pickCost(chunks, busy, testSel(0.5, false), place); j != r {
			ringMoved++
		}
	}
	if ringMoved != 0 || loadMoved != 64 {
		t.Errorf("ring tie-break moved %d of 64 prompts with load (want 0), load tie-break %d (want 64)", ringMoved, loadMoved)
	}
}

// TestTieBreakAuto: TieBreakAuto breaks a cold prompt's near-ties by load while every
// candidate is alone (only this proxy sends to it), and by the ring alone as soon as one
// candidate has another sender or is not judged yet.
func TestTieBreakAuto(t *testing.T) {
	const n = 4
	place, ids, in := tieBreakSetup(n)
	auto := testSel(0.5, false)
	auto.auto = true
	cases := []struct {
		name   string
		alone  [n]bool
		byLoad bool
	}{
		{"all alone", [n]bool{true, true, true, true}, true},
		{"one shared or unknown", [n]bool{true, true, false, true}, false},
		{"none judged", [n]bool{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 32 {
				chunks := chunkChain(nil).extend(fmt.Sprint("cold", i), 4)
				idle := make([]cand, n)
				for j := range idle {
					idle[j] = cand{id: ids[j], weight: 1, rate: 10_000, base: 0.02, alone: tc.alone[j]}
				}
				estimate(idle, in)
				ring, _ := pickCost(chunks, idle, testSel(0.5, false), place)
				// Load everyone but one backend that is not the ring's choice.
				free := (ring + 1 + i%(n-1)) % n
				busy := make([]cand, n)
				for j := range busy {
					busy[j] = cand{id: ids[j], weight: 1, rate: 10_000, base: 0.02, alone: tc.alone[j], inFlight: 1}
				}
				busy[free].inFlight = 0
				estimate(busy, in)
				want := ring
				if tc.byLoad {
					want = free
				}
				if got, _ := pickCost(chunks, busy, auto, place); got != want {
					t.Fatalf("prompt %d: auto picked %d, want %d (ring's %d, idle %d)", i, got, want, ring, free)
				}
			}
		})
	}
}

// chatKey is the key of a chat request of model "m" with msgs ({"role", "content"} each).
func chatKey(t testing.TB, msgs ...map[string]string) *key.Key {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	k := &key.Key{}
	key.NewBuilder(0).Build([]byte("/v1/chat/completions"), body, k)
	return k
}

// TestShortFirstTurnFollowUp: a first turn shorter than the head chunks (16 tokens) is placed
// by load, yet leaves its first chunk where it went, and its follow-up, where near-ties go by
// load and spread (the default for a replica alone, and for peered ones), finds that replica
// although it holds only that chunk; under the ring the first chunk alone counts as none
// (key.HeadChunks), so such follow-ups are placed by their own first 16 tokens, and cold
// prompts that share only their framing spread.
func TestShortFirstTurnFollowUp(t *testing.T) {
	build := func(msgs ...string) *key.Key {
		var ms []map[string]string
		for i, m := range msgs {
			ms = append(ms, map[string]string{"role": [2]string{"user", "assistant"}[i%2], "content": m})
		}
		return chatKey(t, ms...)
	}
	answer := strings.Repeat("The sky scatters blue light more than red light. ", 20)
	for _, tb := range []TieBreak{TieBreakLoad, TieBreakRing} {
		bs := prefixBackends(t, 4)
		p := NewPrefix(PrefixOptions{TieBreak: tb}, nil)
		p.SetBackends(bs)
		placed := map[*backend.Backend]int{}
		followed := 0
		for i := range 16 {
			// Questions that differ in their first bytes (7 of the first chunk's 16 are the
			// role's framing): the first chunk of "Why is the sky blue?" asked 16 times would
			// soon be held everywhere and decide nothing.
			q := fmt.Sprintf("%d. Why is the sky blue?", i)
			first := build(q)
			if len(first.Chunks) != 1 {
				t.Fatalf("first turn %q: %d chunks, want 1 (shorter than the head chunks)", q, len(first.Chunks))
			}
			d := p.Pick(first, bs)
			if d.Reason != ReasonLeastLoad {
				t.Fatalf("%v: first turn %q routed %s, want least-load", tb, q, d.Reason)
			}
			placed[d.Backend]++
			p.Learn(first, d.Backend, 0)
			next := build(q, fmt.Sprint(i, answer), "And at sunset?")
			f := p.Pick(next, bs)
			if f.Backend == d.Backend {
				followed++
			}
			if tb == TieBreakLoad && (f.Backend != d.Backend || f.Reason != ReasonMatch || f.MatchedChunks != 1) {
				t.Errorf("%v: follow-up of %q went to %s (%s, %d chunks), its first turn to %s", tb, q, f.Backend.Name, f.Reason, f.MatchedChunks, d.Backend.Name)
			}
			if tb == TieBreakRing && f.Reason != ReasonCold {
				t.Errorf("%v: follow-up of %q routed %s, want cold (the first chunk alone counts as none)", tb, q, f.Reason)
			}
			p.Learn(next, f.Backend, f.MatchedChunks)
		}
		if len(placed) != 4 {
			t.Errorf("%v: 16 short first turns on %d of 4 replicas, want all four", tb, len(placed))
		}
		// Under the ring, follow-ups go by their own 16 tokens: about a quarter by chance.
		if tb == TieBreakRing && followed > 12 {
			t.Errorf("%v: %d of 16 follow-ups went where their first turn did: the first chunk alone decided", tb, followed)
		}
	}
}

// Conversations whose long first turns share only an opening of a few tokens ("You are a
// helpful assistant", then a system prompt of their own) spread over the replicas: the first
// chunk alone is framing, not a conversation's history, unless the prompt's own first turn
// was that short (TestShortFirstTurnFollowUp): the replicas that learned the opening must
// not take every such conversation until they pass their share, and each follow-up must
// still find its own first turn.
func TestSharedOpeningSpreads(t *testing.T) {
	build := func(msgs ...map[string]string) *key.Key { return chatKey(t, msgs...) }
	msg := func(role, content string) map[string]string {
		return map[string]string{"role": role, "content": content}
	}
	rnd := rand.New(rand.NewPCG(7, 7))
	words := strings.Fields("alpha beta gamma delta river stone cloud forest light shadow paper glass iron copper")
	prose := func(n int) string {
		w := make([]string, n)
		for i := range w {
			w[i] = words[rnd.IntN(len(words))]
		}
		return strings.Join(w, " ")
	}
	// Alone, replicas rank by their recent share of the routed work: 4 each but for one either way.
	// Under TieBreakLoad unpeered, by in-flight requests, all 0 here between requests: the
	// ring decides among the cold, 2/4/6 for these 12 first turns.
	for _, tt := range []struct {
		name   string
		tie    TieBreak
		alone  bool
		lo, hi int
	}{{"load", TieBreakLoad, false, 2, 6}, {"auto, alone", TieBreakAuto, true, 3, 5}} {
		t.Run(tt.name, func(t *testing.T) {
			bs := prefixBackends(t, 3)
			if tt.alone {
				for _, b := range bs {
					b.SetOtherSenders(backend.SendersAlone)
				}
			}
			p := NewPrefix(PrefixOptions{TieBreak: tt.tie}, nil)
			p.SetBackends(bs)
			// A burst of short questions first, their follow-ups after.
			for _, topic := range []string{"Rust", "Go", "tides", "bread", "jazz", "chess"} {
				q := msg("user", "What is "+topic+"?")
				d := p.Pick(build(q), bs)
				p.Learn(build(q), d.Backend, 0)
				next := build(q, msg("assistant", prose(300)), msg("user", "Tell me more."))
				f := p.Pick(next, bs)
				p.Learn(next, f.Backend, f.MatchedChunks)
			}
			placed := map[*backend.Backend]int{}
			for i := range 12 {
				first := []map[string]string{msg("system", "You are a helpful assistant "+prose(500)), msg("user", fmt.Sprintf("Question %d: summarize.", i))}
				k := build(first...)
				if k.ShortFirstTurn {
					t.Fatal("a 500-word system prompt read as a short first turn")
				}
				d := p.Pick(k, bs)
				placed[d.Backend]++
				p.Learn(k, d.Backend, d.MatchedChunks)
				next := build(append(first, msg("assistant", prose(100)), msg("user", "Tell me more."))...)
				if f := p.Pick(next, bs); f.Backend != d.Backend || f.Reason != ReasonMatch {
					t.Errorf("conversation %d: follow-up went to %s (%s), its first turn to %s", i, f.Backend.Name, f.Reason, d.Backend.Name)
				}
				p.Learn(next, d.Backend, 0)
			}
			for _, b := range bs {
				if placed[b] < tt.lo || placed[b] > tt.hi {
					t.Errorf("12 conversations opening alike placed %d on %s, want %d–%d on each of 3 replicas", placed[b], b.Name, tt.lo, tt.hi)
				}
			}
		})
	}
}

// TestRecentShareWeighsWork: a prefixlb replica alone ranks near-ties for a new prefix by the
// prefill work it routed to each lately (Prefix.RoutedWork), not by its count of requests:
// after one ~4000-token cold prompt on one of two idle backends, the next eight 128-token cold
// prompts all go to the other (counting requests, they alternate from the second on). The
// work a decision counts is the prompt's after what the backend held: a follow-up that
// finds its history counts only its new chunks.
func TestRecentShareWeighsWork(t *testing.T) {
	bs := prefixBackends(t, 2)
	for _, b := range bs {
		b.SetOtherSenders(backend.SendersAlone)
	}
	p := NewPrefix(PrefixOptions{TieBreak: TieBreakAuto}, nil)
	p.SetBackends(bs)
	long := routedKey(chunkChain(nil).extend("long document", 64))
	long.PromptTokens = key.PrefixTokens(64, key.DefaultChunkTokens) // the head chunks are shorter
	held := func(n int) int64 { return int64(key.PrefixTokens(n, key.DefaultChunkTokens)) }
	d := p.Pick(long, bs)
	p.Learn(long, d.Backend, d.MatchedChunks)
	for i := range 8 {
		k := routedKey(chunkChain(nil).extend(fmt.Sprint("question ", i), 2))
		got := p.Pick(k, bs)
		if got.Backend == d.Backend {
			t.Fatalf("short prompt %d went to %s, which took the %d-token prompt; want the other (recent work %v / %v)",
				i, got.Backend.Name, long.PromptTokens, p.RecentWork(bs[0]), p.RecentWork(bs[1]))
		}
		p.Learn(k, got.Backend, got.MatchedChunks)
	}
	// A follow-up that finds its history on the backend adds the work after that history
	// (one tick of decay on what the backend had: it took the decision before too).
	first := chunkChain(nil).extend("conversation", 32)
	k1 := routedKey(first)
	d1 := p.Pick(k1, bs)
	p.Learn(k1, d1.Backend, d1.MatchedChunks)
	before := p.RecentWork(d1.Backend)
	k2 := routedKey(first.extend("follow-up", 8))
	d2 := p.Pick(k2, bs)
	if d2.Backend != d1.Backend || d2.MatchedChunks != 32 {
		t.Fatalf("follow-up went to %s holding %d chunks, want %s holding 32", d2.Backend.Name, d2.MatchedChunks, d1.Backend.Name)
	}
	w := p.RoutedWork(k2, 32)
	if w >= p.RoutedWork(k2, 0) {
		t.Fatalf("follow-up's work %d not below its cold work %d", w, p.RoutedWork(k2, 0))
	}
	if got, want := p.RecentWork(d1.Backend), before*math.Exp2(-1/float64(RecentHalfLife))+float64(w); math.Abs(got-want) > 1e-6 {
		t.Fatalf("recent work after the follow-up %.3f, want %.3f (its work after the held history, %d)", got, want, w)
	}
	tests := []struct {
		name    string
		k       *key.Key
		matched int
		want    int64
	}{
		{"cold", long, 0, PrefillWork(held(64), 0)},
		{"held but the last chunk", long, 63, PrefillWork(held(64), held(63))},
		{"held whole", long, 64, 1},
		{"not parsed: the mean routed", &key.Key{}, 0, int64(math.Round(p.meanWork.Mean()))},
	}
	for _, tt := range tests {
		if got := p.RoutedWork(tt.k, tt.matched); got != tt.want {
			t.Errorf("%s: RoutedWork = %d, want %d", tt.name, got, tt.want)
		}
	}
}
