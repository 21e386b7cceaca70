package backend

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestPrefillModelLearns: from TTFTs that follow base + work ÷ rate with noise and a few wild
// outliers, the model finds rate and base within 10%, and says nothing before it has enough
// observations.
func TestPrefillModelLearns(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate float64 // tokens/s
		base time.Duration
	}{
		{"8B on H100", 18_500, 6 * time.Millisecond},
		{"a slow replica", 3_000, 40 * time.Millisecond},
		{"bench at 8× speed", 150_000, 750 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m PrefillModel
			rnd := rand.New(rand.NewPCG(1, 2))
			obs := func(work int64) {
				ttft := tc.base.Seconds() + float64(work)/tc.rate
				ttft *= 1 + 0.1*(rnd.Float64()-0.5) // ±5% noise
				if rnd.IntN(20) == 0 {
					ttft *= 30 // a stalled request
				}
				m.Observe(work, time.Duration(ttft*float64(time.Second)))
			}
			for i := range 2 * MinPrefillSamples {
				if i == MinPrefillSamples-1 {
					if _, ok := m.Rate(); ok {
						t.Fatal("a rate before MinPrefillSamples observations")
					}
				}
				obs(int64(1000 + rnd.IntN(20_000)))
				obs(int64(rnd.IntN(64)))
			}
			for range 300 {
				obs(int64(1000 + rnd.IntN(20_000)))
				obs(int64(rnd.IntN(64)))
			}
			r, ok := m.Rate()
			if !ok || math.Abs(r/tc.rate-1) > 0.10 {
				t.Errorf("rate %.0f tokens/s (ok %v), want %.0f ± 10%%", r, ok, tc.rate)
			}
			b, ok := m.Base()
			if !ok || math.Abs(b.Seconds()/tc.base.Seconds()-1) > 0.10 {
				t.Errorf("base %v (ok %v), want %v ± 10%%", b, ok, tc.base)
			}
		})
	}
}

// TestPrefillModelOutlierBound: once learned, a burst of wild observations moves the
// estimate by a bounded factor, not to the outliers.
func TestPrefillModelOutlierBound(t *testing.T) {
	var m PrefillModel
	for range 50 {
		m.Observe(10_000, time.Second) // 10k tokens/s
	}
	before, _ := m.Rate()
	for range 5 {
		m.Observe(10_000, 1000*time.Second)
	}
	after, _ := m.Rate()
	if after < before/2 {
		t.Fatalf("5 outliers moved the rate from %.0f to %.0f tokens/s", before, after)
	}
}

// TestLeaseObservesPrefill: a lease's first byte teaches the backend's model the work it
// carried plus the work this proxy had queued there before it; the counters return to zero.
func TestLeaseObservesPrefill(t *testing.T) {
	b, err := New("http://127.0.0.1:1", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	var first, second Lease
	t0 := time.Now()
	first.Begin(b, 3000, 0, true)
	second.Begin(b, 1000, 0, true)
	elapsed := time.Since(t0)
	if b.PrefillTokens() != 4000 || b.PrefillRequests() != 2 || b.InFlight() != 2 {
		t.Fatalf("queued %d tokens, %d requests, %d in flight; want 4000, 2, 2", b.PrefillTokens(), b.PrefillRequests(), b.InFlight())
	}
	// The first lease's 3000 tokens, less what the replica worked off between the two Begins
	// at the default rate (QueuedPrefill drains by the wall clock, so a stalled test
	// machine sees less).
	if lo := 3000 - int64(math.Ceil(DefaultPrefillRate*elapsed.Seconds())); second.ahead > 3000 || second.ahead < lo {
		t.Fatalf("second lease saw %d tokens ahead, want 3000 less at most what %v drains (≥ %d)", second.ahead, elapsed, lo)
	}
	second.FirstByte()
	second.FirstByte() // counted once
	first.Release()    // released before a first byte: no observation
	second.Release()
	if n := b.Prefill().Samples(); n != 1 {
		t.Fatalf("%d observations, want 1", n)
	}
	var whole Lease // not streamed: its first byte is its last, no prefill time
	whole.Begin(b, 500, 0, false)
	whole.FirstByte()
	whole.Release()
	if n := b.Prefill().Samples(); n != 1 {
		t.Fatalf("a non-streamed response was observed: %d observations, want 1", n)
	}
	var refused Lease // streamed, answered with an error status: dequeued, not observed
	refused.Begin(b, 700, 0, true)
	refused.Refused()
	if b.PrefillTokens() != 0 || b.PrefillRequests() != 0 {
		t.Fatalf("a refused request is still queued: %d tokens, %d requests", b.PrefillTokens(), b.PrefillRequests())
	}
	refused.FirstByte() // its error body's first byte
	refused.Release()
	if n := b.Prefill().Samples(); n != 1 {
		t.Fatalf("a refused request was observed: %d observations, want 1", n)
	}
	if b.PrefillTokens() != 0 || b.PrefillRequests() != 0 || b.InFlight() != 0 {
		t.Fatalf("after release: %d tokens, %d requests, %d in flight", b.PrefillTokens(), b.PrefillRequests(), b.InFlight())
	}
}

// TestKVUsage: the scraped usage is clamped to 0..1.
func TestKVUsage(t *testing.T) {
	b, _ := New("http://127.0.0.1:1", 0, 1)
	for _, c := range []struct{ in, want float64 }{{0.42, 0.42}, {1.7, 1}, {-3, 0}, {math.NaN(), 0}} {
		b.SetScrapedKVUsage(c.in)
		if got := b.KVUsage(); got != c.want {
			t.Errorf("SetScrapedKVUsage(%v): %v, want %v", c.in, got, c.want)
		}
	}
}
