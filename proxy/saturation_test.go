package proxy

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/flowcontrol"
)

// TestSaturated: the saturation rule, row by row.
func TestSaturated(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    replicaView
		want bool
	}{
		{"nothing known", replicaView{counted: 500}, false},
		{"configured limit not reached", replicaView{counted: 3, maxConcurrency: 4}, false},
		{"configured limit reached", replicaView{counted: 4, maxConcurrency: 4}, true},
		{"other senders count", replicaView{counted: 2, maxConcurrency: 4, report: backend.HealthReport{Excess: 2}}, true},
		// No limit learned: a queue seen once, or at an earlier scrape, is none.
		{"no queue at the last scrape", replicaView{counted: 8, report: backend.HealthReport{Running: 8, CountedAtScrape: 8}}, false},
		{"configured lower than the queue's", replicaView{counted: 6, maxConcurrency: 6, report: backend.HealthReport{Running: 8, Waiting: 1, QueuedScrapes: 2, LearnedLimit: 8, CountedAtScrape: 6}}, true},
		// The last two scrapes showed a queue, the last 6 running and 2 waiting with 8
		// counted; counts are unchanged since: still queued.
		{"persistent queue, nothing ended", replicaView{counted: 8, report: backend.HealthReport{Running: 6, Waiting: 2, QueuedScrapes: 2, LearnedLimit: 6, CountedAtScrape: 8}}, true},
		{"persistent queue, seen longer", replicaView{counted: 8, report: backend.HealthReport{Running: 6, Waiting: 2, QueuedScrapes: backend.MaxQueuedScrapes, LearnedLimit: 6, CountedAtScrape: 8}}, true},
		// Three of the counted requests ended since: the queue drained and a place is free.
		{"persistent queue, drained since", replicaView{counted: 5, report: backend.HealthReport{Running: 6, Waiting: 2, QueuedScrapes: 2, LearnedLimit: 6, CountedAtScrape: 8}}, false},
		{"persistent queue below the configured limit", replicaView{counted: 4, maxConcurrency: 8, report: backend.HealthReport{Running: 4, Waiting: 1, QueuedScrapes: 2, LearnedLimit: 4, CountedAtScrape: 5}}, true},
		// A limit learned from a queue, kept after it: the replica runs what prefixlb holds
		// it to and shows no queue (backend.nextLimit grows it then, scrape by scrape).
		{"learned limit, no queue, reached", replicaView{counted: 10, report: backend.HealthReport{Running: 10, LearnedLimit: 10, CountedAtScrape: 10}}, true},
		{"learned limit, no queue, below", replicaView{counted: 9, report: backend.HealthReport{Running: 10, LearnedLimit: 10, CountedAtScrape: 10}}, false},
		{"learned under the configured", replicaView{counted: 10, maxConcurrency: 64, report: backend.HealthReport{Running: 10, LearnedLimit: 10, CountedAtScrape: 10}}, true},
		// A queue in the last scrape only may be one engine step's: vLLM starts a request
		// that arrived during a step, or behind a long prompt's prefill chunks, a step or a
		// few later, so it is no limit, at any count.
		{"queue in one scrape, nothing ended", replicaView{counted: 8, report: backend.HealthReport{Running: 6, Waiting: 2, QueuedScrapes: 1, CountedAtScrape: 8}}, false},
		{"queue in one scrape, more sent since", replicaView{counted: 12, report: backend.HealthReport{Running: 6, Waiting: 3, QueuedScrapes: 1, CountedAtScrape: 9}}, false},
		{"queue in one scrape, configured limit reached", replicaView{counted: 8, maxConcurrency: 8, report: backend.HealthReport{Running: 6, Waiting: 2, QueuedScrapes: 1, CountedAtScrape: 8}}, true},
		{"queue in one scrape, KV full", replicaView{counted: 8, report: backend.HealthReport{Running: 6, Waiting: 2, QueuedScrapes: 1, KVUsage: 0.99, CountedAtScrape: 8}}, true},
		{"KV full, nothing ended", replicaView{counted: 3, report: backend.HealthReport{KVUsage: 0.99, CountedAtScrape: 3}}, true},
		{"KV full, one ended since", replicaView{counted: 2, report: backend.HealthReport{KVUsage: 0.99, CountedAtScrape: 3}}, false},
		{"KV below the threshold", replicaView{counted: 3, report: backend.HealthReport{KVUsage: 0.97, CountedAtScrape: 3}}, false},
		{"KV full, idle", replicaView{report: backend.HealthReport{KVUsage: 1}}, false},
		{"KV full, other senders' requests", replicaView{report: backend.HealthReport{KVUsage: 1, Excess: 2}}, true},
		{"prefill queued below the bound", replicaView{counted: 3, queuedPrefill: 1999 * time.Millisecond}, false},
		{"prefill queued at the bound", replicaView{counted: 3, queuedPrefill: 2 * time.Second}, true},
		{"prefill queued, nothing else known", replicaView{counted: 1, queuedPrefill: 30 * time.Second}, true},
	} {
		if got := tc.v.saturated(&defaultRule); got != tc.want {
			t.Errorf("%s: saturated = %v, want %v", tc.name, got, tc.want)
		}
	}
	if v := (replicaView{counted: 3, report: backend.HealthReport{KVUsage: 1, CountedAtScrape: 3}}); v.saturated(&satRule{}) {
		t.Error("kvFull 0 must turn the KV rule off")
	}
	if v := (replicaView{counted: 3, queuedPrefill: time.Minute}); v.saturated(&satRule{kvFull: DefaultKVSaturation}) {
		t.Error("prefill 0 must turn the prefill rule off")
	}
}

// defaultRule is FlowControl's default saturation rule.
var defaultRule = satRule{kvFull: DefaultKVSaturation, prefill: DefaultPrefillSaturation}

// TestPrefillBacklogSaturates: a replica whose queued prompts would keep a new request's
// prefill waiting for the bound or longer is saturated before any scrape has taught its
// concurrency limit (the first burst of long prompts), and has room again once its queue is
// answered.
func TestPrefillBacklogSaturates(t *testing.T) {
	b, err := backend.New("http://127.0.0.1:1", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	// At DefaultPrefillRate (10k tokens/s, nothing learned) 25k queued tokens are 2.5 s of
	// prefill: still over 2 s after any pause of the test's own.
	var ls [5]backend.Lease
	for i := range ls {
		ls[i].Begin(b, 5000, 5000, true)
	}
	r := ruleOf(&FlowControl{KVSaturation: DefaultKVSaturation, PrefillSaturation: DefaultPrefillSaturation})
	if v := viewOf(b); !v.saturated(&r) {
		t.Fatalf("25k prompt tokens queued (%v of prefill): want saturated", v.prefillAhead(&r))
	}
	if v := viewOf(b); v.saturated(&satRule{kvFull: DefaultKVSaturation}) {
		t.Error("prefill rule off: saturated")
	}
	for i := range ls {
		ls[i].Release()
	}
	r = ruleOf(&FlowControl{KVSaturation: DefaultKVSaturation, PrefillSaturation: DefaultPrefillSaturation})
	if v := viewOf(b); v.saturated(&r) {
		t.Errorf("every request answered: still saturated (%v of prefill)", v.prefillAhead(&r))
	}
}

// TestPoolSaturated: a pool is saturated only when every candidate is; an empty pool never.
func TestPoolSaturated(t *testing.T) {
	mk := func(limit int64, leases int) *backend.Backend {
		b, err := backend.New("http://127.0.0.1:1", 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		b.SetMaxConcurrency(limit)
		for range leases {
			var l backend.Lease
			l.Begin(b, 1, 1, false)
			t.Cleanup(l.Release)
		}
		return b
	}
	full1, full2, roomy := mk(1, 1), mk(2, 2), mk(2, 1)
	if poolSaturated(nil, defaultRule) {
		t.Error("an empty pool is saturated")
	}
	if !poolSaturated([]*backend.Backend{full1, full2}, defaultRule) {
		t.Error("two full replicas: not saturated")
	}
	if poolSaturated([]*backend.Backend{full1, roomy, full2}, defaultRule) {
		t.Error("a replica with room: saturated")
	}
	if got := appendRoomy(nil, []*backend.Backend{full1, roomy, full2}, defaultRule); len(got) != 1 || got[0] != roomy {
		t.Errorf("appendRoomy = %v, want the roomy one", got)
	}
}

// TestQueueSeenOnceIsNoLimit: a replica whose last two scrapes showed a queue behind 8 running
// requests, and whose next scrape shows 8 running and none waiting, is not saturated at 8 in
// flight: it ran all of its limit with room to spare, so the limit grows (backend.nextLimit).
// A limit kept from long prompts filling its KV cache would hold short requests it can start,
// and flow control, holding requests at it, would keep it from ever showing more.
func TestQueueSeenOnceIsNoLimit(t *testing.T) {
	b := leased(t, 8)
	b.SetScrapedRequests(8, 2, 8)
	b.SetScrapedRequests(8, 2, 8)
	if v := viewOf(b); !v.saturated(&defaultRule) {
		t.Fatal("8 in flight with a queue behind them at two scrapes: want saturated")
	}
	b.SetScrapedRequests(8, 0, 8)
	if v := viewOf(b); v.saturated(&defaultRule) {
		t.Fatal("the last scrape shows no queue, yet 8 in flight reads as saturated: a limit was kept from the earlier one")
	}
}

// TestOneStepQueueIsNoLimit: a replica whose scrape caught a queue of 2 behind 6 running
// requests, with this proxy's 8 in flight there, is not saturated until a second scrape in a
// row shows a queue: vLLM V1 starts a request that arrived during a step at the next step (or
// a few later, behind a long prompt's prefill chunks), so a queue seen once is no sign that
// the next request would wait in the engine. Flow control holding on it delayed requests at
// light load by tens of milliseconds.
func TestOneStepQueueIsNoLimit(t *testing.T) {
	b := leased(t, 8)
	for i, sc := range []struct {
		running, waiting int64
		want             bool
	}{
		{6, 2, false}, // one scrape with a queue: may be one step's
		{7, 1, true},  // a second in a row: persistent, 7 is the limit and 8 are in flight
		{8, 0, true},  // none, 8 run: the limit 7 grows by one, and 8 are in flight
		{6, 2, true},  // a new queue, seen once: the limit is kept
		{8, 0, false}, // 8 run, none waiting: it grows to 9
	} {
		b.SetScrapedRequests(sc.running, sc.waiting, 8)
		v := viewOf(b)
		if got := v.saturated(&defaultRule); got != sc.want {
			t.Errorf("scrape %d (running %d, waiting %d; %d in flight): saturated = %v, want %v",
				i+1, sc.running, sc.waiting, b.Counted(), got, sc.want)
		}
	}
}

// leased is a replica with n of this proxy's requests in flight, released at the test's end.
func leased(t *testing.T, n int) *backend.Backend {
	t.Helper()
	b, err := backend.New("http://127.0.0.1:1", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	leases := make([]backend.Lease, n)
	for i := range leases {
		leases[i].Begin(b, 100, 100, true)
		t.Cleanup(leases[i].Release)
	}
	return b
}

// TestReserveKeepsOneReplica: for a lower band's request (the reserve rule on) while the pool
// was saturated lately (keep), a pool of two or more keeps its last replica whose queued
// prefill has drained for the higher band: no
// replica has room while at most one is drained, and all drained ones do once two are; a pool
// of one keeps none; not saturated lately, or with the rule off, every drained replica has room. untilDrained waits for
// the second drain when one replica is kept.
func TestReserveKeepsOneReplica(t *testing.T) {
	mk := func(prefillTokens int64) *backend.Backend {
		b, err := backend.New("http://127.0.0.1:1", 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		b.SetMaxConcurrency(64)
		if prefillTokens > 0 {
			var l backend.Lease
			l.Begin(b, prefillTokens, prefillTokens, false) // 10k tokens/s: nothing learned
			t.Cleanup(l.Release)
		}
		return b
	}
	const reserve = 5 * time.Millisecond
	clean := func() *backend.Backend { return mk(0) }
	busy := func(tokens int64) *backend.Backend { return mk(tokens) } // tokens/10 ms of prefill
	for _, tc := range []struct {
		name      string
		cands     []*backend.Backend
		reserve   time.Duration
		keep      bool
		wantRoomy int
		wantSat   bool
	}{
		{"one replica, drained: none kept", []*backend.Backend{clean()}, reserve, true, 1, false},
		{"two, one drained: kept for the higher band", []*backend.Backend{clean(), busy(5000)}, reserve, true, 0, true},
		{"two drained: both have room", []*backend.Backend{clean(), clean()}, reserve, true, 2, false},
		{"three, two drained", []*backend.Backend{busy(5000), clean(), clean()}, reserve, true, 2, false},
		{"three, one drained: kept", []*backend.Backend{busy(5000), clean(), busy(3000)}, reserve, true, 0, true},
		{"not saturated lately: the drained one has room", []*backend.Backend{clean(), busy(5000)}, reserve, false, 1, false},
		{"rule off: the drained one has room", []*backend.Backend{clean(), busy(5000)}, 0, true, 2, false},
	} {
		r := satRule{prefill: DefaultPrefillSaturation, reserve: tc.reserve, keep: tc.keep}
		if got := appendRoomy(nil, tc.cands, r); len(got) != tc.wantRoomy {
			t.Errorf("%s: %d replicas with room, want %d", tc.name, len(got), tc.wantRoomy)
		}
		if got := poolSaturated(tc.cands, r); got != tc.wantSat {
			t.Errorf("%s: pool saturated %v, want %v", tc.name, got, tc.wantSat)
		}
	}
	// Two replicas with 300 ms and 500 ms of prefill queued: one kept, so a lower band's
	// request waits for the second drain (about 495 ms), not the first.
	cfg := &FlowControl{PrefillSaturation: DefaultPrefillSaturation, ReservePrefill: reserve}
	d := untilDrained([]*backend.Backend{busy(3000), busy(5000)}, cfg, time.Now(), true)
	if d < 400*time.Millisecond || d > 500*time.Millisecond {
		t.Errorf("untilDrained %v, want the second replica's drain (about 495 ms)", d)
	}
	if d := untilDrained([]*backend.Backend{busy(3000), busy(5000)}, cfg, time.Now(), false); d < 200*time.Millisecond || d > 300*time.Millisecond {
		t.Errorf("nothing kept: untilDrained %v, want the first replica's drain (about 295 ms)", d)
	}
	if d := untilDrained([]*backend.Backend{busy(3000)}, cfg, time.Now(), true); d < 200*time.Millisecond || d > 300*time.Millisecond {
		t.Errorf("one replica: untilDrained %v, want its drain (about 295 ms)", d)
	}
}

// TestPoolKeepsWhileSaturatedLately: the reserve rule keeps a drained replica only within the
// queue's band memory after the pool was last found saturated; never before it was, nor with
// the memory off.
func TestPoolKeepsWhileSaturatedLately(t *testing.T) {
	for _, tc := range []struct {
		name   string
		memory time.Duration
		noted  bool
		after  time.Duration
		want   bool
	}{
		{"never saturated", 0, false, 0, false},
		{"saturated a second ago", 0, true, time.Second, true},
		{"saturated past the memory", 0, true, 11 * time.Second, false},
		{"a short memory", 2 * time.Second, true, 3 * time.Second, false},
		{"memory off", -1, true, 0, false},
	} {
		q, err := flowcontrol.New(flowcontrol.Config{BandMemory: tc.memory})
		if err != nil {
			t.Fatal(err)
		}
		pq := &poolQueue{name: poolAll, q: q}
		now := time.Now()
		if tc.noted {
			pq.noteSaturated(now)
		}
		if got := pq.keeps(now.Add(tc.after)); got != tc.want {
			t.Errorf("%s: keeps %v, want %v", tc.name, got, tc.want)
		}
	}
}
