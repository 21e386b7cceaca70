package router

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/hashring"
	"github.com/prefixlb/prefixlb/router/key"
)

// stepClock is an injected clock that moves only when told.
type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { return c.t }

func prefixBackends(t testing.TB, n int) []*backend.Backend {
	t.Helper()
	bs := make([]*backend.Backend, n)
	for i := range bs {
		b, err := backend.New(fmt.Sprintf("http://10.0.0.%d:8000", i+1), 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
	}
	return bs
}

func newTestPrefix(t testing.TB, bs []*backend.Backend) (*Prefix, *stepClock) {
	t.Helper()
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	p := NewPrefix(PrefixOptions{}, clk.now)
	p.SetBackends(bs)
	return p, clk
}

// chunkChain is a chain of chunk hashes built like the real key: each chunk's hash covers the
// previous hash, so prompts that extend one another share their leading chunks.
type chunkChain []uint64

// extend returns a new chain: p followed by n chunks of text named by label.
func (p chunkChain) extend(label string, n int) chunkChain {
	out := slices.Clone(p)
	var buf []byte
	for i := range n {
		var prev uint64
		if len(out) > 0 {
			prev = out[len(out)-1]
		}
		buf = binary.LittleEndian.AppendUint64(buf[:0], prev)
		buf = fmt.Appendf(buf, "%s/%d", label, i)
		h := xxhash.Sum64(buf) &^ 1 // marked as the key marks it: fine, then coarse (key.IsCoarse)
		if len(out) >= key.FineChunks {
			h |= 1
		}
		out = append(out, h)
	}
	return out
}

func routedKey(p chunkChain) *key.Key {
	return &key.Key{Routed: true, OK: true, Chunks: p, PromptTokens: 64 * len(p)}
}

// inflight holds leases in flight, as the proxy would between dispatch and the end of the
// response.
type inflight []*backend.Lease

func (rs *inflight) begin(b *backend.Backend, tokens int) {
	l := new(backend.Lease)
	l.Begin(b, int64(tokens), 0, false)
	*rs = append(*rs, l)
}

func (rs *inflight) releaseAll() {
	for _, l := range *rs {
		l.Release()
	}
	*rs = (*rs)[:0]
}

// releaseOldest ends the oldest request.
func (rs *inflight) releaseOldest() {
	(*rs)[0].Release()
	*rs = (*rs)[1:]
}

// capNow is the hard cap over candidates before the next request: no pick goes past it.
func capNow(p *Prefix, cs []*backend.Backend) int64 {
	var total int64
	for _, b := range cs {
		total += b.InFlight()
	}
	return loadCap(total, 1, len(cs), p.sel.hardFactor, p.sel.margin)
}

// pickAndLearn picks, checks the hard cap, learns and begins the request, as the proxy does.
func pickAndLearn(t *testing.T, p *Prefix, k *key.Key, cs []*backend.Backend, rs *inflight) Decision {
	t.Helper()
	limit := capNow(p, cs)
	d := p.Pick(k, cs)
	if d.Backend == nil {
		t.Fatal("no backend picked")
	}
	if in := d.Backend.InFlight(); in >= limit {
		t.Fatalf("picked %s with %d in flight, at or over the hard cap %d", d.Backend.Name, in, limit)
	}
	p.Learn(k, d.Backend, d.MatchedChunks)
	rs.begin(d.Backend, int(d.PrefillTokens))
	return d
}

func TestLoadCap(t *testing.T) {
	tests := []struct {
		total   int64
		w, wsum int
		c       float64
		margin  int64
		want    int64
	}{
		{0, 1, 4, 1.25, 2, 3},                    // ceil(1.25/4)=1, +2
		{3, 1, 4, 1.25, 2, 4},                    // ceil(5/4)=2
		{99, 1, 4, 1.25, 2, 34},                  // ceil(125/4)=32
		{99, 2, 5, 1.25, 0, 50},                  // a weight-2 backend of 5 units
		{7, 1, 8, 1.0, 0, 1},                     // c=1: exactly the average
		{1000, 1, 3, 1.25, 2, 420},               // ceil(1251.25/3)=418
		{5, 1, 4, math.Inf(1), 2, math.MaxInt64}, // no cap, not MinInt64
		{5, 1, 4, 1e30, 2, math.MaxInt64},
	}
	for _, tt := range tests {
		if g := loadCap(tt.total, tt.w, tt.wsum, tt.c, tt.margin); g != tt.want {
			t.Errorf("loadCap(%d, %d/%d, c=%v, m=%d) = %d, want %d", tt.total, tt.w, tt.wsum, tt.c, tt.margin, g, tt.want)
		}
	}
}

// The selection on hand-made snapshots: prompt of 10 chunks (528 tokens), learned prefill
// rate 10k tokens/s and base 20 ms unless a case says otherwise.
func TestPickCostSnapshots(t *testing.T) {
	chunks := chunkChain(nil).extend("x", 10)
	prompt := int64(key.PrefixTokens(10, key.DefaultChunkTokens))
	c := func(id uint64, inFlight int64, matched int, queued int64) cand {
		return cand{id: id, inFlight: inFlight, weight: 1, matched: matched, queued: queued, rate: 10_000, base: 0.020}
	}
	with := func(x cand, f func(*cand)) cand { f(&x); return x }
	tests := []struct {
		name     string
		cs       []cand
		meanWork float64
		want     uint64
		reason   Reason
	}{
		{"longest match", []cand{c(1, 0, 2, 0), c(2, 0, 7, 0), c(3, 0, 0, 0)}, 0, 2, ReasonMatch},
		{"match beats a lower request count", []cand{c(1, 0, 2, 0), c(2, 2, 7, 0), c(3, 0, 0, 0)}, 0, 2, ReasonMatch},
		{"a queue costs more than the match saves", []cand{c(1, 0, 2, 0), c(2, 1, 7, 5000), c(3, 0, 0, 0)}, 0, 1, ReasonOverload},
		{"a small queue is worth the match", []cand{c(1, 0, 2, 0), c(2, 1, 7, 200), c(3, 0, 0, 0)}, 0, 2, ReasonMatch},
		// 9 of 10 in flight: over the cap ceil(1.25 × 11 / 3) + 2 = 7, under the hard cap
		// ceil(2.5 × 11 / 3) + 2 = 12.
		{"over the cap, fastest: kept", []cand{c(1, 9, 8, 0), c(2, 1, 4, 0), c(3, 0, 0, 0)}, 0, 1, ReasonMatch},
		{"over the cap, slower than one under it: next best", []cand{c(1, 9, 8, 1500), c(2, 1, 4, 0), c(3, 0, 0, 0)}, 0, 2, ReasonOverload},
		// 30 of 31 in flight: over the hard cap ceil(2.5 × 32 / 3) + 2 = 29.
		{"best over the hard cap: next best", []cand{c(1, 30, 8, 0), c(2, 1, 4, 0), c(3, 0, 0, 0)}, 0, 2, ReasonOverload},
		{"only holder over the hard cap", []cand{c(1, 30, 8, 0), c(2, 1, 0, 0), c(3, 0, 0, 0)}, 0, 3, ReasonOverload},
		{"all at the cap: least estimate", []cand{c(1, 9, 8, 0), c(2, 9, 0, 0), c(3, 9, 0, 0)}, 0, 1, ReasonMatch},
		{"common prefix does not decide: least work", []cand{c(1, 0, 5, 300), c(2, 0, 5, 0), c(3, 0, 5, 100)}, 0, 2, ReasonCold},
		{"a full KV cache discounts the match", []cand{c(1, 0, 2, 0), with(c(2, 0, 7, 200), func(x *cand) { x.kvUsage = 1 }), c(3, 0, 0, 0)}, 0, 1, ReasonOverload},
		{"the same match on a cache with room", []cand{c(1, 0, 2, 0), with(c(2, 0, 7, 200), func(x *cand) { x.kvUsage = 0.5 }), c(3, 0, 0, 0)}, 0, 2, ReasonMatch},
		{"other clients' requests count", []cand{c(1, 0, 2, 0), with(c(2, 0, 7, 0), func(x *cand) { x.foreign = 6 }), c(3, 0, 0, 0)}, 300, 1, ReasonOverload},
		{"a faster replica wins a cold prompt", []cand{c(1, 0, 0, 0), with(c(2, 0, 0, 0), func(x *cand) { x.rate = 40_000 }), c(3, 0, 0, 0)}, 0, 2, ReasonCold},
		{"an unlearned replica takes the fleet's median", []cand{c(1, 0, 0, 50), with(c(2, 0, 0, 0), func(x *cand) { x.rate, x.base = 0, 0 }), c(3, 0, 0, 50)}, 0, 2, ReasonCold},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := slices.Clone(tt.cs)
			estimate(cs, costInput{promptTokens: prompt, chunkTokens: key.DefaultChunkTokens, meanWork: tt.meanWork})
			j, r := pickCost(chunks, cs, testSel(0, false), nil)
			if cs[j].id != tt.want || r != tt.reason {
				t.Errorf("picked %d (%s), want %d (%s); estimates %v", cs[j].id, r, tt.want, tt.reason, ests(cs))
			}
		})
	}
}

// testSel is the default caps (1.25, hard 2.5, margin 2) with a tie margin and tie-break.
func testSel(tieMargin float64, loadFirst bool) selection {
	return selection{loadFactor: DefaultLoadFactor, hardFactor: DefaultHardLoadFactor, margin: DefaultLoadMargin, tieMargin: tieMargin, loadFirst: loadFirst}
}

func ests(cs []cand) []string {
	var out []string
	for _, c := range cs {
		out = append(out, fmt.Sprintf("%d:%.1fms", c.id, c.est*1000))
	}
	return out
}

// TestPrefillWork: n uncached tokens after h cached ones cost n × (1 + (h + n/2) ÷ 32768),
// rounded, at least 1.
func TestPrefillWork(t *testing.T) {
	for _, tc := range []struct{ prompt, held, want int64 }{
		{592, 0, 597},           // 592 × (1 + 296/32768) = 597.35
		{592, 400, 195},         // 192 × (1 + 496/32768) = 194.9
		{120_000, 0, 339_727},   // 120k × (1 + 60k/32768) = 339,726.6: 2.8× its tokens
		{20_000, 17_000, 4_694}, // 3k × (1 + 18.5k/32768) = 4,693.7
		{10, 10, 1},             // fully held: one token
		{10, 20, 1},             // held beyond the prompt: one token
		{0, 0, 1},               // nothing: one token
		{32_768, 0, 49_152},     // exactly 1.5×
		{1, -5, 1},              // a negative held is none
	} {
		if got := PrefillWork(tc.prompt, tc.held); got != tc.want {
			t.Errorf("PrefillWork(%d, %d) = %d, want %d", tc.prompt, tc.held, got, tc.want)
		}
	}
}

// TestEstimate: the estimate is base + work ÷ rate, with the documented defaults and
// discounts; work is the queued work plus this prompt's (TestPrefillWork's formula).
func TestEstimate(t *testing.T) {
	prompt := int64(key.PrefixTokens(10, key.DefaultChunkTokens)) // 528
	held7 := float64(key.PrefixTokens(7, key.DefaultChunkTokens)) // 336
	work := func(held float64) float64 {                          // the prompt's tokens after held
		n := float64(prompt) - held
		return math.Round(n * (1 + (held+n/2)/32768))
	}
	for _, tc := range []struct {
		name  string
		c     cand
		mean  float64
		want  float64 // seconds
		fleet [2]float64
	}{
		{"cold", cand{rate: 10_000, base: 0.02}, 0, 0.02 + work(0)/10_000, [2]float64{}},
		{"held and queued", cand{rate: 10_000, base: 0.02, matched: 7, queued: 1000}, 0, 0.02 + (1000+work(held7))/10_000, [2]float64{}},
		{"foreign requests at the mean work, half waiting", cand{rate: 10_000, base: 0.02, foreign: 2}, 250, 0.02 + (0.5*500+work(0))/10_000, [2]float64{}},
		{"foreign requests waiting as this proxy's do", cand{rate: 10_000, base: 0.02, foreign: 2, own: 4, pending: 1}, 250, 0.02 + (0.25*500+work(0))/10_000, [2]float64{}},
		{"held at 95% usage counts 75%", cand{rate: 10_000, base: 0.02, matched: 7, kvUsage: 0.95}, 0, 0.02 + work(0.75*held7)/10_000, [2]float64{}},
		{"held at 100% usage counts half", cand{rate: 10_000, base: 0.02, matched: 7, kvUsage: 1}, 0, 0.02 + work(0.5*held7)/10_000, [2]float64{}},
		{"nothing learned: the defaults", cand{}, 0, backend.DefaultPrefillBase.Seconds() + work(0)/backend.DefaultPrefillRate, [2]float64{}},
		{"a fully held prompt still computes one token", cand{rate: 10_000, base: 0.02, matched: 10}, 0, 0.02 + 1.0/10_000, [2]float64{}},
		{"nothing learned here: the pooled fleet model", cand{queued: 3000}, 0, 0.005 + (3000+work(0))/150_000, [2]float64{150_000, 0.005}},
		{"learned here: the fleet model does not count", cand{rate: 10_000, base: 0.02}, 0, 0.02 + work(0)/10_000, [2]float64{150_000, 0.005}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := []cand{tc.c}
			cs[0].fleetRate, cs[0].fleetBase = tc.fleet[0], tc.fleet[1]
			estimate(cs, costInput{promptTokens: prompt, chunkTokens: key.DefaultChunkTokens, meanWork: tc.mean})
			if d := cs[0].est - tc.want; d > 1e-12 || d < -1e-12 {
				t.Fatalf("estimate %.6f s, want %.6f s", cs[0].est, tc.want)
			}
		})
	}
}

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
