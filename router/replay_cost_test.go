package router

// The cost model's recorded candidate snapshots (replay_test.go says what the replay is).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/hashring"
	"github.com/prefixlb/prefixlb/router/key"
)

type replaySel struct {
	LoadFactor     float64 `json:"load_factor"`
	HardFactor     float64 `json:"hard_factor"`
	Margin         int64   `json:"margin"`
	TieMargin      float64 `json:"tie_margin"`
	LoadFirst      bool    `json:"load_first,omitempty"`
	Auto           bool    `json:"auto,omitempty"`
	Spread         bool    `json:"spread,omitempty"`
	FleetRecent    bool    `json:"fleet_recent,omitempty"`
	ShortFirstTurn bool    `json:"short_first_turn,omitempty"`
}

type replayCand struct {
	Name      string  `json:"name"`
	InFlight  int64   `json:"in_flight"`
	Weight    int     `json:"weight"`
	Matched   int     `json:"matched"`
	Queued    int64   `json:"queued"`
	Own       int64   `json:"own"`
	Pending   int64   `json:"pending"`
	Foreign   int64   `json:"foreign"`
	KVUsage   float64 `json:"kv_usage"`
	Alone     bool    `json:"alone,omitempty"`
	Recent    float64 `json:"recent"`
	Rate      float64 `json:"rate"`
	Base      float64 `json:"base"`
	Decodes   int64   `json:"decodes"`
	Context   int64   `json:"context"`
	Fleet     int     `json:"fleet"` // pooled model's group (-1: none)
	FleetRate float64 `json:"fleet_rate"`
	FleetBase float64 `json:"fleet_base"`
}

type replayMember struct {
	Name   string `json:"name"`
	Weight int    `json:"weight"`
}

type replayCostOut struct {
	Chosen int       `json:"chosen"`
	Reason string    `json:"reason"`
	Est    []float64 `json:"est"`
	Held   []float64 `json:"held"`
	Work   []int64   `json:"work"`
	Decode []int64   `json:"decode"`
}

type replayCostCase struct {
	Chunks      []uint64       `json:"chunks"`
	Prompt      int64          `json:"prompt_tokens"`
	ChunkTokens int            `json:"chunk_tokens"`
	MeanWork    float64        `json:"mean_work"`
	Sel         replaySel      `json:"sel"`
	Ring        []replayMember `json:"ring,omitempty"` // nil: no ring
	Cands       []replayCand   `json:"cands"`
	Out         replayCostOut  `json:"out"`
}

// replayCost runs the cost model on a recorded case: the one place that knows its internals.
func replayCost(c *replayCostCase) replayCostOut {
	fleets := map[int]*backend.PrefillModel{}
	cs := make([]cand, len(c.Cands))
	for i, r := range c.Cands {
		cs[i] = cand{id: xxhash.Sum64String(r.Name), inFlight: r.InFlight, weight: r.Weight, matched: r.Matched,
			queued: r.Queued, own: r.Own, pending: r.Pending, foreign: r.Foreign, kvUsage: r.KVUsage, alone: r.Alone,
			recent: r.Recent, rate: r.Rate, base: r.Base, decodes: r.Decodes, context: r.Context,
			fleetRate: r.FleetRate, fleetBase: r.FleetBase}
		if r.Fleet >= 0 {
			if fleets[r.Fleet] == nil {
				fleets[r.Fleet] = new(backend.PrefillModel)
			}
			cs[i].fleet = fleets[r.Fleet]
		}
	}
	sel := selection{loadFactor: c.Sel.LoadFactor, hardFactor: c.Sel.HardFactor, margin: c.Sel.Margin,
		tieMargin: c.Sel.TieMargin, loadFirst: c.Sel.LoadFirst, auto: c.Sel.Auto, spread: c.Sel.Spread,
		fleetRecent: c.Sel.FleetRecent, shortFirstTurn: c.Sel.ShortFirstTurn}
	var place *placement
	if c.Ring != nil {
		ms := make([]hashring.Member, len(c.Ring))
		ids := make([]uint64, len(c.Ring))
		for i, m := range c.Ring {
			ms[i], ids[i] = hashring.Member{Name: m.Name, Weight: m.Weight}, xxhash.Sum64String(m.Name)
		}
		place = &placement{ring: hashring.New(ms), ids: ids, members: ms}
	}
	estimate(cs, costInput{promptTokens: c.Prompt, chunkTokens: c.ChunkTokens, meanWork: c.MeanWork})
	j, r := pickCost(c.Chunks, cs, sel, place)
	out := replayCostOut{Chosen: j, Reason: r.String()}
	for _, x := range cs {
		out.Est, out.Held = append(out.Est, x.est), append(out.Held, x.held)
		out.Work, out.Decode = append(out.Work, x.work), append(out.Decode, x.decode)
	}
	return out
}

// genCostCases draws candidate snapshots that reach every branch of the cost model: caps
// and the hard cap, near-ties by ring and by load, thin matches, openings, short first turns,
// KV pressure, unlearned replicas with and without pooled models, more candidates than fit
// on the stack.
func genCostCases(n int) []replayCostCase {
	rng := rand.New(rand.NewPCG(54, 1))
	pick := func(xs ...float64) float64 { return xs[rng.IntN(len(xs))] }
	out := make([]replayCostCase, 0, n)
	for i := range n {
		nc := 1 + rng.IntN(8)
		if i%97 == 0 {
			nc = maxStackCandidates + 2
		}
		ct := []int{64, 64, 64, 16, 128}[rng.IntN(5)]
		nch := key.HeadChunks + rng.IntN(24)
		if rng.IntN(20) == 0 {
			nch = rng.IntN(key.HeadChunks + 1)
		}
		chunks := make([]uint64, nch)
		for j := range chunks {
			chunks[j] = rng.Uint64()
		}
		prompt := int64(key.PrefixTokens(nch, ct) + rng.IntN(ct))
		c := replayCostCase{Chunks: chunks, Prompt: prompt, ChunkTokens: ct, MeanWork: pick(0, 300, 2000, rng.Float64()*8000)}
		lf := pick(1.25, 1.25, 1.5, 2, 1e12) // 1e12: no cap (JSON has no +Inf)
		c.Sel = replaySel{LoadFactor: lf, HardFactor: math.Max(lf, pick(1.25, 2, 3, 1e12)), Margin: int64(pick(0, 1, 2, 2, 5)),
			TieMargin: pick(0, 0.1, 0.5, 0.5, 1), Spread: rng.IntN(4) != 0, ShortFirstTurn: rng.IntN(5) == 0}
		switch rng.IntN(3) {
		case 0:
			c.Sel.LoadFirst, c.Sel.FleetRecent = true, rng.IntN(2) == 0
		case 1:
			c.Sel.Auto = true
		}
		// Homogeneous replicas (same rate, small loads) make near-ties; heterogeneous ones
		// make caps and estimates decide.
		homo := rng.IntN(2) == 0
		rate, base := pick(0, 4000, 12000), pick(0, 0.02, 0.08)
		common := rng.IntN(nch + 1)
		for j := range nc {
			r := replayCand{Name: fmt.Sprintf("http://10.0.%d.%d:8000", i%200, j+1), Weight: 1, Fleet: -1}
			if rng.IntN(6) == 0 {
				r.Weight = 1 + rng.IntN(3)
			}
			switch rng.IntN(5) {
			case 0:
				r.Matched = 0
			case 1:
				r.Matched = min(1, nch)
			case 2:
				r.Matched = nch
			default:
				r.Matched = common + rng.IntN(nch-common+1)
			}
			maxLoad := 20
			if homo {
				maxLoad = 3
			}
			r.Own = int64(rng.IntN(maxLoad + 1))
			r.Pending = int64(rng.IntN(int(r.Own) + 1))
			r.Foreign = int64(rng.IntN(3)) * int64(rng.IntN(2))
			r.InFlight = r.Own + r.Foreign + int64(rng.IntN(2))*int64(rng.IntN(4)) // peers' too
			r.Queued = r.Pending * int64(pick(0, 200, 1500, 6000))
			if rng.IntN(4) == 0 {
				r.KVUsage = 0.5 + rng.Float64()/2
			}
			r.Alone = rng.IntN(5) != 0
			r.Recent = pick(0, 100, 1000, rng.Float64()*20000)
			if homo {
				r.Rate, r.Base = rate, base
			} else {
				r.Rate, r.Base = pick(0, 2000+rng.Float64()*18000), pick(0, 0.01+rng.Float64()*0.2)
			}
			r.Decodes = int64(rng.IntN(3)) * int64(rng.IntN(5))
			r.Context = r.Decodes * int64(pick(200, 3000, 30000))
			if rng.IntN(3) == 0 {
				r.Fleet = rng.IntN(2)
				r.FleetRate, r.FleetBase = pick(0, 6000), pick(0, 0.05)
			}
			c.Cands = append(c.Cands, r)
		}
		if rng.IntN(5) != 0 {
			for _, r := range c.Cands {
				c.Ring = append(c.Ring, replayMember{Name: r.Name, Weight: r.Weight})
			}
			if rng.IntN(3) == 0 { // configured but not a candidate (unhealthy, or tried)
				c.Ring = append(c.Ring, replayMember{Name: fmt.Sprintf("http://10.1.%d.1:8000", i%200), Weight: 1})
			}
		}
		out = append(out, c)
	}
	return out
}

func TestReplayCostModel(t *testing.T) {
	const name = "cost.jsonl.gz"
	if *updateReplay {
		cases := genCostCases(1000)
		for i := range cases {
			cases[i].Out = replayCost(&cases[i])
		}
		writeJSONL(t, name, cases)
	}
	cases := readJSONL[replayCostCase](t, name)
	if len(cases) < 1000 {
		t.Fatalf("%d recorded cases, want ≥ 1000", len(cases))
	}
	reasons := map[string]int{}
	bad := 0
	for i := range cases {
		want := cases[i].Out
		got := replayCost(&cases[i])
		reasons[want.Reason]++
		ok := got.Chosen == want.Chosen && got.Reason == want.Reason && len(got.Est) == len(want.Est)
		for j := 0; ok && j < len(got.Est); j++ {
			ok = sameFloat(got.Est[j], want.Est[j]) && sameFloat(got.Held[j], want.Held[j]) &&
				got.Work[j] == want.Work[j] && got.Decode[j] == want.Decode[j]
		}
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("case %d: got %+v, recorded %+v", i, got, want)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d recorded cost-model cases decided differently", bad, len(cases))
	}
	// The recording must reach every reason the cost model gives, or it guards less than it says.
	for _, r := range []Reason{ReasonMatch, ReasonCold, ReasonOverload} {
		if reasons[r.String()] < 20 {
			t.Errorf("only %d recorded cases end %s", reasons[r.String()], r)
		}
	}
}
