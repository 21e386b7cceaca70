package router

// The replay test: the prefix policy's decisions for recorded states, so that a refactor of
// the cost model, of the backend state it reads or of the learning lifecycle is shown to
// decide as the code did when the states were recorded.
//
// testdata/replay/cost.jsonl.gz holds candidate snapshots as the cost model sees them (loads,
// queued prefill, KV usage, learned and pooled rates, matches, caps, near-tie options, the
// ring) and what estimate and pickCost made of each; testdata/replay/policy.jsonl.gz holds whole
// scenarios played on a Prefix policy through its public API: backends' configured and
// reported state, in-flight requests, learned rates, then a sequence of prompts (chained
// chunk hashes of conversations, shared openings, short prompts) picked, learned, unlearned
// and explained, with every Decision. Both are written by the generators below with
// -update-replay and must then be committed: regenerating them on changed code defeats them.
//
// Decisions, reasons, matches and token counts must be equal; estimates equal within a
// relative 1e-12 (a refactor may reorder a sum).

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/hashring"
	"github.com/prefixlb/prefixlb/router/key"
)

var updateReplay = flag.Bool("update-replay", false, "rewrite testdata/replay/*.jsonl.gz from the generators (only on the code they are to guard)")

const replayDir = "testdata/replay"

// ---- cost model: recorded candidate snapshots ----

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

// ---- the policy: recorded scenarios ----

type replayBackend struct {
	Name     string `json:"name"`
	Weight   int    `json:"weight"`
	KVTokens int64  `json:"kv_tokens"`
	Senders  int    `json:"senders"` // backend.Senders
	// Scraped is (requests, before) for SetScrapedLoad; nil: never scraped.
	Scraped []int64 `json:"scraped,omitempty"`
	KVUsage float64 `json:"kv_usage"`
	// PeerInFlight and PeerPrefill are the peers' load (SetPeerLoad); PeerPrefill only on a
	// backend with no own queued work, so that the drain stays at its start.
	PeerInFlight int64 `json:"peer_in_flight"`
	PeerPrefill  int64 `json:"peer_prefill"`
	// Observe is the prefill observations learned: (work tokens, TTFT µs).
	Observe [][2]int64 `json:"observe,omitempty"`
	// Waiting is own requests in flight with no prefill work left to queue; Queued is the
	// prefill work of one more (0: none). With at most one queued lease, begun last, the
	// drain's credit stays 0 whatever the wall clock does.
	Waiting int   `json:"waiting"`
	Queued  int64 `json:"queued"`
}

type replayOut struct {
	Backend       string          `json:"backend"`
	Reason        string          `json:"reason"`
	Matched       int             `json:"matched"`
	PrefillTokens int64           `json:"prefill_tokens"`
	PrefillWork   int64           `json:"prefill_work"`
	TTFTNanos     int64           `json:"ttft_ns"`
	Explain       json.RawMessage `json:"explain,omitempty"`
}

type replayStep struct {
	Op         string     `json:"op"` // pick, preview, unlearn, tick, peer_routed
	Chunks     []uint64   `json:"chunks,omitempty"`
	Prompt     int        `json:"prompt_tokens,omitempty"`
	ShortFirst bool       `json:"short_first_turn,omitempty"`
	Cands      []int      `json:"cands,omitempty"`   // indices into the scenario's backends
	Learn      bool       `json:"learn,omitempty"`   // pick: Learn where it went
	Explain    bool       `json:"explain,omitempty"` // pick: record Explain first
	Step       int        `json:"step,omitempty"`    // unlearn: the pick step whose Learn to withdraw
	Seconds    float64    `json:"seconds,omitempty"` // tick
	Backend    int        `json:"backend,omitempty"` // peer_routed
	Work       int64      `json:"work,omitempty"`    // peer_routed
	Out        *replayOut `json:"out,omitempty"`
}

type replayOpts struct {
	ChunkTokens    int     `json:"chunk_tokens"`
	LoadFactor     float64 `json:"load_factor"`
	LoadMargin     int     `json:"load_margin"`
	HardLoadFactor float64 `json:"hard_load_factor"`
	MaxEntries     int     `json:"max_index_entries"`
	DefaultKV      int64   `json:"default_kv_cache_tokens"`
	TieMargin      float64 `json:"tie_margin"`
	TieBreak       int     `json:"tie_break"`
	NoSpread       bool    `json:"no_spread,omitempty"`
	PeerRoutes     bool    `json:"count_peer_routes,omitempty"`
}

type replayScenario struct {
	Opts     replayOpts      `json:"opts"`
	Backends []replayBackend `json:"backends"`
	Steps    []replayStep    `json:"steps"`
}

// playScenario runs s on a fresh policy and returns its steps with their outputs filled.
func playScenario(t testing.TB, s replayScenario) []replayStep {
	t.Helper()
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	o := s.Opts
	p := NewPrefix(PrefixOptions{ChunkTokens: o.ChunkTokens, LoadFactor: o.LoadFactor, LoadMargin: o.LoadMargin,
		HardLoadFactor: o.HardLoadFactor, MaxIndexEntries: o.MaxEntries, DefaultKVCacheTokens: o.DefaultKV,
		TieMargin: o.TieMargin, TieBreak: TieBreak(o.TieBreak), NoSpreadNewPrefixes: o.NoSpread}, clk.now)
	bs := make([]*backend.Backend, len(s.Backends))
	var leases []*backend.Lease
	defer func() {
		for _, l := range leases {
			l.Release()
		}
	}()
	for i, r := range s.Backends {
		b, err := backend.New(r.Name, r.KVTokens, r.Weight)
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
		for _, ob := range r.Observe {
			b.ObservePrefill(ob[0], time.Duration(ob[1])*time.Microsecond)
		}
		b.SetOtherSenders(backend.Senders(r.Senders))
		b.SetScrapedKVUsage(r.KVUsage)
		// Requests with nothing left to prefill first (each holds the credit to an empty
		// queue), then the one with queued work, then the peers' load.
		for range r.Waiting {
			l := new(backend.Lease)
			l.Begin(b, 0, 100, true)
			leases = append(leases, l)
		}
		if r.Queued > 0 {
			l := new(backend.Lease)
			l.Begin(b, r.Queued, r.Queued, true)
			leases = append(leases, l)
		}
		b.SetPeerLoad(r.PeerInFlight, r.PeerPrefill)
		if r.Scraped != nil {
			b.SetScrapedLoad(r.Scraped[0], r.Scraped[1])
		}
	}
	p.SetBackends(bs)
	if o.PeerRoutes {
		p.CountPeerRoutes()
	}
	learned := map[int]Learned{}
	learnedOn := map[int]*backend.Backend{}
	keys := map[int]*key.Key{}
	steps := make([]replayStep, len(s.Steps))
	for i, st := range s.Steps {
		st.Out = nil
		switch st.Op {
		case "tick":
			clk.t = clk.t.Add(time.Duration(st.Seconds * float64(time.Second)))
		case "peer_routed":
			p.NotePeerRouted(bs[st.Backend], st.Work)
		case "unlearn":
			if l, ok := learned[st.Step]; ok {
				p.Unlearn(keys[st.Step], learnedOn[st.Step], l)
			}
		case "pick", "preview":
			k := &key.Key{Routed: true, OK: true, Chunks: st.Chunks, PromptTokens: st.Prompt, ShortFirstTurn: st.ShortFirst}
			cs := make([]*backend.Backend, len(st.Cands))
			for j, c := range st.Cands {
				cs[j] = bs[c]
			}
			out := &replayOut{}
			if st.Explain {
				e, err := json.Marshal(p.Explain(k, cs))
				if err != nil {
					t.Fatal(err)
				}
				out.Explain = e
			}
			var d Decision
			if st.Op == "pick" {
				d = p.Pick(k, cs)
			} else {
				d = p.Preview(k, cs)
			}
			if d.Backend != nil {
				out.Backend = d.Backend.Name
			}
			out.Reason, out.Matched, out.PrefillTokens = d.Reason.String(), d.MatchedChunks, d.PrefillTokens
			out.PrefillWork, out.TTFTNanos = d.PrefillWork, int64(d.PredictedTTFT)
			st.Out = out
			if st.Op == "pick" && st.Learn && d.Backend != nil {
				keys[i], learnedOn[i] = k, d.Backend
				learned[i] = p.Learn(k, d.Backend, d.MatchedChunks)
			}
		default:
			t.Fatalf("step %d: unknown op %q", i, st.Op)
		}
		steps[i] = st
	}
	return steps
}

// genScenarios draws policy scenarios: conversations of several turns (chains that extend
// one another), shared openings and system prompts, short prompts, candidate subsets, index
// eviction under a small capacity, refusals (unlearn), time passing, and the peers' decisions.
func genScenarios(n int) []replayScenario {
	rng := rand.New(rand.NewPCG(54, 2))
	pick := func(xs ...float64) float64 { return xs[rng.IntN(len(xs))] }
	out := make([]replayScenario, 0, n)
	for i := range n {
		s := replayScenario{Opts: replayOpts{ChunkTokens: 64, LoadFactor: pick(0, 1.25, 2), LoadMargin: int(pick(0, 0, -1, 3)),
			TieMargin: pick(0, 0, -1, 0.2, 1), TieBreak: rng.IntN(3), NoSpread: rng.IntN(5) == 0}}
		if rng.IntN(4) == 0 {
			s.Opts.MaxEntries = 64 + rng.IntN(200)
		}
		if rng.IntN(4) == 0 {
			s.Opts.DefaultKV = int64(2000 + rng.IntN(20000))
		}
		s.Opts.PeerRoutes = s.Opts.TieBreak == int(TieBreakLoad) && rng.IntN(2) == 0
		nb := 2 + rng.IntN(5)
		homo := rng.IntN(2) == 0
		for j := range nb {
			r := replayBackend{Name: fmt.Sprintf("http://10.2.%d.%d:8000", i, j+1), Weight: 1, Senders: rng.IntN(3)}
			if homo {
				r.Senders = int(backend.SendersAlone)
			}
			if rng.IntN(5) == 0 {
				r.Weight = 2
			}
			if rng.IntN(3) == 0 {
				r.KVTokens = int64(3000 + rng.IntN(40000))
			}
			if !homo {
				if rng.IntN(2) == 0 {
					req := int64(rng.IntN(8))
					r.Scraped = []int64{req, int64(rng.IntN(int(req) + 1))}
				}
				if rng.IntN(3) == 0 {
					r.KVUsage = 0.6 + rng.Float64()*0.4
				}
				r.Waiting = rng.IntN(4)
				if rng.IntN(2) == 0 {
					r.Queued = int64(rng.IntN(20000))
				}
				r.PeerInFlight = int64(rng.IntN(3))
				if r.Queued == 0 && rng.IntN(2) == 0 {
					r.PeerPrefill = int64(rng.IntN(8000))
				}
				for range rng.IntN(12) {
					w, rate := int64(200+rng.IntN(8000)), int64(4000+rng.IntN(16000)) // tokens, tokens/s
					r.Observe = append(r.Observe, [2]int64{w, 20000 + w*1_000_000/rate})
				}
			}
			s.Backends = append(s.Backends, r)
		}
		// Conversations, some opening with a shared system prompt.
		system := chunkChain(nil).extend(fmt.Sprintf("sys%d", i), key.HeadChunks+rng.IntN(6))
		nconv := 2 + rng.IntN(8)
		convs := make([]chunkChain, nconv)
		for c := range convs {
			if rng.IntN(2) == 0 {
				convs[c] = system
			}
		}
		nsteps := 15 + rng.IntN(25)
		var picks []int
		for st := range nsteps {
			switch r := rng.IntN(20); {
			case r == 0:
				s.Steps = append(s.Steps, replayStep{Op: "tick", Seconds: pick(0.5, 5, 120)})
				continue
			case r == 1 && len(picks) > 0:
				s.Steps = append(s.Steps, replayStep{Op: "unlearn", Step: picks[rng.IntN(len(picks))]})
				continue
			case r == 2 && s.Opts.PeerRoutes:
				s.Steps = append(s.Steps, replayStep{Op: "peer_routed", Backend: rng.IntN(nb), Work: int64(100 + rng.IntN(5000))})
				continue
			}
			c := rng.IntN(nconv)
			var chunks chunkChain
			if rng.IntN(10) == 0 { // a short prompt: fewer chunks than the head
				chunks = chunkChain(nil).extend(fmt.Sprintf("short%d/%d", i, st), rng.IntN(key.HeadChunks))
			} else {
				convs[c] = convs[c].extend(fmt.Sprintf("c%d/%d/%d", i, c, st), 1+rng.IntN(key.HeadChunks+4))
				chunks = convs[c]
			}
			cands := make([]int, 0, nb)
			for j := range nb {
				if rng.IntN(8) != 0 || j == 0 {
					cands = append(cands, j)
				}
			}
			op := "pick"
			if rng.IntN(10) == 0 {
				op = "preview"
			}
			prompt := key.PrefixTokens(len(chunks), 64) + rng.IntN(64)
			s.Steps = append(s.Steps, replayStep{Op: op, Chunks: chunks, Prompt: prompt, ShortFirst: rng.IntN(8) == 0,
				Cands: cands, Learn: op == "pick" && rng.IntN(10) != 0, Explain: rng.IntN(6) == 0})
			if op == "pick" {
				picks = append(picks, len(s.Steps)-1)
			}
		}
		out = append(out, s)
	}
	return out
}

// ---- files and comparison ----

func writeJSONL[T any](t *testing.T, name string, xs []T) {
	t.Helper()
	if err := os.MkdirAll(replayDir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(replayDir, name))
	if err != nil {
		t.Fatal(err)
	}
	w := gzip.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range xs {
		if err := enc.Encode(&xs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readJSONL[T any](t *testing.T, name string) []T {
	t.Helper()
	f, err := os.Open(filepath.Join(replayDir, name))
	if err != nil {
		t.Fatalf("%v (the recorded states are part of the repository; -update-replay writes them)", err)
	}
	defer f.Close()
	z, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var xs []T
	dec := json.NewDecoder(z)
	for dec.More() {
		var x T
		if err := dec.Decode(&x); err != nil {
			t.Fatalf("%s record %d: %v", name, len(xs), err)
		}
		xs = append(xs, x)
	}
	return xs
}

// sameJSON compares two JSON encodings, numbers within a relative 1e-12.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return string(a) == string(b)
	}
	return sameValue(x, y)
}

func sameValue(x, y any) bool {
	switch x := x.(type) {
	case float64:
		y, ok := y.(float64)
		return ok && sameFloat(x, y)
	case []any:
		y, ok := y.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := y.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if !sameValue(v, y[k]) {
				return false
			}
		}
		return true
	}
	return x == y
}

func sameFloat(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-12*math.Max(math.Abs(a), math.Abs(b))
}

func sameInt(a, b int64) bool { return sameFloat(float64(a), float64(b)) }

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

func TestReplayPolicy(t *testing.T) {
	const name = "policy.jsonl.gz"
	if *updateReplay {
		ss := genScenarios(120)
		for i := range ss {
			ss[i].Steps = playScenario(t, ss[i])
		}
		writeJSONL(t, name, ss)
	}
	ss := readJSONL[replayScenario](t, name)
	if len(ss) < 100 {
		t.Fatalf("%d recorded scenarios, want ≥ 100", len(ss))
	}
	reasons := map[string]int{}
	bad := 0
	for i, s := range ss {
		got := playScenario(t, s)
		for j, st := range s.Steps {
			w, g := st.Out, got[j].Out
			if w == nil {
				continue
			}
			reasons[w.Reason]++
			ok := g != nil && g.Backend == w.Backend && g.Reason == w.Reason && g.Matched == w.Matched &&
				g.PrefillTokens == w.PrefillTokens && g.PrefillWork == w.PrefillWork && sameInt(g.TTFTNanos, w.TTFTNanos) &&
				(w.Explain == nil) == (g.Explain == nil) && (w.Explain == nil || sameJSON(w.Explain, g.Explain))
			if !ok {
				if bad++; bad <= 5 {
					gs, _ := json.Marshal(g)
					ws, _ := json.Marshal(w)
					t.Errorf("scenario %d step %d (%s): got %s, recorded %s", i, j, st.Op, gs, ws)
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d recorded policy decisions differ", bad)
	}
	for _, r := range []Reason{ReasonMatch, ReasonCold, ReasonOverload, ReasonLeastLoad} {
		if reasons[r.String()] < 20 {
			t.Errorf("only %d recorded decisions end %s", reasons[r.String()], r)
		}
	}
}
