package proxy

import (
	"testing"

	"github.com/prefixlb/prefixlb/backend"
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
		// A queue seen at an earlier scrape is no limit now: the last scrape showed none.
		{"no queue at the last scrape", replicaView{counted: 8, report: backend.HealthReport{Running: 8, CountedAtScrape: 8}}, false},
		{"configured lower than the queue's", replicaView{counted: 6, maxConcurrency: 6, report: backend.HealthReport{Running: 8, Waiting: 1, CountedAtScrape: 6}}, true},
		// The scrape showed 6 running and 2 waiting with 8 counted; counts are unchanged
		// since: still queued.
		{"queue at scrape, nothing ended", replicaView{counted: 8, report: backend.HealthReport{Running: 6, Waiting: 2, CountedAtScrape: 8}}, true},
		// Three of the counted requests ended since: the queue drained and a place is free.
		{"queue at scrape, drained since", replicaView{counted: 5, report: backend.HealthReport{Running: 6, Waiting: 2, CountedAtScrape: 8}}, false},
		{"queue at scrape below the configured limit", replicaView{counted: 4, maxConcurrency: 8, report: backend.HealthReport{Running: 4, Waiting: 1, CountedAtScrape: 5}}, true},
		{"KV full, nothing ended", replicaView{counted: 3, report: backend.HealthReport{KVUsage: 0.99, CountedAtScrape: 3}}, true},
		{"KV full, one ended since", replicaView{counted: 2, report: backend.HealthReport{KVUsage: 0.99, CountedAtScrape: 3}}, false},
		{"KV below the threshold", replicaView{counted: 3, report: backend.HealthReport{KVUsage: 0.97, CountedAtScrape: 3}}, false},
		{"KV full, idle", replicaView{report: backend.HealthReport{KVUsage: 1}}, false},
		{"KV full, other senders' requests", replicaView{report: backend.HealthReport{KVUsage: 1, Excess: 2}}, true},
	} {
		if got := tc.v.saturated(DefaultKVSaturation); got != tc.want {
			t.Errorf("%s: saturated = %v, want %v", tc.name, got, tc.want)
		}
	}
	if v := (replicaView{counted: 3, report: backend.HealthReport{KVUsage: 1, CountedAtScrape: 3}}); v.saturated(0) {
		t.Error("kvFull 0 must turn the KV rule off")
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
	if poolSaturated(nil, DefaultKVSaturation) {
		t.Error("an empty pool is saturated")
	}
	if !poolSaturated([]*backend.Backend{full1, full2}, DefaultKVSaturation) {
		t.Error("two full replicas: not saturated")
	}
	if poolSaturated([]*backend.Backend{full1, roomy, full2}, DefaultKVSaturation) {
		t.Error("a replica with room: saturated")
	}
	if got := appendRoomy(nil, []*backend.Backend{full1, roomy, full2}, DefaultKVSaturation); len(got) != 1 || got[0] != roomy {
		t.Errorf("appendRoomy = %v, want the roomy one", got)
	}
}

// TestQueueSeenOnceIsNoLimit: a replica whose scrape showed a queue behind 8 running requests,
// and whose next scrape shows none, is not saturated at 8 in flight: a queue seen once (long
// prompts filling its KV cache) is no limit for what it runs later, and flow control, which
// would hold requests at such a limit, would keep it from ever showing more.
func TestQueueSeenOnceIsNoLimit(t *testing.T) {
	b, err := backend.New("http://127.0.0.1:1", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	leases := make([]backend.Lease, 8)
	for i := range leases {
		leases[i].Begin(b, 100, 100, true)
		defer leases[i].Release()
	}
	b.SetScrapedRequests(8, 2, 8)
	if v := viewOf(b); !v.saturated(DefaultKVSaturation) {
		t.Fatal("8 in flight with a queue behind them at the scrape: want saturated")
	}
	b.SetScrapedRequests(8, 0, 8)
	if v := viewOf(b); v.saturated(DefaultKVSaturation) {
		t.Fatal("the last scrape shows no queue, yet 8 in flight reads as saturated: a limit was kept from the earlier one")
	}
}
