package peers

import (
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
)

// inFlightTokens begins a streamed request of tokens prefill work on each backend (in[i]
// tokens on bs[i]; 0: none), as the proxy does with a decision's PrefillWork, released at
// test end.
func inFlightTokens(t *testing.T, bs []*backend.Backend, in ...int64) {
	t.Helper()
	for i, n := range in {
		if n > 0 {
			l := new(backend.Lease)
			l.Begin(bs[i], n, n, true)
			t.Cleanup(l.Release)
		}
	}
}

// TestLLMDRules: each rule of llm-d's optimized baseline (prefix-cache-affinity-filter at
// 0.80 with its load gate, then token-load-scorer) on hand-made candidate sets. conv is 10
// chunks, 528 tokens; 9 chunks hold 464 (0.88: sticky), 8 hold 400 (0.76: not).
func TestLLMDRules(t *testing.T) {
	conv := chain("conv", 10)
	tests := []struct {
		name     string
		held     map[int]int // backend → leading chunks of conv it holds
		inFlight []int64     // per backend, uncached prompt tokens in flight
		want     int
		reason   router.Reason
	}{
		{"sticky: the full holder, though 10,000 tokens busier", map[int]int{0: 10}, []int64{10_000, 0}, 0, router.ReasonMatch},
		{"sticky at 0.88 (9 of 10 chunks)", map[int]int{0: 9}, []int64{10_000, 0}, 0, router.ReasonMatch},
		{"0.76 (8 of 10 chunks) is not sticky: least token load, request's uncached tokens included",
			map[int]int{0: 8}, []int64{300, 0}, 0, router.ReasonMatch}, // 300 + 128 < 0 + 528
		{"not sticky and busier by more than its cached share: the other",
			map[int]int{0: 8}, []int64{500, 0}, 1, router.ReasonLeastLoad}, // 500 + 128 > 528
		{"two sticky: the less loaded of them, not the idle non-sticky one",
			map[int]int{0: 10, 1: 10}, []int64{5_000, 1_000, 0}, 1, router.ReasonMatch},
		{"gate: sticky busier by 18 s × 15,928 tok/s = 286,704 tokens exactly still sticks",
			map[int]int{0: 10}, []int64{286_704, 0}, 0, router.ReasonMatch},
		{"gate: busier by one token more opens all: least token load",
			map[int]int{0: 10}, []int64{286_705, 0}, 1, router.ReasonOverload},
		{"gate compares the least loaded sticky with the least loaded other",
			map[int]int{0: 10, 1: 10}, []int64{400_000, 200_000, 0}, 1, router.ReasonMatch}, // 200,000 ≤ 286,704
		{"nobody holds it: least token load", nil, []int64{700, 300, 900}, 1, router.ReasonLeastLoad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := testBackends(t, len(tc.inFlight))
			p := NewLLMD(LLMDOptions{})
			p.SetBackends(bs)
			for b, n := range tc.held {
				p.Learn(keyOf(conv[:n]), bs[b], 0)
			}
			inFlightTokens(t, bs, tc.inFlight...)
			d := p.Pick(keyOf(conv), bs)
			if d.Backend != bs[tc.want] || d.Reason != tc.reason {
				t.Fatalf("picked %s (%v), want %s (%v)", d.Backend.Name, d.Reason, bs[tc.want].Name, tc.reason)
			}
		})
	}
}

// TestLLMDInFlightTokens: the decision carries the chosen backend's uncached prompt tokens
// (at least 1 as work), which a lease holds in PrefillTokens until the first byte, as
// inflight-load-producer holds them until the first streamed chunk; the next pick sees them.
func TestLLMDInFlightTokens(t *testing.T) {
	conv := chain("conv", 10)
	bs := testBackends(t, 2)
	p := NewLLMD(LLMDOptions{})
	p.SetBackends(bs)
	p.Learn(keyOf(conv[:5]), bs[0], 0) // 208 of 528 held
	d := p.Pick(keyOf(conv), bs)
	if d.Backend != bs[0] || d.PrefillTokens != 320 || d.PrefillWork != 320 {
		t.Fatalf("picked %s with %d tokens (%d work), want %s with 320", d.Backend.Name, d.PrefillTokens, d.PrefillWork, bs[0].Name)
	}
	var l backend.Lease
	l.Begin(d.Backend, d.PrefillWork, int64(keyOf(conv).PromptTokens), true)
	defer l.Release()
	if got := bs[0].PrefillTokens(); got != 320 {
		t.Fatalf("in-flight tokens %d, want 320", got)
	}
	// A cold prompt of 528 tokens: b0 at 320 + 528, b1 at 0 + 528.
	if d := p.Pick(keyOf(chain("other", 10)), bs); d.Backend != bs[1] {
		t.Fatalf("second prompt went to %s, want the backend without tokens in flight", d.Backend.Name)
	}
	l.FirstByte()
	if got := bs[0].PrefillTokens(); got != 0 {
		t.Fatalf("in-flight tokens after the first byte %d, want 0", got)
	}
	p.Learn(keyOf(conv), bs[0], 0)
	if d := p.Pick(keyOf(conv), bs); d.PrefillTokens != 0 || d.PrefillWork != 1 {
		t.Fatalf("a full hit: %d tokens, %d work; want 0 and 1 (the proxy's minimum)", d.PrefillTokens, d.PrefillWork)
	}
}

func TestLLMDTiesRotate(t *testing.T) {
	bs := testBackends(t, 3)
	p := NewLLMD(LLMDOptions{})
	p.SetBackends(bs)
	seen := map[string]bool{}
	for range 3 {
		seen[p.Pick(keyOf(chain("cold", 4)), bs).Backend.Name] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three picks among equal scores went to %v, want each candidate once", seen)
	}
	// Token loads past queueThresholdTokens all score 0: a tie.
	inFlightTokens(t, bs, 5_000_000, 6_000_000, 7_000_000)
	seen = map[string]bool{}
	for range 3 {
		seen[p.Pick(keyOf(chain("cold", 4)), bs).Backend.Name] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three picks over the token threshold went to %v, want each candidate once", seen)
	}
}
