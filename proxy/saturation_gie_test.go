package proxy

import (
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/router"
)

// TestGIESaturated: GIE's saturation rule (SaturationGIE) at its boundaries, at its defaults
// (waiting > 5, KV usage > 0.8, metrics older than 200 ms; comparisons strict, as GIE's
// IsSaturated makes them) and tuned. What this proxy has in flight is not an input: GIE's
// detector reads only the scraped metrics.
func TestGIESaturated(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	at := func(age time.Duration) time.Time { return now.Add(-age) }
	def := GIESaturation{}.withDefaults()
	if def != (GIESaturation{QueueDepth: 5, KVCacheUtil: 0.8, MetricsStaleness: 200 * time.Millisecond}) {
		t.Fatalf("defaults %+v, want GIE's 5, 0.8, 200ms", def)
	}
	fresh := at(10 * time.Millisecond)
	for _, tc := range []struct {
		name string
		l    health.Load
		g    GIESaturation
		want bool
	}{
		{"idle, fresh", health.Load{At: fresh}, def, false},
		{"never scraped", health.Load{}, def, true},
		{"waiting 5: at the threshold, not above", health.Load{Waiting: 5, At: fresh}, def, false},
		{"waiting 6: above", health.Load{Waiting: 6, At: fresh}, def, true},
		{"running many, none waiting", health.Load{Running: 1000, At: fresh}, def, false},
		{"KV 0.8: at the threshold, not above", health.Load{KVCacheUsage: 0.8, At: fresh}, def, false},
		{"KV just above 0.8", health.Load{KVCacheUsage: 0.8001, At: fresh}, def, true},
		{"KV full", health.Load{KVCacheUsage: 1, At: fresh}, def, true},
		{"metrics 200 ms old: not older than the threshold", health.Load{At: at(200 * time.Millisecond)}, def, false},
		{"metrics 200 ms + 1 ns old: stale", health.Load{At: at(200*time.Millisecond + 1)}, def, true},
		{"stale and otherwise idle", health.Load{At: at(time.Second)}, def, true},
		{"tuned: queue depth 0, one waiting", health.Load{Waiting: 1, At: fresh}, GIESaturation{QueueDepth: 0}.withDefaults(), false},
		{"tuned: queue depth 1, two waiting", health.Load{Waiting: 2, At: fresh}, GIESaturation{QueueDepth: 1}.withDefaults(), true},
		{"tuned: KV 0.95, at 0.9", health.Load{KVCacheUsage: 0.9, At: fresh}, GIESaturation{KVCacheUtil: 0.95}.withDefaults(), false},
		{"tuned: staleness 50 ms (a bench's model time), 60 ms old", health.Load{At: at(60 * time.Millisecond)}, GIESaturation{MetricsStaleness: 50 * time.Millisecond}.withDefaults(), true},
	} {
		if got := gieSaturated(tc.l, now, tc.g); got != tc.want {
			t.Errorf("%s: saturated = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// New refuses a saturation rule it does not know, and GIE's rule without metrics scraping
// (every replica would stay saturated and every request expire).
func TestFlowControlSaturationValidated(t *testing.T) {
	for _, tc := range []struct {
		c      FlowControl
		scrape time.Duration
		want   string
	}{
		{FlowControl{}, 0, ""},
		{FlowControl{Saturation: SaturationPrefixLB}, 0, ""},
		{FlowControl{Saturation: SaturationGIE}, 50 * time.Millisecond, ""},
		{FlowControl{Saturation: SaturationGIE}, 0, "scraping is off"},
		{FlowControl{Saturation: "llm-d"}, time.Second, `"llm-d" is not`},
	} {
		err := tc.c.validate(tc.scrape)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q with scrape %s: err %v, want %q", tc.c.Saturation, tc.scrape, err, tc.want)
		}
	}
	if _, err := New(Options{Policy: &router.RoundRobin{}, FlowControl: FlowControl{Saturation: "bogus"}}); err == nil {
		t.Error("New accepted saturation rule bogus")
	}
}
