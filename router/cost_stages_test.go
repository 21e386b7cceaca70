package router

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/prefixlb/prefixlb/hashring"
	"github.com/prefixlb/prefixlb/router/key"
)

// Each stage of pickCost on hand-made candidates. The replay test (replay_test.go) guards the
// stages together against recorded decisions; these say what each one is for.

// mask is a per-candidate predicate written as a string, 'x' for true: "x.x" is {true,
// false, true}.
func mask(s string) []bool {
	out := make([]bool, len(s))
	for i := range s {
		out[i] = s[i] == 'x'
	}
	return out
}

// unmask is mask's inverse, for messages.
func unmask(bs []bool) string {
	out := make([]byte, len(bs))
	for i, b := range bs {
		out[i] = ".x"[map[bool]int{false: 0, true: 1}[b]]
	}
	return string(out)
}

// stageCands are n candidates of weight 1 (IDs 100, 101, ...) with the given estimates.
func stageCands(est ...float64) []cand {
	cs := make([]cand, len(est))
	for i, e := range est {
		cs[i] = cand{id: uint64(100 + i), weight: 1, est: e}
	}
	return cs
}

func TestSelectionRule(t *testing.T) {
	for _, tt := range []struct {
		name  string
		sel   selection
		alone string // which candidates are alone
		want  rule
	}{
		{"ring", selection{spread: true}, "xx", rule{byRecent: true}},
		{"ring, short first turn: only where near-ties go by load", selection{spread: true, shortFirstTurn: true}, "xx", rule{byRecent: true}},
		{"load, no spread", selection{loadFirst: true}, "..", rule{byLoad: true}},
		{"load, spread: in-flight requests", selection{loadFirst: true, spread: true}, "..", rule{byLoad: true, spread: true}},
		{"load, spread, the fleet's routes counted: recent work", selection{loadFirst: true, spread: true, fleetRecent: true}, "..", rule{byLoad: true, byRecent: true, spread: true}},
		{"load, spread, short first turn", selection{loadFirst: true, spread: true, shortFirstTurn: true}, "..", rule{byLoad: true, spread: true, firstChunk: true}},
		{"auto, every candidate alone", selection{auto: true, spread: true}, "xx", rule{byLoad: true, byRecent: true, spread: true}},
		{"auto, one candidate not alone: the ring", selection{auto: true, spread: true, shortFirstTurn: true}, "x.", rule{byRecent: true}},
		{"auto alone, no spread", selection{auto: true, shortFirstTurn: true}, "xx", rule{byLoad: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs := stageCands(1, 1)
			for i, a := range mask(tt.alone) {
				cs[i].alone = a
			}
			if got := tt.sel.rule(cs); got != tt.want {
				t.Errorf("rule %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestUnderCaps(t *testing.T) {
	for _, tt := range []struct {
		name       string
		soft, hard float64 // load factors
		margin     int64
		inFlight   []int64
		weight     []int // nil: all 1
		est        []float64
		want       string
	}{
		// 3 candidates, 4 in flight: cap ⌈1.25 × 5 / 3⌉ = 3, hard cap at 2: ⌈3.33⌉ = 4, at 3: 5.
		{"all under the cap", 1.25, 2, 0, []int64{1, 1, 1}, nil, []float64{1, 2, 3}, "xxx"},
		{"at the cap: out", 1.25, 2, 0, []int64{4, 0, 0}, nil, []float64{1, 2, 2}, ".xx"},
		{"over the cap, under the hard cap and faster than all under the cap: in", 1.25, 3, 0, []int64{4, 0, 0}, nil, []float64{1, 2, 2}, "xxx"},
		{"under the hard cap, as fast as the fastest under the cap: out", 1.25, 3, 0, []int64{4, 0, 0}, nil, []float64{2, 2, 3}, ".xx"},
		{"at the hard cap, faster: out", 1.25, 2, 0, []int64{4, 0, 0}, nil, []float64{0.1, 2, 3}, ".xx"},
		{"the margin lifts the cap", 1.25, 1.25, 2, []int64{4, 0, 0}, nil, []float64{1, 2, 2}, "xxx"},
		// A cap below the fair share (factor 0.5): ⌈0.5 × 5 / 2⌉ = 2, every candidate at it.
		{"all at the cap: all in", 0.5, 0.5, 0, []int64{2, 2}, nil, []float64{1, 2}, "xx"},
		// 6 in flight over weights 2 and 1: caps ⌈1.25 × 7 × 2/3⌉ = 6 and ⌈1.25 × 7/3⌉ = 3.
		{"the cap per weight", 1.25, 1.25, 0, []int64{3, 3}, []int{2, 1}, []float64{1, 1}, "x."},
		// Weight 0 counts as 1: caps ⌈1.25 × 7/2⌉ = 5 each.
		{"weight 0 counts as 1", 1.25, 1.25, 0, []int64{3, 3}, []int{0, 1}, []float64{1, 1}, "xx"},
		{"no cap (infinite factor)", math.Inf(1), math.Inf(1), 0, []int64{40, 0}, nil, []float64{1, 1}, "xx"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs := stageCands(tt.est...)
			for i := range cs {
				cs[i].inFlight = tt.inFlight[i]
				if tt.weight != nil {
					cs[i].weight = tt.weight[i]
				}
			}
			sel := selection{loadFactor: tt.soft, hardFactor: tt.hard, margin: tt.margin}
			if got := unmask(underCaps(cs, sel, nil)); got != tt.want {
				t.Errorf("ok %s, want %s", got, tt.want)
			}
			for i := range cs {
				if cs[i].weight < 1 {
					t.Errorf("candidate %d: weight %d after the caps, want ≥ 1", i, cs[i].weight)
				}
			}
		})
	}
}

func TestLeastEstimate(t *testing.T) {
	for _, tt := range []struct {
		name     string
		est      []float64
		inFlight []int64
		queued   []int64
		weight   []int
		ok       string
		want     int
	}{
		{"the least estimate", []float64{2, 1, 3}, nil, nil, nil, "xxx", 1},
		{"only among those the caps left", []float64{2, 1, 3}, nil, nil, nil, "x.x", 0},
		{"none left", []float64{2, 1}, nil, nil, nil, "..", -1},
		{"exact tie: fewer in flight", []float64{1, 1}, []int64{2, 1}, nil, nil, "xx", 1},
		{"exact tie: fewer in flight per weight", []float64{1, 1}, []int64{2, 1}, nil, []int{3, 1}, "xx", 0},
		{"exact tie, equal load: less queued prefill", []float64{1, 1}, []int64{1, 1}, []int64{500, 100}, nil, "xx", 1},
		{"no tie: a faster candidate with more in flight", []float64{1, 0.9}, []int64{0, 5}, nil, nil, "xx", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs := stageCands(tt.est...)
			for i := range cs {
				if tt.inFlight != nil {
					cs[i].inFlight = tt.inFlight[i]
				}
				if tt.queued != nil {
					cs[i].queued = tt.queued[i]
				}
				if tt.weight != nil {
					cs[i].weight = tt.weight[i]
				}
			}
			if got := leastEstimate(cs, mask(tt.ok), 7); got != tt.want {
				t.Errorf("chose %d, want %d", got, tt.want)
			}
		})
	}
	// Exact ties in every other respect go by the salt, not by list order.
	cs := stageCands(1, 1, 1, 2)
	rev := slices.Clone(cs)
	slices.Reverse(rev)
	seen := map[uint64]bool{}
	for salt := range uint64(40) {
		a, b := cs[leastEstimate(cs, mask("xxxx"), salt)].id, rev[leastEstimate(rev, mask("xxxx"), salt)].id
		if a != b {
			t.Fatalf("salt %d: chose %d in one order, %d in the other", salt, a, b)
		}
		seen[a] = true
	}
	if len(seen) != 3 {
		t.Errorf("exact ties went to %d distinct candidates over 40 salts, want all 3", len(seen))
	}
}

func TestTieSalt(t *testing.T) {
	chunks := []uint64{11, 22, 33}
	for _, tt := range []struct {
		n    int
		want uint64
	}{{0, 0}, {1, 11}, {2, 22}, {3, 22}} {
		if got := tieSalt(chunks[:tt.n]); got != tt.want {
			t.Errorf("%d chunks: salt %d, want %d (the last head chunk)", tt.n, got, tt.want)
		}
	}
}

func TestNearTies(t *testing.T) {
	for _, tt := range []struct {
		name   string
		est    []float64
		ok     string
		best   int
		margin float64
		want   string
	}{
		{"within half of the least, the limit included", []float64{1, 1.5, 1.6, 0.9}, "xxx.", 0, 0.5, "xx.."},
		{"margin 0: the least alone", []float64{1, 1.5, 1.6, 0.9}, "xxx.", 0, 0, "x..."},
		{"margin 0: exact ties", []float64{1, 1, 2}, "xxx", 0, 0, "xx."},
		{"a negative margin counts as 0", []float64{1, 1.01, 2}, "xxx", 0, -1, "x.."},
		{"only candidates the caps left", []float64{1, 1.5, 1.6, 0.9}, "xxx.", 0, 1, "xxx."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := unmask(nearTies(stageCands(tt.est...), mask(tt.ok), tt.best, tt.margin, nil)); got != tt.want {
				t.Errorf("near-ties %s, want %s", got, tt.want)
			}
		})
	}
}

func TestEffectiveMatches(t *testing.T) {
	spread := rule{byLoad: true, spread: true}
	// A 16,000-token prompt's work after each match: the holder's 3 chunks spare 2,000
	// tokens (12.5%, thin), 4,000 (25%, not thin) in the "spares a quarter" case.
	thinWork := []int64{14_000, 16_000, 16_000, 16_000}
	for _, tt := range []struct {
		name     string
		matched  []int
		work     []int64 // nil: all 16,000
		inFlight []int64 // nil: all 1
		recent   []float64
		weight   []int
		tie      string
		r        rule
		want     []int
	}{
		{"the first chunk alone is none", []int{1, 0, 5, 2}, nil, nil, nil, nil, "xxxx", rule{}, []int{0, 0, 5, 2}},
		{"the first chunk alone counts after a short first turn", []int{1, 0, 5, 2}, nil, nil, nil, nil, "xxxx", rule{byLoad: true, spread: true, firstChunk: true}, []int{1, 0, 5, 2}},
		// Mean in-flight 5/4; the holder's 2 is above 1.3 × that.
		{"thin on a holder above its share: the near-ties' least", []int{3, 0, 0, 0}, thinWork, []int64{2, 1, 1, 1}, nil, nil, "xxxx", spread, []int{0, 0, 0, 0}},
		{"thin on a holder at its share: kept", []int{3, 0, 0, 0}, thinWork, nil, nil, nil, "xxxx", spread, []int{3, 0, 0, 0}},
		{"sparing a quarter of the work: kept", []int{3, 0, 0, 0}, []int64{12_000, 16_000, 16_000, 16_000}, []int64{2, 1, 1, 1}, nil, nil, "xxxx", spread, []int{3, 0, 0, 0}},
		{"thin without spread: kept", []int{3, 0, 0, 0}, thinWork, []int64{2, 1, 1, 1}, nil, nil, "xxxx", rule{byLoad: true}, []int{3, 0, 0, 0}},
		{"thin holder outside the near-ties: kept", []int{3, 0, 0, 0}, thinWork, []int64{2, 1, 1, 1}, nil, nil, ".xxx", spread, []int{3, 0, 0, 0}},
		// The least and the load are the near-ties' (candidates 0-2): least 2, mean load 4/3.
		{"the least among the near-ties, not a slower candidate's", []int{3, 2, 2, 0}, []int64{14_000, 15_000, 15_000, 16_000}, []int64{2, 1, 1, 0}, nil, nil, "xxx.", spread, []int{2, 2, 2, 0}},
		{"thin, by recent routed work", []int{3, 0, 0, 0}, thinWork, nil, []float64{3000, 1000, 1000, 1000}, nil, "xxxx", rule{byLoad: true, byRecent: true, spread: true}, []int{0, 0, 0, 0}},
		{"recent work at its share: kept, whatever is in flight", []int{3, 0, 0, 0}, thinWork, []int64{2, 1, 1, 1}, []float64{1000, 1000, 1000, 1000}, nil, "xxxx", rule{byLoad: true, byRecent: true, spread: true}, []int{3, 0, 0, 0}},
		// Weight 2 with 2 in flight is at its share (5 in flight over weight 5).
		{"load per weight", []int{3, 0, 0, 0}, thinWork, []int64{2, 1, 1, 1}, nil, []int{2, 1, 1, 1}, "xxxx", spread, []int{3, 0, 0, 0}},
		{"thin against a common first chunk: none", []int{3, 1, 1, 1}, thinWork, []int64{2, 1, 1, 1}, nil, nil, "xxxx", spread, []int{0, 0, 0, 0}},
		{"thin against a common first chunk that counts", []int{3, 1, 1, 1}, thinWork, []int64{2, 1, 1, 1}, nil, nil, "xxxx", rule{byLoad: true, spread: true, firstChunk: true}, []int{1, 1, 1, 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs := stageCands(make([]float64, len(tt.matched))...)
			for i := range cs {
				cs[i].matched, cs[i].work, cs[i].inFlight = tt.matched[i], 16_000, 1
				if tt.work != nil {
					cs[i].work = tt.work[i]
				}
				if tt.inFlight != nil {
					cs[i].inFlight = tt.inFlight[i]
				}
				if tt.recent != nil {
					cs[i].recent = tt.recent[i]
				}
				if tt.weight != nil {
					cs[i].weight = tt.weight[i]
				}
			}
			if got := effectiveMatches(cs, mask(tt.tie), tt.r, nil); !slices.Equal(got, tt.want) {
				t.Errorf("effective matches %v, want %v", got, tt.want)
			}
		})
	}
}

// stageRing is a ring of n backends of weight 1 named as tieBreakSetup names them, with the
// IDs stageCands gives.
func stageRing(n int) (*placement, []hashring.Member) {
	ms := make([]hashring.Member, n)
	ids := make([]uint64, n)
	for i := range n {
		ms[i], ids[i] = hashring.Member{Name: fmt.Sprint("http://b", i), Weight: 1}, uint64(100+i)
	}
	return &placement{ring: hashring.New(ms), ids: ids, members: ms}, ms
}

func TestBreakTie(t *testing.T) {
	const noRing = -1
	for _, tt := range []struct {
		name     string
		est      []float64
		matched  []int
		eff      []int // nil: matched
		inFlight []int64
		recent   []float64
		weight   []int
		tie      string
		best     int
		r        rule
		wantFin  string // the finalists left to the ring
		want     int    // without a ring
		wantKey  int    // with one: the chunk it walks from (noRing: not tried with a ring)
	}{
		{"best holds the most: best", []float64{1, 1.1, 1.2, 2}, []int{3, 3, 0, 0}, nil, nil, nil, nil, "xxx.", 0, rule{}, "xx..", 0, 3},
		{"best does not hold the most: the fastest that does", []float64{1, 1.3, 1.2, 2}, []int{0, 3, 3, 0}, nil, nil, nil, nil, "xxx.", 0, rule{}, ".xx.", 2, 3},
		{"the longest match of a slower candidate outside the near-ties does not count", []float64{1, 1.2, 1.3, 2}, []int{2, 2, 0, 6}, nil, nil, nil, nil, "xxx.", 0, rule{}, "xx..", 0, 2},
		{"load first: the least loaded finalists", []float64{1, 1.1, 1.2, 1.3}, []int{3, 3, 3, 0}, nil, []int64{2, 1, 1, 0}, nil, nil, "xxxx", 0, rule{byLoad: true}, ".xx.", 1, 3},
		{"load first: the choice stays among the least loaded", []float64{1, 1.1, 1.2, 1.3}, []int{3, 3, 3, 0}, nil, []int64{1, 1, 2, 0}, nil, nil, "xxxx", 0, rule{byLoad: true}, "xx..", 0, 3},
		{"load first by recent routed work", []float64{1, 1.1, 1.2, 1.3}, []int{3, 3, 3, 0}, nil, nil, []float64{500, 100, 100, 0}, nil, "xxxx", 0, rule{byLoad: true, byRecent: true}, ".xx.", 1, 3},
		{"load first, per weight", []float64{1, 1.1, 1.2, 1.3}, []int{3, 3, 3, 0}, nil, []int64{2, 1, 1, 0}, nil, []int{2, 1, 1, 1}, "xxxx", 0, rule{byLoad: true}, "xxx.", 0, 3},
		// Candidate 0's 5 chunks were read as 3 (thin, effectiveMatches); it is the heaviest.
		{"the ring key is read before load narrows the finalists", []float64{1, 1.1, 1.2, 1.3}, []int{5, 3, 3, 0}, []int{3, 3, 3, 0}, []int64{2, 1, 1, 0}, nil, nil, "xxxx", 0, rule{byLoad: true}, ".xx.", 1, 5},
		// A thin match set aside (effectiveMatches) still keys the ring past it.
		{"the ring walks from the finalists' longest raw match", []float64{1, 1, 1, 1}, []int{5, 0, 0, 0}, []int{0, 0, 0, 0}, nil, nil, nil, "xxxx", 0, rule{}, "xxxx", 0, 5},
		{"never before the last head chunk", []float64{1, 1, 1, 1}, []int{0, 0, 0, 0}, nil, nil, nil, nil, "xxxx", 0, rule{}, "xxxx", 0, key.HeadChunks - 1},
		{"a fully held prompt: its last chunk", []float64{1, 1, 1, 1}, []int{8, 8, 0, 0}, nil, nil, nil, nil, "xxxx", 0, rule{}, "xx..", 0, 7},
		{"a slower candidate outside the near-ties is not on the ring's list", []float64{1, 1, 1, 9}, []int{0, 0, 0, 0}, nil, nil, nil, nil, "xxx.", 0, rule{}, "xxx.", 0, key.HeadChunks - 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			setup := func() ([]cand, []bool, []int) {
				cs := stageCands(tt.est...)
				for i := range cs {
					cs[i].matched = tt.matched[i]
					if tt.inFlight != nil {
						cs[i].inFlight = tt.inFlight[i]
					}
					if tt.recent != nil {
						cs[i].recent = tt.recent[i]
					}
					if tt.weight != nil {
						cs[i].weight = tt.weight[i]
					}
				}
				eff := tt.eff
				if eff == nil {
					eff = tt.matched
				}
				return cs, mask(tt.tie), eff
			}
			chunks := chunkChain(nil).extend("break tie", 8)
			cs, tie, eff := setup()
			if got := breakTie(chunks, cs, tie, eff, tt.best, tt.r, nil); got != tt.want {
				t.Errorf("without a ring: chose %d, want %d", got, tt.want)
			}
			if got := unmask(tie); got != tt.wantFin {
				t.Errorf("finalists %s, want %s", got, tt.wantFin)
			}
			// With a ring: the finalist that owns the key on a ring of the finalists alone
			// (consistent hashing: the others' points are passed over as if absent).
			place, ms := stageRing(len(tt.est))
			var fin []hashring.Member
			var finIdx []int
			for i, f := range mask(tt.wantFin) {
				if f {
					fin, finIdx = append(fin, ms[i]), append(finIdx, i)
				}
			}
			own := hashring.New(fin)
			seen := map[int]bool{}
			for i := range 32 {
				chunks := chunkChain(nil).extend(fmt.Sprint("break tie ", i), 8)
				cs, tie, eff := setup()
				want := finIdx[own.Lookup(chunks[tt.wantKey], nil)]
				if got := breakTie(chunks, cs, tie, eff, tt.best, tt.r, place); got != want {
					t.Fatalf("prompt %d: the ring chose %d, want %d (the owner of chunk %d among %s)", i, got, want, tt.wantKey, tt.wantFin)
				}
				seen[want] = true
			}
			if len(seen) != len(finIdx) {
				t.Errorf("over 32 prompts the ring chose %v, want each of the finalists %s", seen, tt.wantFin)
			}
		})
	}
}

func TestReasonOf(t *testing.T) {
	for _, tt := range []struct {
		name   string
		eff    []int
		chosen int
		want   Reason
	}{
		{"none holds more than the others: cold", []int{2, 2, 2}, 0, ReasonCold},
		{"none holds anything: cold", []int{0, 0}, 1, ReasonCold},
		{"a single candidate: cold", []int{5}, 0, ReasonCold},
		{"the chosen holds the most: match", []int{3, 0, 3}, 2, ReasonMatch},
		{"another holds more: overload", []int{3, 0, 1}, 2, ReasonOverload},
		{"the chosen holds nothing, another does: overload", []int{3, 0, 1}, 1, ReasonOverload},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := reasonOf(tt.eff, tt.chosen); got != tt.want {
				t.Errorf("reason %s, want %s", got, tt.want)
			}
		})
	}
}

// TestPickCostAllocatesNothing: up to maxStackCandidates candidates, every stage's output
// lives on pickCost's stack (the decision's benchmarks show the same: BenchmarkPickCold).
func TestPickCostAllocatesNothing(t *testing.T) {
	chunks := chunkChain(nil).extend("allocs", 8)
	in := costInput{promptTokens: int64(key.PrefixTokens(8, key.DefaultChunkTokens)), chunkTokens: key.DefaultChunkTokens}
	for _, n := range []int{1, 8, maxStackCandidates} {
		place, _ := stageRing(n)
		cs := make([]cand, n)
		for i := range cs {
			cs[i] = cand{id: uint64(100 + i), weight: 1, rate: 10_000, base: 0.02, matched: i % 3, inFlight: int64(i % 2), alone: true}
		}
		estimate(cs, in)
		sel := testSel(0.5, false)
		sel.auto, sel.spread = true, true
		if a := testing.AllocsPerRun(100, func() { pickCost(chunks, cs, sel, place) }); a != 0 {
			t.Errorf("%d candidates: %.1f allocations per pickCost, want 0", n, a)
		}
	}
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
