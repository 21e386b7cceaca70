// Model time: the intervals of prefixlb that stand for a deployment's timing, on the bench's clock.

package bench

import (
	"fmt"
	"time"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
)

// Floors of the scaled intervals (ScaleInterval), in wall time.
const (
	// MinTimerInterval is 1 ms, the floor of an interval a Go timer paces (peering's flush):
	// on Linux a timer fires no sooner than ~1.1 ms however short (the netpoller waits whole
	// milliseconds; measured here for 50 µs to 1 ms timers), so a shorter interval gains
	// nothing, and polling instead would keep a core of the 2-core bench machine busy.
	MinTimerInterval = time.Millisecond
	// MinScrapeInterval is 25 ms, the floor of a metrics scrape's interval: one scrape of a
	// sim (HTTP GET of /metrics on 127.0.0.1, the text parsed) costs about 0.25 ms of CPU,
	// sim and scraper together (4 sims scraped every 5 ms for 3 s), so prefix×3's 3 routers ×
	// 4 replicas at 40 scrapes/s each take an eighth of a core from the sims they measure,
	// and shorter intervals more. The suite never reaches it (1 s ÷ 16 = 62.5 ms).
	MinScrapeInterval = 25 * time.Millisecond
)

// ScaleInterval is the wall time that d of model time lasts at speedup (model seconds per
// wall second): d ÷ speedup, but no shorter than floor, and d itself where d is already
// below floor. A speedup ≤ 0 leaves d as it is.
func ScaleInterval(d time.Duration, speedup float64, floor time.Duration) time.Duration {
	if speedup <= 0 || d <= 0 {
		return d
	}
	return max(time.Duration(float64(d)/speedup), min(d, floor))
}

// ModelTime is the wall-time value, in one bench run, of each prefixlb interval that stands
// for a deployment's timing: its production value (the --proxy-config's, else the package
// default) ÷ the run's speedup, floored (ScaleInterval). With external backends or a target
// the speedup is 1 and every interval is its production value.
//
// Scaled: the scrape of each replica's /metrics (health.Options.ScrapeInterval, production
// 1 s: the running + waiting requests, KV usage and the other senders' share that prefix
// mode, least-load and the peers read) and how old a scrape may be before it is ignored
// (ScrapeStaleAfter, 5 s); peering's flush (peering.DefaultFlushInterval, 1 ms, so at any
// speedup ≥ 1 the floor keeps it at 1 ms: a peered arm sees its peers' decisions up to 1 ms of
// wall time late, speedup × 1 ms of model time). Not scaled, because the sims never fail or
// restart and a bench arm starts every router with the sims: the active health checks and
// ejections, the model list's refresh, peering's membership, keepalives and rejoins, and the
// settle wait (a flush plus the loopback hop, wall-time mechanics). The prefix policy's
// decays count routing decisions (router.RecentHalfLife) or scrapes (health's senders), not
// seconds, so they follow the scaled clock by themselves.
type ModelTime struct {
	Speedup float64
}

// Health scales h's scrape intervals (a scrape turned off, 0, stays off). The stale age is
// kept at least the interval, as the config's validation requires.
func (m ModelTime) Health(h *health.Options) {
	if h.ScrapeInterval > 0 {
		h.ScrapeInterval = ScaleInterval(h.ScrapeInterval, m.Speedup, MinScrapeInterval)
	}
	if h.ScrapeStaleAfter > 0 {
		h.ScrapeStaleAfter = max(ScaleInterval(h.ScrapeStaleAfter, m.Speedup, MinScrapeInterval), h.ScrapeInterval)
	}
}

// Peering scales o's flush interval (0: peering.DefaultFlushInterval).
func (m ModelTime) Peering(o *peering.Options) {
	if o.FlushInterval <= 0 {
		o.FlushInterval = peering.DefaultFlushInterval
	}
	o.FlushInterval = ScaleInterval(o.FlushInterval, m.Speedup, MinTimerInterval)
}

// Tuning is the app.Tuning that puts an in-process prefixlb's intervals on the bench's clock;
// pol, when not nil, replaces the proxy's policy under label (a bench-only policy or the
// oracle, as app.StartPolicy would).
func (m ModelTime) Tuning(label string, pol router.Policy) app.Tuning {
	return app.Tuning{
		Proxy: func(o *proxy.Options) {
			m.Health(&o.Health)
			if pol != nil {
				o.Mode, o.Policy = label, pol
			}
		},
		Peering: m.Peering,
	}
}

// Note is the report's line on the intervals of a run at this speedup, from the default
// health options and the proxy's configured ones (h, after defaults).
func (m ModelTime) Note(h health.Options, peered bool) string {
	prod := h
	m.Health(&h)
	s := fmt.Sprintf("Load signals in model time at --speedup %g: each prefixlb scraped each replica's /metrics every %s of wall time (%s of model time, as in production) and ignored a scrape older than %s (%s)",
		m.Speedup, h.ScrapeInterval, prod.ScrapeInterval, h.ScrapeStaleAfter, prod.ScrapeStaleAfter)
	if prod.ScrapeInterval <= 0 {
		s = fmt.Sprintf("Load signals in model time at --speedup %g: scraping is off in the proxy config", m.Speedup)
	}
	if peered {
		var po peering.Options
		m.Peering(&po)
		s += fmt.Sprintf("; peered replicas flushed their updates every %s of wall time (%s of model time; production %s, floored at %s, a Go timer's resolution)",
			po.FlushInterval, time.Duration(float64(po.FlushInterval)*m.Speedup), peering.DefaultFlushInterval, MinTimerInterval)
	}
	return s + " (bench/README.md, Model time)."
}

// configuredHealth is the scrape intervals of base's health section, defaults filled in, as an
// in-process prefixlb of the bench gets them before ModelTime scales them.
func configuredHealth(base *configs.Config) health.Options {
	d, h := health.DefaultOptions(), base.Health
	o := health.Options{ScrapeInterval: h.ScrapeInterval.D(), ScrapeStaleAfter: h.ScrapeStaleAfter.D()}
	if o.ScrapeInterval == 0 {
		o.ScrapeInterval = d.ScrapeInterval
	}
	if o.ScrapeStaleAfter == 0 {
		o.ScrapeStaleAfter = d.ScrapeStaleAfter
	}
	if h.ScrapeDisabled {
		o.ScrapeInterval = 0
	}
	return o
}
