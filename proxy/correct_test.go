package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/router"
)

// Index correction scenario: one simulated vLLM replica whose KV cache holds about four of
// the prompts, behind a prefixlb configured to believe it holds 1M tokens.
const (
	correctionSimBlocks   = 256     // the sim's KV cache: 256 blocks × 16 = 4096 tokens
	correctionBelievedKV  = 1 << 20 // kv_cache_tokens prefixlb is configured with for it
	correctionPrompts     = 16      // distinct long prompts, each ≈ 1000 tokens
	correctionRevisits    = 64      // requests revisiting them (seeded random order)
	correctionLastWindow  = 32      // the last revisits, where the error is measured
	correctionSimSpeedup  = 200     // model time ÷ this when the sim sleeps
	correctionPromptWords = 200
)

// correctionOutcome is what one run of the scenario measured over the last window.
type correctionOutcome struct {
	meanErr     float64 // mean |predicted − reported| cached share of the prompt
	overMatched int     // requests the index predicted at least half cached that reported under a tenth
	entries     int64   // the index's entries for the replica at the end
	corrections uint64
}

// runCorrection runs the scenario with the index correction on or off, against a sim of
// simBlocks KV blocks.
func runCorrection(t *testing.T, correct bool, simBlocks int) correctionOutcome {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.NumGPUBlocks = simBlocks
	cfg.Speedup = correctionSimSpeedup
	rep := sim.NewReplica("small", cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = rep.Serve(ln) }()
	t.Cleanup(func() { _ = rep.Close() })
	be, err := backend.New("http://"+ln.Addr().String(), correctionBelievedKV, 0)
	if err != nil {
		t.Fatal(err)
	}
	pol := router.NewPrefix(router.PrefixOptions{NoIndexCorrection: !correct}, nil)
	s, url := startProxy(t, "prefix", nil, func(o *Options) {
		o.Policy = pol
		o.Backends = []*backend.Backend{be}
	})

	bodies := make([]string, correctionPrompts)
	approx := make([]int, correctionPrompts)
	for i := range bodies {
		var sb strings.Builder
		fmt.Fprintf(&sb, "Case file %d. ", i)
		for w := range correctionPromptWords {
			fmt.Fprintf(&sb, "clause %d of file %d ", w, i)
		}
		bodies[i] = `{"model":"` + sim.DefaultModel + `","max_tokens":4,"messages":[{"role":"user","content":"` + sb.String() + `"}]}`
		approx[i] = s.Explain("/v1/chat/completions", []byte(bodies[i])).PromptTokens
	}
	c := testClient()
	send := func(i int) (predicted, reported float64) {
		t.Helper()
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(bodies[i]))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("prompt %d: status %d: %s", i, resp.StatusCode, raw)
		}
		var u struct {
			Usage struct {
				Prompt  int `json:"prompt_tokens"`
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(raw, &u); err != nil || u.Usage.Prompt == 0 {
			t.Fatalf("prompt %d: no usage in %s (%v)", i, raw, err)
		}
		route := resp.Header.Get(HeaderRoute)
		_, v, _ := strings.Cut(route, ";cached=")
		v, _, _ = strings.Cut(v, ";")
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("prompt %d: x-prefixlb-route %q has no cached=T", i, route)
		}
		return float64(n) / float64(approx[i]), float64(u.Usage.Details.Cached) / float64(u.Usage.Prompt)
	}
	for i := range correctionPrompts {
		send(i)
	}
	rng := rand.New(rand.NewPCG(15, 15))
	var out correctionOutcome
	for r := range correctionRevisits {
		i := rng.IntN(correctionPrompts)
		p, rp := send(i)
		if r >= correctionRevisits-correctionLastWindow {
			out.meanErr += math.Abs(p-rp) / correctionLastWindow
			if p >= 0.5 && rp < 0.1 {
				out.overMatched++
			}
		}
	}
	waitInFlightZero(t, s)
	st := pol.Index().Stats(nil)
	if len(st) != 1 {
		t.Fatalf("index stats %+v: want one backend", st)
	}
	out.entries, out.corrections = st[0].Entries, st[0].Corrections
	var m strings.Builder
	s.writeGauges(&m)
	series := fmt.Sprintf("prefixlb_index_corrections_total{backend=%q} %d\n", be.Name, out.corrections)
	tokens := fmt.Sprintf("prefixlb_index_corrected_tokens_total{backend=%q} %d\n", be.Name, st[0].CorrectedTokens)
	if !strings.Contains(m.String(), series) || !strings.Contains(m.String(), tokens) || (out.corrections > 0) != (st[0].CorrectedTokens > 0) {
		t.Errorf("/metrics lacks %q or %q (corrected tokens must be > 0 exactly when corrected):\n%s", series, tokens, grepLines(m.String(), "correct"))
	}
	t.Logf("correction %v, sim of %d blocks: mean |predicted − reported| cached share %.3f over the last %d, %d over-matched, %d entries (the sim holds ≈ %d chunks), %d corrections",
		correct, simBlocks, out.meanErr, correctionLastWindow, out.overMatched, out.entries, simBlocks*cfg.BlockSize/64, out.corrections)
	return out
}

// TestIndexCorrectsFromReportedCache: a replica whose KV cache is far smaller than prefixlb
// believes. Sixteen distinct long prompts, then random revisits: the replica holds about
// four of them, so most revisits find their prompt evicted. Without the correction the index
// keeps listing all sixteen and predicts nearly every revisit cached while the replica
// reports almost nothing; with it, the replica's answers shrink the index to about what the
// replica holds and the predicted cached share follows the reported one. A replica whose
// cache holds every prompt (the default, 27,000 blocks) is never corrected: the rule leaves
// block rounding and the two tokenizations alone.
func TestIndexCorrectsFromReportedCache(t *testing.T) {
	off := runCorrection(t, false, correctionSimBlocks)
	on := runCorrection(t, true, correctionSimBlocks)
	if big := runCorrection(t, true, sim.DefaultConfig().NumGPUBlocks); big.corrections != 0 || big.meanErr > 0.1 {
		t.Errorf("a sim that holds every prompt: %+v; want no correction and a mean error ≤ 0.1", big)
	}
	if off.corrections != 0 || off.meanErr < 0.5 || off.overMatched < correctionLastWindow/2 {
		t.Errorf("without correction: %+v; want no corrections, mean error ≥ 0.5 and most revisits over-matched", off)
	}
	simChunks := int64(correctionSimBlocks * sim.DefaultConfig().BlockSize / 64)
	if on.corrections == 0 || on.meanErr > 0.15 || on.overMatched > correctionLastWindow/8 || on.entries > 2*simChunks {
		t.Errorf("with correction: %+v; want corrections, mean error ≤ 0.15, at most %d over-matched, at most %d entries (twice what the sim holds)",
			on, correctionLastWindow/8, 2*simChunks)
	}
	if off.entries < 3*simChunks {
		t.Errorf("without correction the index holds %d entries, want ≥ %d: the scenario must overfill the sim", off.entries, 3*simChunks)
	}
}

// TestCorrectionNeedsACachedCount: a usage without a cached-token count is no report, so
// stock vLLM (prompt_tokens_details only with --enable-prompt-tokens-details, and omitted
// when 0) never shrinks the index; once a backend has sent a count, its absence means 0.
func TestCorrectionNeedsACachedCount(t *testing.T) {
	const sends = 6
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + strings.Repeat("the same long prompt about KV caches ", 60) + `"}]}`
	for _, tc := range []struct {
		name    string
		usage   func(i int) string // the usage object of response i
		correct bool
	}{
		{"never a count", func(int) string { return `{"prompt_tokens":600,"completion_tokens":4}` }, false},
		{"a count of 0 every time", func(int) string {
			return `{"prompt_tokens":600,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}`
		}, true},
		{"a count once, then absent (vLLM omits 0)", func(i int) string {
			if i == 1 {
				return `{"prompt_tokens":600,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":592}}`
			}
			return `{"prompt_tokens":600,"completion_tokens":4}`
		}, true},
		{"full counts", func(int) string {
			return `{"prompt_tokens":600,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":592}}`
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				i := int(n.Add(1)) - 1
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":`+tc.usage(i)+`}`)
			}))
			defer ts.Close()
			be, err := backend.New(ts.URL, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			pol := router.NewPrefix(router.PrefixOptions{}, nil)
			s, url := startProxy(t, "prefix", nil, func(o *Options) {
				o.Policy = pol
				o.Backends = []*backend.Backend{be}
			})
			c := testClient()
			for i := range sends {
				resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("send %d: status %d", i, resp.StatusCode)
				}
			}
			waitInFlightZero(t, s)
			st := pol.Index().Stats(nil)
			if got := st[0].Corrections > 0; got != tc.correct {
				t.Errorf("%d corrections over %d sends, want corrections: %v", st[0].Corrections, sends, tc.correct)
			}
		})
	}
}

// TestShadowIndexCorrectsFromReportedCache: in round-robin with the prefix shadow, the
// shadow's index, which learns where requests went, also corrects itself from the cached
// tokens the backend reports, as prefix mode's does: a backend that reports none of a prompt
// the index lists it as holding has lost it.
func TestShadowIndexCorrectsFromReportedCache(t *testing.T) {
	const sends = 3
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + strings.Repeat("the same long prompt about KV caches ", 60) + `"}]}`
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"ok"}}],`+
			`"usage":{"prompt_tokens":600,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`)
	}))
	defer ts.Close()
	be, err := backend.New(ts.URL, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var sh *router.Shadow
	s, url := startProxy(t, "round-robin", nil, func(o *Options) {
		if sh, err = router.NewShadow(router.ShadowPrefix, "round-robin", o.Policy, router.PolicyOptions{}); err != nil {
			t.Fatal(err)
		}
		o.Policy = sh
		o.Backends = []*backend.Backend{be}
	})
	c := testClient()
	for i := range sends {
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("send %d: status %d", i, resp.StatusCode)
		}
	}
	waitInFlightZero(t, s)
	if st := sh.Index().Stats(nil); len(st) != 1 || st[0].Corrections == 0 {
		t.Errorf("shadow index after %d sends reported none cached: %+v, want corrections", sends, st)
	}
}
