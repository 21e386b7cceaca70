package router

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// CachedPrefillWork is exactly the work PrefillWork charges a prompt beyond what it charges
// the same prompt with those tokens cached, whatever the prompt's length.
func TestCachedPrefillWork(t *testing.T) {
	for _, c := range []struct{ prompt, held int64 }{
		{1000, 0}, {1000, 1}, {1000, 512}, {20_000, 8192}, {120_000, 100_000}, {200_000, 199_000},
	} {
		want := float64(PrefillWork(c.prompt, 0) - PrefillWork(c.prompt, c.held))
		if got := CachedPrefillWork(c.held); math.Abs(got-want) > 1 { // PrefillWork rounds each side
			t.Errorf("prompt %d held %d: CachedPrefillWork %v, PrefillWork difference %v", c.prompt, c.held, got, want)
		}
	}
	if CachedPrefillWork(-5) != 0 || SavedPrefillSeconds(1000, 0) != 0 {
		t.Error("nothing held or no rate: want 0")
	}
	if got, want := SavedPrefillSeconds(2048, 20_000), 2048*(1+1024.0/AttentionTokens)/20_000; math.Abs(got-want) > 1e-12 {
		t.Errorf("SavedPrefillSeconds(2048, 20k) = %v, want %v", got, want)
	}
}

// teachRate gives b a learned base of 20 ms and a learned prefill rate of rate tokens/s, as
// MinPrefillSamples streamed requests of each kind would.
func teachRate(b *backend.Backend, rate float64) {
	for range backend.MinPrefillSamples {
		b.ObservePrefill(0, 20*time.Millisecond)
	}
	for range backend.MinPrefillSamples {
		b.ObservePrefill(int64(rate), time.Second+20*time.Millisecond) // rate tokens in the second after the base
	}
}

// The shadow prices each choice's held tokens at that choice's backend's learned rate: on the
// multi-turn pattern, where the prefix policy always picks the backend that served the
// conversation's previous turn, its saved seconds are the sum of every earlier turn's
// CachedPrefillWork at that backend's rate; the actual choice's are those of what round-robin
// found where it sent each request (the matched chunks it reports). Before any rate is
// learned nothing is counted.
func TestShadowSavedPrefillSeconds(t *testing.T) {
	bs := prefixBackends(t, 3)
	sh := newTestShadow(t, bs)
	const conversations, turns, chunksPerTurn = 4, 5, 3
	run := func(convs []chunkChain, last []*backend.Backend, turn int) (shadowWant, actualWant float64) {
		for i := range convs {
			convs[i] = convs[i].extend(fmt.Sprintf("conversation %d turn %d", i, turn), chunksPerTurn)
			k := routedKey(convs[i])
			k.Model = []byte("m")
			d := sh.Pick(k, bs)
			if turn > 0 {
				held := int64(key.PrefixTokens(chunksPerTurn*turn, key.DefaultChunkTokens))
				r, _ := last[i].LearnedPrefillRate()
				shadowWant += SavedPrefillSeconds(held, r)
			}
			ra, _ := d.Backend.LearnedPrefillRate()
			actualWant += SavedPrefillSeconds(min(int64(key.PrefixTokens(d.MatchedChunks, key.DefaultChunkTokens)), int64(k.PromptTokens)), ra)
			sh.Learn(k, d.Backend, d.MatchedChunks)
			last[i] = d.Backend
		}
		return shadowWant, actualWant
	}
	convs, last := make([]chunkChain, conversations), make([]*backend.Backend, conversations)
	for turn := range 2 {
		run(convs, last, turn)
	}
	if st, _ := sh.ShadowStats(); st.ShadowPrefixTokens == 0 || st.ShadowSavedPrefillSeconds != 0 || st.ActualSavedPrefillSeconds != 0 {
		t.Fatalf("no rate learned: %+v, want prefix tokens and no saved seconds", st)
	}
	for i, b := range bs {
		teachRate(b, 20_000+4_000*float64(i)) // apart, but close enough that the holder stays cheapest
	}
	var shadowWant, actualWant float64
	for turn := 2; turn < turns; turn++ {
		s, a := run(convs, last, turn)
		shadowWant, actualWant = shadowWant+s, actualWant+a
	}
	st, _ := sh.ShadowStats()
	near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*conversations*turns+1e-9*want }
	if shadowWant == 0 || !near(st.ShadowSavedPrefillSeconds, shadowWant) {
		t.Errorf("shadow saved %v s, want %v", st.ShadowSavedPrefillSeconds, shadowWant)
	}
	if actualWant == 0 || !near(st.ActualSavedPrefillSeconds, actualWant) || !(st.ActualSavedPrefillSeconds < st.ShadowSavedPrefillSeconds) {
		t.Errorf("actual saved %v s, want %v (less than the shadow's %v)", st.ActualSavedPrefillSeconds, actualWant, st.ShadowSavedPrefillSeconds)
	}
}
