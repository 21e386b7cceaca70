package router

import (
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// serving gives b the models ms (an id, or "id<parent" for an adapter), as discovery does.
func serving(b *backend.Backend, ms ...string) {
	set := make([]backend.Model, len(ms))
	for i, m := range ms {
		id, parent, _ := strings.Cut(m, "<")
		set[i] = backend.Model{ID: id, Parent: parent}
	}
	b.SetDiscoveredModels(backend.NewModelSet(set, false))
}

func TestPoolKey(t *testing.T) {
	bs := prefixBackends(t, 5)
	serving(bs[1], "llama-8b")
	serving(bs[2], "llama-8b", "sql-lora<llama-8b") // an adapter runs at its base's speed
	serving(bs[3], "sql-lora<llama-8b")             // adapters only: named by them
	serving(bs[4], "qwen-32b", "llama-8b")          // two bases
	for i, want := range []string{"", "llama-8b", "llama-8b", "sql-lora", "llama-8b\nqwen-32b"} {
		if got := poolKey(bs[i]); got != want {
			t.Errorf("backend %d: pool %q, want %q", i, got, want)
		}
	}
}

// TestFleetPerPool: the pooled prefill model that stands in for an unlearned replica is its
// model pool's: what an 8B pool's replicas answered does not make an unlearned 70B replica
// look as fast, and a replica whose models change (ModelsChanged) moves to its new pool's
// model, which keeps what it learned.
func TestFleetPerPool(t *testing.T) {
	bs := prefixBackends(t, 4)
	serving(bs[0], "llama-8b")
	serving(bs[1], "llama-8b")
	serving(bs[2], "llama-70b")
	serving(bs[3], "llama-70b", "sql-lora<llama-70b")
	p, _ := newTestPrefix(t, bs)
	small, large := bs[0].FleetPrefill(), bs[2].FleetPrefill()
	if small == nil || large == nil || small == large || bs[1].FleetPrefill() != small || bs[3].FleetPrefill() != large {
		t.Fatalf("pooled models %p %p %p %p: want one for the 8B pair and another for the 70B pair",
			bs[0].FleetPrefill(), bs[1].FleetPrefill(), bs[2].FleetPrefill(), bs[3].FleetPrefill())
	}
	for i := range backend.MinPrefillSamples {
		bs[i%2].ObservePrefill(150_000, 1020*time.Millisecond) // the 8B pair: 150k tokens/s
	}
	if r, ok := small.Rate(); !ok || r < 140_000 || r > 160_000 {
		t.Fatalf("the 8B pool's model: %v tokens/s (learned %v), want ≈ 150k", r, ok)
	}
	if _, ok := large.Rate(); ok {
		t.Fatal("the 70B pool's model learned from the 8B replicas' answers")
	}
	k := routedKey(chunkChain(nil).extend("pools", 64))
	fast, slow := p.Explain(k, bs[:2]), p.Explain(k, bs[2:])
	base := backend.DefaultPrefillBase.Seconds() * 1000
	for j := range 2 {
		// The prompt's work at 150k tokens/s against the 10k default: a fifteenth.
		if got, want := fast[j].PredictedTTFTMs-base, (slow[j].PredictedTTFTMs-base)/15; got < 0.9*want || got > 1.1*want {
			t.Errorf("8B replica %d: %.2f ms beyond the base, want ≈ %.2f (the pool's rate against the 70B's default %.2f)",
				j, got, want, slow[j].PredictedTTFTMs-base)
		}
	}

	// bs[2] is redeployed with the 8B model: it joins that pool's model, learned already.
	serving(bs[2], "llama-8b")
	p.ModelsChanged(bs[2])
	if bs[2].FleetPrefill() != small || bs[3].FleetPrefill() != large {
		t.Fatalf("after the change: %p, %p; want the 8B pool's %p and the 70B pool's %p", bs[2].FleetPrefill(), bs[3].FleetPrefill(), small, large)
	}
	// A pool nobody serves any more is forgotten; SetBackends keeps the others' models.
	serving(bs[3], "llama-8b")
	p.ModelsChanged(bs[3])
	p.SetBackends(bs)
	if len(p.fleets) != 1 || bs[3].FleetPrefill() != small {
		t.Errorf("%d pooled models after every replica serves the 8B model (want 1, the 8B pool's, kept)", len(p.fleets))
	}
}

// TestShadowModelsChanged: in shadow mode the Decider reaches the shadow's prefix policy, whose
// pooled models split when the backends' models become known.
func TestShadowModelsChanged(t *testing.T) {
	s, err := NewShadow(ShadowPrefix, "round-robin", &RoundRobin{}, PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := NewDecider(s)
	bs := prefixBackends(t, 2)
	d.SetBackends(bs)
	if bs[0].FleetPrefill() == nil || bs[0].FleetPrefill() != bs[1].FleetPrefill() {
		t.Fatal("before the models are known both backends should share one pooled model")
	}
	serving(bs[0], "llama-8b")
	serving(bs[1], "llama-70b")
	d.ModelsChanged(bs[1])
	if bs[0].FleetPrefill() == bs[1].FleetPrefill() {
		t.Error("the shadow's pooled models did not split by model")
	}
}

// TestFleetMedianThroughSnapshot: through the policy's own snapshot, an unlearned replica takes
// the rate its pool's learned replica measured, not the pooled model (which the unlearned
// ones' slower answers have pulled down).
func TestFleetMedianThroughSnapshot(t *testing.T) {
	bs := prefixBackends(t, 5)
	p, _ := newTestPrefix(t, bs)
	for range backend.MinPrefillSamples { // 150k tokens/s after a 20 ms base, both learned
		bs[0].ObservePrefill(150_000, 1020*time.Millisecond)
		bs[0].ObservePrefill(100, 20*time.Millisecond)
	}
	for _, b := range bs[1:] { // most of the pool's answers are slow
		for range backend.MinPrefillSamples - 1 { // 15k tokens/s
			b.ObservePrefill(15_000, 1020*time.Millisecond)
		}
		if _, ok := b.Prefill().Rate(); ok {
			t.Fatalf("%s learned its own rate", b.Name)
		}
	}
	if r, _ := bs[0].FleetPrefill().Rate(); r > 120_000 {
		t.Fatalf("the pooled model reads %.0f tokens/s; the test needs it pulled down by the slow answers", r)
	}
	ex := p.Explain(routedKey(chunkChain(nil).extend("median", 64)), bs)
	if r := ex[1].PredictedTTFTMs / ex[0].PredictedTTFTMs; r < 0.9 || r > 1.1 {
		t.Errorf("unlearned replica predicted %.2f ms against its learned peer's %.2f: want the peer's rate", ex[1].PredictedTTFTMs, ex[0].PredictedTTFTMs)
	}
}
