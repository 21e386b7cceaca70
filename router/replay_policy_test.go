package router

// The prefix policy's recorded scenarios (replay_test.go says what the replay is).

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

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
