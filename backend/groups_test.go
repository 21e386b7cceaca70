package backend

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestGroupSnapshots: each group's snapshot holds what its setters wrote, and only that:
// the settings, the health checker's report, the peers' load, this proxy's counts through a
// lease's life.
func TestGroupSnapshots(t *testing.T) {
	b, err := New("http://127.0.0.1:8000", 40_000, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := b.Settings(), (Settings{KVCacheTokens: 40_000, Weight: 2}); got != want {
		t.Errorf("Settings() = %+v, want %+v", got, want)
	}
	if got, want := b.HealthReport(), (HealthReport{Healthy: true}); got != want {
		t.Errorf("a new backend's HealthReport() = %+v, want %+v", got, want)
	}
	var l Lease
	l.Begin(b, 300, 500, true)
	b.SetPeerLoad(2, 700)
	if got, want := b.PeerLoad(), (PeerLoad{InFlight: 2, PrefillTokens: 700}); got != want {
		t.Errorf("PeerLoad() = %+v, want %+v", got, want)
	}
	if got, want := b.Counts(), (Counts{InFlight: 1, PrefillTokens: 300, PrefillRequests: 1, Served: 1}); got != want {
		t.Errorf("Counts() after Begin = %+v, want %+v", got, want)
	}
	// 8 requests reported with 3 in flight (1 own, 2 the peers'): 5 beyond.
	b.SetScrapedLoad(8, 0)
	b.SetScrapedKVUsage(1.5)
	b.SetScrapedKVCacheTokens(90_000)
	b.SetOtherSenders(SendersShared)
	b.SetHealthy(false)
	b.SetNeverPassed(true)
	want := HealthReport{NeverPassed: true, Requests: 8, Running: 8, CountedAtScrape: 3, Excess: 5, KVCacheTokens: 90_000, KVUsage: 1, Senders: SendersShared}
	if got := b.HealthReport(); got != want {
		t.Errorf("HealthReport() = %+v, want %+v", got, want)
	}
	if b.Busy() != 8 || b.Load() != 8 || b.KVCapacity(1) != 40_000 {
		t.Errorf("Busy %d, Load %d, KVCapacity %d; want 8, 8, 40000 (the configured capacity)", b.Busy(), b.Load(), b.KVCapacity(1))
	}
	l.FirstByte()
	l.Complete()
	if got, want := b.Counts(), (Counts{InFlight: 1, Decoding: 1, DecodingTokens: 500, Served: 1, Completed: 1}); got != want {
		t.Errorf("Counts() after the first byte = %+v, want %+v", got, want)
	}
	l.Release()
	if got, want := b.Counts(), (Counts{Served: 1, Completed: 1}); got != want {
		t.Errorf("Counts() after Release = %+v, want %+v", got, want)
	}
}

// TestHealthReportWholeUnderWrites: the report is published whole, so a reader never sees
// the requests of one scrape with the excess of another. Each scrape here reports n
// requests with none in flight, so every report read must have Excess == Requests.
func TestHealthReportWholeUnderWrites(t *testing.T) {
	b, err := New("http://127.0.0.1:8000", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := int64(1); !stop.Load(); n = n%1000 + 1 {
			b.SetScrapedLoad(n, 0)
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()
	for i := range 200_000 {
		if r := b.HealthReport(); r.Excess != r.Requests {
			t.Fatalf("read %d: %d requests with an excess of %d: fields of two scrapes", i, r.Requests, r.Excess)
		}
	}
}

// TestHealthReportUnchangedNoAlloc: a write that changes nothing (the health checker applies
// its verdict on every event) neither allocates nor reports a change.
func TestHealthReportUnchangedNoAlloc(t *testing.T) {
	b, err := New("http://127.0.0.1:8000", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.SetOtherSenders(SendersAlone)
	allocs := testing.AllocsPerRun(100, func() {
		if b.SetHealthy(true) || b.SetOtherSenders(SendersAlone) || b.SetScrapedKVCacheTokens(0) {
			t.Fatal("an unchanged write reported a change")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per unchanged write, want 0", allocs)
	}
	if !b.SetHealthy(false) || !b.SetOtherSenders(SendersShared) || !b.SetScrapedKVCacheTokens(1) {
		t.Error("a change was not reported")
	}
}
