package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/oracle"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/peering"
)

func TestScaleInterval(t *testing.T) {
	for _, tc := range []struct {
		d       time.Duration
		speedup float64
		floor   time.Duration
		want    time.Duration
	}{
		{time.Second, 8, MinScrapeInterval, 125 * time.Millisecond},
		{time.Second, 16, MinScrapeInterval, 62500 * time.Microsecond},
		{time.Second, 2, MinScrapeInterval, 500 * time.Millisecond},
		{5 * time.Second, 8, MinScrapeInterval, 625 * time.Millisecond},
		{time.Second, 100, MinScrapeInterval, MinScrapeInterval},              // floored
		{time.Millisecond, 8, MinTimerInterval, time.Millisecond},             // floored
		{10 * time.Millisecond, 8, MinScrapeInterval, 10 * time.Millisecond},  // below the floor already: kept
		{10 * time.Millisecond, 0.5, MinTimerInterval, 20 * time.Millisecond}, // slower than real time
		{time.Second, 1, MinScrapeInterval, time.Second},
		{time.Second, 0, MinScrapeInterval, time.Second}, // no speedup: as given
		{0, 8, MinScrapeInterval, 0},                     // off stays off
	} {
		if got := ScaleInterval(tc.d, tc.speedup, tc.floor); got != tc.want {
			t.Errorf("ScaleInterval(%s, %g, %s) = %s, want %s", tc.d, tc.speedup, tc.floor, got, tc.want)
		}
	}
}

// TestModelTimeOptions: the health and peering options ModelTime gives are the production
// values ÷ the speedup, floored, with the stale age never below the interval and a scrape
// that is off left off.
func TestModelTimeOptions(t *testing.T) {
	h := health.DefaultOptions()
	ModelTime{8}.Health(&h)
	if h.ScrapeInterval != health.DefaultScrapeInterval/8 || h.ScrapeStaleAfter != health.DefaultScrapeStaleAfter/8 {
		t.Errorf("at 8×: scrape every %s, stale after %s; want %s, %s", h.ScrapeInterval, h.ScrapeStaleAfter, health.DefaultScrapeInterval/8, health.DefaultScrapeStaleAfter/8)
	}
	if d := health.DefaultOptions(); h.Interval != d.Interval || h.Timeout != d.Timeout || h.ModelsInterval != d.ModelsInterval {
		t.Errorf("active checks and model list changed: %+v", h)
	}
	h = health.Options{ScrapeInterval: 2 * time.Second, ScrapeStaleAfter: 2 * time.Second}
	ModelTime{1000}.Health(&h)
	if h.ScrapeInterval != MinScrapeInterval || h.ScrapeStaleAfter != MinScrapeInterval {
		t.Errorf("at 1000×: scrape every %s, stale after %s; want both %s", h.ScrapeInterval, h.ScrapeStaleAfter, MinScrapeInterval)
	}
	h = health.Options{ScrapeInterval: 0, ScrapeStaleAfter: 5 * time.Second}
	ModelTime{8}.Health(&h)
	if h.ScrapeInterval != 0 {
		t.Errorf("scraping off: interval %s, want 0", h.ScrapeInterval)
	}
	for _, tc := range []struct {
		speedup float64
		set     time.Duration
		want    time.Duration
	}{
		{8, 0, MinTimerInterval}, // 1 ms ÷ 8 is under a timer's resolution
		{0.5, 0, 2 * peering.DefaultFlushInterval},
		{4, 20 * time.Millisecond, 5 * time.Millisecond},
	} {
		o := peering.Options{FlushInterval: tc.set}
		ModelTime{tc.speedup}.Peering(&o)
		if o.FlushInterval != tc.want {
			t.Errorf("flush %s at %g×: %s, want %s", tc.set, tc.speedup, o.FlushInterval, tc.want)
		}
	}
}

// TestHarnessScrapesInModelTime: every in-process prefixlb the bench starts (a prefixlb mode,
// a bench-only peer policy, the oracle, peered replicas) scrapes its replicas at the
// production interval ÷ the run's speedup, as its running health checker reports it, also
// where that lies below the config's 100 ms minimum (16×) and from a --proxy-config's value.
func TestHarnessScrapesInModelTime(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Speedup = 16
	cluster, err := sim.StartCluster(cfg, 2, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	kv := int64(cfg.KVCacheTokens())
	check := func(name string, h health.Options, interval, stale time.Duration) {
		t.Helper()
		if h.ScrapeInterval != interval || h.ScrapeStaleAfter != stale {
			t.Errorf("%s: scrapes every %s, stale after %s; want %s, %s", name, h.ScrapeInterval, h.ScrapeStaleAfter, interval, stale)
		}
	}
	for _, speedup := range []float64{8, 16} {
		mt := ModelTime{speedup}
		for _, mode := range []string{"prefix", "least-load", "chwbl", oracle.Name} {
			sv, stop, err := startProxy(&configs.Config{}, mode, cluster.URLs(), kv, cluster, nil, mt)
			if err != nil {
				t.Fatalf("%s at %g×: %v", mode, speedup, err)
			}
			check(mode, sv.Health().Options(), time.Duration(float64(time.Second)/speedup), time.Duration(float64(5*time.Second)/speedup))
			if mode != oracle.Name && sv.Policy() == nil {
				t.Errorf("%s: no policy", mode)
			}
			stop()
		}
	}
	// A --proxy-config's own interval is the production value that is scaled.
	base := &configs.Config{}
	base.Health.ScrapeInterval = configs.Duration(2 * time.Second)
	base.Health.ScrapeStaleAfter = configs.Duration(8 * time.Second)
	sv, stop, err := startProxy(base, "prefix", cluster.URLs(), kv, cluster, nil, ModelTime{16})
	if err != nil {
		t.Fatal(err)
	}
	check("proxy config", sv.Health().Options(), 125*time.Millisecond, 500*time.Millisecond)
	stop()

	svs, _, stopAll, err := startPeeredProxies(&configs.Config{}, cluster.URLs(), kv, true, 2, ModelTime{16})
	if err != nil {
		t.Fatal(err)
	}
	for _, sv := range svs {
		check("peered", sv.Health().Options(), time.Second/16, 5*time.Second/16)
	}
	stopAll()
}

// TestModelTimeNote: the report's note gives the wall-time and production values.
func TestModelTimeNote(t *testing.T) {
	got := ModelTime{8}.Note(configuredHealth(&configs.Config{}), true)
	for _, w := range []string{"--speedup 8", "every 125ms of wall time (1s of model time", "older than 625ms (5s)", "flushed their updates every 1ms of wall time (8ms of model time"} {
		if !strings.Contains(got, w) {
			t.Errorf("note %q lacks %q", got, w)
		}
	}
	off := &configs.Config{}
	off.Health.ScrapeDisabled = true
	if got := (ModelTime{8}).Note(configuredHealth(off), false); !strings.Contains(got, "scraping is off") {
		t.Errorf("note with scraping off: %q", got)
	}
}
