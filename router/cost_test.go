package router

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// TestThinMatchAmongNearTies: spreading new prefixes (the default), where near-ties go by load, a match
// that spares under thinMatchShare of the prefill (one shared chunk of a 16-chunk prompt)
// counts as none on a holder loaded above thinMatchLoad × the near-ties' mean, so such
// prompts spread by the ring among the others; on a holder at its share the thin match
// holds (a thread's history, thin against its next branch), as does a match that spares
// half or more on any holder. A match of the first chunk alone (4 tokens: a role and a word,
// which most chats share) counts as none unless the prompt's first turn was that short
// (selection.shortFirstTurn) and near-ties go by load: the ring, or load, spreads those
// prompts over all four. Where near-ties go by the ring alone, the holder keeps every
// match, thin or not, but a match of the first chunk alone.
func TestThinMatchAmongNearTies(t *testing.T) {
	const n = 4
	place, ids, in := tieBreakSetup(n)
	shared := chunkChain(nil).extend("system prompt", 1)
	const (
		held   = iota // the holder gets every prompt
		others        // none, spread over the others
		all           // spread over all four
	)
	tests := []struct {
		name    string
		matched int   // chunks of the 16 the holder (candidate 0) holds
		load    int64 // the holder's in-flight requests; the others have 1
		short   bool  // the prompt's first turn was shorter than the head chunks
		base    int   // chunks every other candidate holds (the first, or none)
		want    int
	}{
		{"first chunk of 16, short first turn, holder above its share: thin, spread", 1, 2, true, 0, others},
		{"first chunk of 16, short first turn, holder at its share: held", 1, 1, true, 0, held},
		{"first chunk of 16, long first turn, holder at its share: none, spread", 1, 1, false, 0, all},
		{"eight of 16, holder above its share: held", 8, 2, false, 0, held},
		{"three of 16 (15% of the tokens), holder above its share: thin", 3, 2, false, 0, others},
		{"three of 16, holder at its share: held", 3, 1, false, 0, held},
		{"six of 16 (34%), holder above its share: held", 6, 2, false, 0, held},
		// The thin holder counts as the others' common match, which is the first chunk alone
		// and so none: it does not outrank them.
		{"three of 16 where all hold the first, holder above its share: thin", 3, 2, false, 1, others},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hits := make([]int, n)
			opening := make([]int, n) // without spread, where the holder holds the first chunk alone
			for i := range 64 {
				chunks := append(chunkChain(nil).extend("prefix", tt.matched), chunkChain(nil).extend(fmt.Sprint("own", i), 16-tt.matched)...)
				if tt.matched == 1 {
					chunks = append(shared[:1:1], chunks[1:]...)
				}
				in.promptTokens = int64(key.PrefixTokens(16, key.DefaultChunkTokens))
				cs := make([]cand, n)
				for j := range cs {
					cs[j] = cand{id: ids[j], weight: 1, rate: 10_000, base: 0.02, inFlight: 1}
				}
				for j := 1; j < n; j++ {
					cs[j].matched = tt.base
				}
				cs[0].matched, cs[0].inFlight = tt.matched, tt.load
				estimate(cs, in)
				spread := testSel(0.5, true)
				spread.spread, spread.shortFirstTurn = true, tt.short
				j, r := pickCost(chunks, cs, spread, place)
				hits[j]++
				// A thin match set aside reads cold: no candidate is over its cap or slower.
				if want := map[bool]Reason{true: ReasonMatch, false: ReasonCold}[tt.want == held]; r != want {
					t.Fatalf("prompt %d: reason %s, want %s", i, r, want)
				}
				noSpread := testSel(0.5, true)
				ring := testSel(0.5, false)
				ring.spread = true
				// auto with one candidate shared: the ring, so the thin match counts too.
				auto := testSel(0.5, false)
				auto.auto, auto.spread = true, true
				// shortFirstTurn matters only where near-ties go by load and spread.
				noSpread.shortFirstTurn, ring.shortFirstTurn, auto.shortFirstTurn = tt.short, tt.short, tt.short
				for k, sel := range []selection{noSpread, ring, auto} {
					for j := range cs {
						cs[j].alone = k == 2 && j != 1
					}
					j, _ := pickCost(chunks, cs, sel, place)
					if tt.matched == 1 {
						if k == 1 {
							opening[j]++
						}
						continue
					}
					if j != 0 {
						t.Fatalf("prompt %d: without spread (selection %d) the holder of %d chunks lost to %d", i, k, tt.matched, j)
					}
				}
			}
			if tt.matched == 1 && slices.Min(opening) < 8 {
				t.Errorf("under the ring, prompts sharing the first chunk alone went %v, want them spread by the ring", opening)
			}
			switch tt.want {
			case held:
				if hits[0] != 64 {
					t.Errorf("holder of %d chunks got %d of 64 prompts, want all (%v)", tt.matched, hits[0], hits)
				}
				return
			case others:
				if hits[0] != 0 {
					t.Errorf("holder of %d chunks above its share got %d of 64 prompts, want none (%v)", tt.matched, hits[0], hits)
				}
			case all:
				if hits[0] < 8 {
					t.Errorf("holder of %d chunks got %d of 64 prompts, want them spread over all four (%v)", tt.matched, hits[0], hits)
				}
			}
			for j := 1; j < n; j++ {
				if hits[j] < 8 {
					t.Errorf("backend %d got %d of 64 prompts, want them spread by the ring (%v)", j, hits[j], hits)
				}
			}
		})
	}
}

// TestTieBreakAutoByRecentShare: spreading new prefixes (the default), a prefixlb replica alone (TieBreakAuto, every candidate
// alone) sends a cold prompt's near-ties to the backend it routed the least prefill work to
// lately, even where that one has a request in flight and another has none (conversations
// between turns have none); TieBreakLoad ranks by in-flight requests only, unless the recent
// share is the fleet's (peered replicas, Prefix.CountPeerRoutes), where it ranks as auto
// alone does, whoever else sends to the backends.
func TestTieBreakAutoByRecentShare(t *testing.T) {
	const n = 4
	place, ids, in := tieBreakSetup(n)
	auto := testSel(0.5, false)
	auto.auto, auto.spread = true, true
	load := testSel(0.5, true)
	load.spread = true
	fleet := load
	fleet.fleetRecent = true
	for i := range 32 {
		chunks := chunkChain(nil).extend(fmt.Sprint("cold", i), 4)
		quiet := i % n      // least work routed lately, one in flight now
		idle := (i + 1) % n // none in flight, many lately
		cs := make([]cand, n)
		for j := range cs {
			cs[j] = cand{id: ids[j], weight: 1, rate: 10_000, base: 0.02, alone: true, recent: 30, inFlight: 1}
		}
		cs[quiet].recent = 5
		cs[idle].inFlight = 0
		estimate(cs, in)
		if got, _ := pickCost(chunks, cs, auto, place); got != quiet {
			t.Fatalf("prompt %d: auto picked %d, want %d (fewest routed lately)", i, got, quiet)
		}
		if got, _ := pickCost(chunks, cs, load, place); got != idle {
			t.Fatalf("prompt %d: load picked %d, want %d (none in flight)", i, got, idle)
		}
		for j := range cs {
			cs[j].alone = false // peers send there too
		}
		if got, _ := pickCost(chunks, cs, fleet, place); got != quiet {
			t.Fatalf("prompt %d: load with the fleet's share picked %d, want %d (fewest routed lately)", i, got, quiet)
		}
	}
}

// TestPickSpreadsConversationsPeered: two peered replicas (TieBreakLoad, CountPeerRoutes;
// each told of the other's decisions and learned prompts, as package peering does) place
// 8 cold conversations whose first turns reach them in runs one on each of 4 backends and
// then 2 on each,
// with nothing in flight between turns and no backend alone, and each conversation's later
// turns follow its first whichever replica routes them. Without the peers' decisions
// counted (each replica's own share only, or in-flight counts, all 0), a replica does not see
// where the other's pair went.
func TestPickSpreadsConversationsPeered(t *testing.T) {
	for _, counted := range []bool{true, false} {
		t.Run(fmt.Sprintf("counted=%v", counted), func(t *testing.T) {
			var ps [2]*Prefix
			var bss [2][]*backend.Backend
			for r := range ps {
				bss[r] = prefixBackends(t, 4)
				for _, b := range bss[r] {
					b.SetOtherSenders(backend.SendersShared)
				}
				ps[r] = NewPrefix(PrefixOptions{TieBreak: TieBreakLoad}, nil)
				ps[r].SetBackends(bss[r])
				ps[r].CountPeerRoutes()
			}
			where := map[int]string{}
			per := map[string]int{}
			even := true
			// First turns: three through replica 0, three through 1, two through 0.
			firstVia := []int{0, 0, 0, 1, 1, 1, 0, 0}
			for turn := range 3 {
				for conv := range 8 {
					r := (firstVia[conv] + turn) % 2 // the replica the request reaches
					k := routedKey(chunkChain(nil).extend(fmt.Sprint("conversation ", conv), 4+4*turn))
					d := ps[r].Pick(k, bss[r])
					ps[r].Learn(k, d.Backend, d.MatchedChunks)
					peer := bss[1-r][slices.IndexFunc(bss[r], func(b *backend.Backend) bool { return b == d.Backend })]
					ps[1-r].Index().Record(k.Chunks, peer, time.Now())
					if counted {
						ps[1-r].NotePeerRouted(peer, ps[r].RoutedWork(k, d.MatchedChunks))
					}
					switch {
					case turn == 0:
						where[conv] = d.Backend.Name
						per[d.Backend.Name]++
						if conv == 3 && len(per) < 4 {
							even = false // the first four did not go one to each backend
						}
					case d.Backend.Name != where[conv]:
						t.Fatalf("turn %d of conversation %d went to %s, its first to %s", turn, conv, d.Backend.Name, where[conv])
					}
				}
			}
			for _, b := range bss[0] {
				even = even && per[b.Name] == 2
			}
			if counted && !even {
				t.Errorf("conversations per backend %v (or the first four not one each), want 2 each: %v", per, where)
			}
			if counted {
				// /debug/route shows the share that ranked the near-ties.
				for _, e := range ps[0].Explain(routedKey(chunkChain(nil).extend("new", 4)), bss[0]) {
					if e.RecentWork <= 0 {
						t.Errorf("Explain shows %s with recent_work_tokens %v, want the fleet's share (> 0)", e.Backend, e.RecentWork)
					}
				}
			}
			if !counted && even {
				t.Errorf("conversations per backend %v with each replica's own decisions only: spread evenly all the same, so this test shows nothing", per)
			}
		})
	}
}

// TestPickSpreadsConversationsAlone: a prefixlb replica alone (TieBreakAuto, every backend
// SendersAlone) places cold conversations, between whose turns nothing is in flight, by the
// prefill work it routed to each backend lately: 8 conversations' first turns on 4 backends land
// 2 on each, and each conversation's later turns follow its first. Candidates not all alone
// read no recent share (the ring breaks their ties).
func TestPickSpreadsConversationsAlone(t *testing.T) {
	bs, p := aloneAutoPrefix(t, 4)
	where := map[int]*backend.Backend{}
	per := map[string]int{}
	for turn := range 3 {
		for conv := range 8 {
			k := routedKey(chunkChain(nil).extend(fmt.Sprint("conversation ", conv), 4+4*turn))
			d := p.Pick(k, bs)
			p.Learn(k, d.Backend, d.MatchedChunks)
			switch {
			case turn == 0:
				where[conv] = d.Backend
				per[d.Backend.Name]++
			case d.Backend != where[conv]:
				t.Fatalf("turn %d of conversation %d went to %s, its first to %s", turn, conv, d.Backend.Name, where[conv].Name)
			}
		}
	}
	for _, b := range bs {
		if per[b.Name] != 2 {
			t.Errorf("%s got %d of 8 conversations, want 2 each: %v", b.Name, per[b.Name], per)
		}
	}
	bs[0].SetOtherSenders(backend.SendersShared)
	cs := p.snapshot(routedKey(chunkChain(nil).extend("x", 4)), bs, nil, nil)
	for _, c := range cs {
		if c.recent != 0 {
			t.Fatalf("recent share read while a backend is shared: %+v", c)
		}
	}
}

// TestDecodesSlowAReplica: the decode term (backend.DecodeWork) makes a replica busy decoding
// long contexts estimate a short prompt's TTFT well above an idle one's, enough to leave the
// near-ties, so that a cold prompt goes to the idle one whatever the ring says; a long prompt
// pays the same decodes over more engine steps, a smaller share of its prefill.
func TestDecodesSlowAReplica(t *testing.T) {
	const n = 2
	place, ids, in := tieBreakSetup(n)
	in.promptTokens = 256
	for i := range 32 {
		chunks := chunkChain(nil).extend(fmt.Sprint("cold ", i), 4)
		cs := make([]cand, n)
		for j := range cs {
			cs[j] = cand{id: ids[j], weight: 1, rate: 10_000, base: 0.02, inFlight: 64}
		}
		cs[0].decodes, cs[0].context = 64, 64*8192 // 64 sequences of 8k tokens decoding
		estimate(cs, in)
		if want := backend.DecodeWork(64, 64*8192, 0, cs[0].work); cs[0].decode != want || cs[1].decode != 0 {
			t.Fatalf("decode work %d and %d, want %d and 0", cs[0].decode, cs[1].decode, want)
		}
		if cs[0].est <= (1+0.5)*cs[1].est {
			t.Fatalf("estimates %v: the decoding replica within the near-tie margin", ests(cs))
		}
		if j, _ := pickCost(chunks, cs, testSel(0.5, false), place); j != 1 {
			t.Fatalf("prompt %d went to the replica decoding 64 long contexts: %v", i, ests(cs))
		}
	}
	long := in
	long.promptTokens = 32_000
	cs := []cand{{id: ids[0], decodes: 64, context: 64 * 8192}}
	estimate(cs, in)
	short := float64(cs[0].decode) / float64(cs[0].work)
	estimate(cs, long)
	if share := float64(cs[0].decode) / float64(cs[0].work); share >= short/4 {
		t.Fatalf("decode share of a 32k-token prefill %.3f, of a 256-token one %.3f", share, short)
	}
}

// TestExplainShowsDecodes: /debug/route's candidates (Prefix.Explain) carry this proxy's
// requests decoding on each backend, their context and the decode work charged for them, and
// the estimate is higher by that work at the backend's rate.
func TestExplainShowsDecodes(t *testing.T) {
	bs := prefixBackends(t, 2)
	p, _ := newTestPrefix(t, bs)
	var l backend.Lease
	l.Begin(bs[0], 100, 6000, true)
	l.FirstByte()
	defer l.Release()
	k := routedKey(chunkChain(nil).extend("question", 4))
	ex := p.Explain(k, bs)
	if len(ex) != 2 {
		t.Fatalf("%d candidates explained", len(ex))
	}
	busy, idle := ex[0], ex[1]
	if busy.DecodingRequests != 1 || busy.DecodingTokens != 6000 || busy.DecodeWork != backend.DecodeWork(1, 6000, 0, 256) {
		t.Fatalf("busy backend explained %+v, want 1 decoding request of 6000 tokens and its decode work", busy)
	}
	if idle.DecodingRequests != 0 || idle.DecodeWork != 0 {
		t.Fatalf("idle backend explained %+v", idle)
	}
	if extra := busy.PredictedTTFTMs - idle.PredictedTTFTMs; extra <= 0 {
		t.Fatalf("estimates %.3f and %.3f ms: the decoding backend not slower", busy.PredictedTTFTMs, idle.PredictedTTFTMs)
	}
}

// TestPreviewCountsNothing: Preview (what /debug/route asks) returns Pick's decision and
// counts it nowhere: asking again and again moves neither the recent share nor the mean
// prefill work nor the rotation of short prompts, so the next Pick decides as before.
func TestPreviewCountsNothing(t *testing.T) {
	bs, p := aloneAutoPrefix(t, 4)
	d := NewDecider(p)
	long := routedKey(chunkChain(nil).extend("preview", 8))
	short := &key.Key{Routed: true, OK: true, PromptTokens: 10}
	for _, k := range []*key.Key{long, short} {
		before := make([]float64, len(bs))
		for i, b := range bs {
			before[i] = p.RecentWork(b)
		}
		mean := p.meanWork.Mean()
		first := d.Preview(k, bs)
		for range 50 {
			if got := d.Preview(k, bs); got.Backend != first.Backend {
				t.Fatalf("Preview moved from %s to %s", first.Backend.Name, got.Backend.Name)
			}
		}
		for i, b := range bs {
			if v := p.RecentWork(b); v != before[i] {
				t.Fatalf("%s's recent count went from %v to %v with Previews only", b.Name, before[i], v)
			}
		}
		if m := p.meanWork.Mean(); m != mean {
			t.Fatalf("mean prefill work went from %v to %v with Previews only", mean, m)
		}
		if got := d.Pick(k, bs); got.Backend != first.Backend || got.Reason != first.Reason {
			t.Fatalf("Pick chose %s (%v), Preview said %s (%v)", got.Backend.Name, got.Reason, first.Backend.Name, first.Reason)
		}
	}
}

// TestFleetModelStandsIn: the prefix policy's backends (one pool: their models unknown) teach
// one pooled model; with 8 answers spread over 4 backends (none has learned its own), the
// estimates use the fleet's measured rate rather than DefaultPrefillRate, 15 times slower
// than these replicas.
func TestFleetModelStandsIn(t *testing.T) {
	bs := prefixBackends(t, 4)
	p, _ := newTestPrefix(t, bs)
	k := routedKey(chunkChain(nil).extend("fleet", 64))
	before := p.Explain(k, bs)
	for i := range backend.MinPrefillSamples {
		bs[i%len(bs)].ObservePrefill(150_000, 1020*time.Millisecond) // 150k tokens/s after the 20 ms base
	}
	after := p.Explain(k, bs)
	for j := range bs {
		if after[j].RateLearned {
			t.Fatalf("%s learned its own rate from %d observations", bs[j].Name, backend.MinPrefillSamples/len(bs))
		}
		// The prompt's work at 150k tokens/s against 10k: a fifteenth, plus the same base.
		base := backend.DefaultPrefillBase.Seconds() * 1000
		if got, want := after[j].PredictedTTFTMs-base, (before[j].PredictedTTFTMs-base)/15; got < 0.9*want || got > 1.1*want {
			t.Fatalf("%s: predicted %.2f ms beyond the base, want ≈ %.2f (the fleet's rate; %.2f at the default)",
				bs[j].Name, got, want, before[j].PredictedTTFTMs-base)
		}
	}
}

// TestStaleScrapeIsNotForeign: beyond this proxy's and its peers' requests a backend counts
// only what its last scrape reported beyond their in-flight count when the scrape was read,
// alone or shared: their requests answered since the scrape are neither foreign work in the
// estimate nor load (peered replicas, judged shared because their peers' requests finish
// there too, counted them as foreign work); other senders' requests in the scrape still are,
// the verdict notwithstanding.
func TestStaleScrapeIsNotForeign(t *testing.T) {
	bs := prefixBackends(t, 4)
	p, _ := newTestPrefix(t, bs)
	// Scraped while this proxy's 3 requests and 2 of a peer's were in flight: alone; alone
	// with 2 requests of a sender the verdict missed; shared (the peer's); shared with 2 of
	// another sender.
	scraped := []int64{3, 5, 5, 7}
	peers := []int64{0, 0, 2, 2}
	for i, b := range bs {
		var ls [3]backend.Lease
		for j := range ls {
			ls[j].Begin(b, 1000, 0, true)
		}
		b.SetPeerLoad(peers[i], 0)
		b.SetScrapedLoad(scraped[i], 0)
		for j := range ls {
			ls[j].Release() // answered since
		}
		b.SetPeerLoad(0, 0) // and the peer's
	}
	bs[0].SetOtherSenders(backend.SendersAlone)
	bs[1].SetOtherSenders(backend.SendersAlone)
	bs[2].SetOtherSenders(backend.SendersShared)
	bs[3].SetOtherSenders(backend.SendersShared)
	for i := range 4 { // a mean prefill work for the foreign requests to be charged at
		p.Pick(routedKey(chunkChain(nil).extend(fmt.Sprint("earlier ", i), 16)), bs)
	}
	k := routedKey(chunkChain(nil).extend("stale", 16))
	ex := p.Explain(k, bs)
	for i, want := range []int64{0, 2, 0, 2} {
		if e := ex[i]; e.ForeignRequests != want || e.InFlight != want {
			t.Errorf("%s (scraped %d): %d foreign requests, load %d; want %d and %d", bs[i].Name, scraped[i], e.ForeignRequests, e.InFlight, want, want)
		}
	}
	if !(ex[0].PredictedTTFTMs < ex[1].PredictedTTFTMs && ex[2].PredictedTTFTMs < ex[3].PredictedTTFTMs) {
		t.Errorf("predicted %.2f, %.2f, %.2f, %.2f ms: want rising with the foreign requests", ex[0].PredictedTTFTMs, ex[1].PredictedTTFTMs, ex[2].PredictedTTFTMs, ex[3].PredictedTTFTMs)
	}
}

// aloneAutoPrefix is n backends, each judged this proxy's alone, behind a prefix policy that
// breaks near-ties by TieBreakAuto.
func aloneAutoPrefix(t *testing.T, n int) ([]*backend.Backend, *Prefix) {
	bs := prefixBackends(t, n)
	for _, b := range bs {
		b.SetOtherSenders(backend.SendersAlone)
	}
	p := NewPrefix(PrefixOptions{TieBreak: TieBreakAuto}, nil)
	p.SetBackends(bs)
	return bs, p
}

// TestFleetModelOrder: an unlearned candidate takes the median of the learned candidates'
// rates of its model pool before its pool's pooled model, and the pooled model before the
// default; a learned replica of another pool (another model's speed) does not count.
func TestFleetModelOrder(t *testing.T) {
	small, large := new(backend.PrefillModel), new(backend.PrefillModel)
	pooled := cand{fleet: small, fleetRate: 150_000, fleetBase: 0.005} // its pool's model has learned, it has not
	prompt := int64(key.PrefixTokens(4, key.DefaultChunkTokens))
	for _, c := range []struct {
		name       string
		cs         []cand
		rate, base float64 // the last candidate's
	}{
		{"one of its pool learned: the median of the learned", []cand{{fleet: small, rate: 10_000, base: 0.02}, pooled}, 10_000, 0.02},
		{"only another pool's learned: its pool's model", []cand{{fleet: large, rate: 10_000, base: 0.02}, pooled}, 150_000, 0.005},
		{"none learned: the pool's model", []cand{pooled, pooled}, 150_000, 0.005},
		{"nothing learned anywhere: the defaults", []cand{{}}, backend.DefaultPrefillRate, backend.DefaultPrefillBase.Seconds()},
	} {
		estimate(c.cs, costInput{promptTokens: prompt, chunkTokens: key.DefaultChunkTokens})
		last := c.cs[len(c.cs)-1]
		if want := c.base + float64(last.work)/c.rate; math.Abs(last.est-want) > 1e-12 {
			t.Errorf("%s: estimate %.6f s, want %.6f s (rate %v, base %v)", c.name, last.est, want, c.rate, c.base)
		}
	}
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
