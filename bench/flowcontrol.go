// The flow-control arms: prefix mode with prefixlb's flow control, and an llm-d-style
// flow-control arm, judged beside the arms that forward every request at once.

package bench

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/bench/workload"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
)

// The flow-control arms of --modes (bench-only names; `prefixlb serve` turns flow control on
// with its config's flow_control section).
const (
	// PrefixFCArm is prefix mode with flow control as an operator would configure it
	// (flowControlConfig): prefixlb's saturation rule, each replica's max_concurrency set to
	// its max_num_seqs, VTC fairness, the default 5% band share.
	PrefixFCArm = "prefix+fc"
	// LLMDFCArm is llm-d's router with its flow control at the defaults llm-d documents
	// (llm-d.ai/docs/dev/architecture/router/flow-control; gateway-api-inference-extension
	// pkg/epp/flowcontrol and pkg/epp/saturationdetector, release-1.2/1.3): strict priority
	// bands (min_band_share 0), round-robin between the flows of a band
	// (flowcontrol.FairnessRoundRobin), first come first served within a flow, and GIE's
	// saturation detector (proxy.SaturationGIE: a replica is saturated with more than 5
	// waiting, KV usage above 0.8 or metrics older than 200 ms; the pool when all are),
	// reading metrics refreshed every 50 ms (GIE's refresh interval). Placement is the llm-d
	// arm's policy (bench/peers, llm-d's optimized baseline).
	LLMDFCArm = "llm-d-fc"
)

// FlowControlArms are the flow-control arms, in the order --modes lists them.
var FlowControlArms = []string{PrefixFCArm, LLMDFCArm}

// fcArmMode is the mode (a prefixlb mode or a bench peer) an arm places requests with, and
// whether the arm is a flow-control arm.
func fcArmMode(arm string) (mode string, fc bool) {
	switch arm {
	case PrefixFCArm:
		return router.DefaultMode, true
	case LLMDFCArm:
		return "llm-d", true
	}
	return arm, false
}

// GIE's intervals in model time (gateway-api-inference-extension): the endpoint picker
// refreshes each pod's metrics every 50 ms (--refresh-metrics-interval) and its saturation
// detector treats metrics older than 200 ms as no capacity
// (saturationdetector DefaultMetricsStalenessThreshold).
const (
	gieRefreshInterval   = 50 * time.Millisecond
	gieMetricsStaleness  = proxy.DefaultGIEMetricsStaleness
	gieStalenessPerFresh = gieMetricsStaleness / gieRefreshInterval // 4 refreshes
	// noQueueTTL is the llm-d-fc arm's queue wait: longer than any client's patience.
	noQueueTTL = time.Hour
)

// gieIntervals are the llm-d-fc arm's scrape interval and staleness bound in wall time at
// the run's speedup: 50 ms and 200 ms of model time, the scrape floored at MinScrapeInterval
// and the bound kept at least 4 scrapes (GIE's ratio), so that a floored scrape is never
// judged stale between two refreshes.
func (m ModelTime) gieIntervals() (scrape, stale time.Duration) {
	scrape = ScaleInterval(gieRefreshInterval, m.Speedup, MinScrapeInterval)
	stale = max(ScaleInterval(gieMetricsStaleness, m.Speedup, MinTimerInterval), time.Duration(gieStalenessPerFresh)*scrape)
	return scrape, stale
}

// flowControlConfig turns cfg (its backends set) into arm's: flow control on; the tenants
// told apart by rules on their API keys (the SHA-256 the config holds, never the key)
// giving each key its tenant's priority (chat and noisy 1, batch 0; light and heavy 1), as
// the overload workload's headers say; trusted_headers on, because the bench plays the
// gateway that sets x-prefixlb-flow (the flow is the tenant's fairness ID; a rule's
// priority wins over the headers either way). prefix+fc sets each simulated replica's
// max_concurrency to maxNumSeqs (the sims' --max-num-seqs, as an operator sets it to
// vLLM's; 0 with external backends: not set, learned from their metrics); llm-d-fc sets
// strict bands (min_band_share 0).
func flowControlConfig(cfg *configs.Config, arm string, tenants []*workload.Tenant, maxNumSeqs int) {
	f := &cfg.FlowControl
	f.Enabled, f.TrustedHeaders = true, true
	f.Rules = nil
	for _, t := range tenants {
		sum := sha256.Sum256([]byte(t.APIKey))
		prio := t.Priority
		f.Rules = append(f.Rules, configs.FlowRule{APIKeySHA256: hex.EncodeToString(sum[:]), Priority: &prio})
	}
	switch arm {
	case PrefixFCArm:
		for i := range cfg.Backends {
			cfg.Backends[i].MaxConcurrency = int64(maxNumSeqs)
		}
	case LLMDFCArm:
		f.MinBandShare = new(float64) // 0: strict bands
	}
}

// fcTuning adds to t what an arm sets beyond its config: for llm-d-fc, round-robin between
// flows, GIE's saturation rule with its staleness bound, and the scrape interval of GIE's
// metrics refresh, both on the run's clock (gieIntervals).
func fcTuning(arm string, mt ModelTime, t app.Tuning) app.Tuning {
	if _, fc := fcArmMode(arm); !fc {
		return t
	}
	inner := t.Proxy
	t.Proxy = func(o *proxy.Options) {
		if inner != nil {
			inner(o)
		}
		if arm == PrefixFCArm {
			// max_queue_wait stands for a deployment's timing: 30 s of model time.
			o.FlowControl.MaxQueueWait = ScaleInterval(cmp.Or(o.FlowControl.MaxQueueWait, proxy.DefaultMaxQueueWait), mt.Speedup, MinTimerInterval)
			// So does the prefill-backlog bound: 2 s of the sims' model-time prefill.
			o.FlowControl.PrefillSaturation = ScaleInterval(cmp.Or(o.FlowControl.PrefillSaturation, proxy.DefaultPrefillSaturation), mt.Speedup, MinTimerInterval)
			// And the age at which a flow turns newest-first: 1 s of model time.
			o.FlowControl.Queue.LIFOAfter = ScaleInterval(cmp.Or(o.FlowControl.Queue.LIFOAfter, flowcontrol.DefaultLIFOAfter), mt.Speedup, MinTimerInterval)
			// And the reserve rule's bound (5 ms) and its memory of a band or flow (10 s).
			o.FlowControl.ReservePrefill = ScaleInterval(cmp.Or(o.FlowControl.ReservePrefill, proxy.DefaultReservePrefill), mt.Speedup, MinTimerInterval)
			o.FlowControl.Queue.BandMemory = ScaleInterval(cmp.Or(o.FlowControl.Queue.BandMemory, flowcontrol.DefaultBandMemory), mt.Speedup, MinTimerInterval)
			return
		}
		// GIE's flow controller applies no queue TTL by default (controller.Config's
		// DefaultRequestTTL 0: "rely solely on request context cancellation"): a queued
		// request waits until its client gives up.
		o.FlowControl.MaxQueueWait = noQueueTTL
		scrape, stale := mt.gieIntervals()
		o.Health.ScrapeInterval = scrape
		o.Health.ScrapeStaleAfter = max(o.Health.ScrapeStaleAfter, stale)
		o.FlowControl.Queue.Fairness = flowcontrol.FairnessRoundRobin
		o.FlowControl.Queue.LIFOAfter = -1 // FCFS within a flow, always
		o.FlowControl.ReservePrefill = -1  // GIE has no reserve for higher bands
		o.FlowControl.Saturation = proxy.SaturationGIE
		o.FlowControl.GIE = proxy.GIESaturation{MetricsStaleness: stale}
	}
	return t
}

// fcNote describes the flow-control arms among modes for the report (nothing when none).
func fcNote(modes []string, tenants []*workload.Tenant, mt ModelTime, maxNumSeqs int, external bool) string {
	var parts []string
	for _, m := range modes {
		switch m {
		case PrefixFCArm:
			mc := fmt.Sprintf("each replica's max_concurrency %d (the sims' max_num_seqs)", maxNumSeqs)
			if external {
				mc = "max_concurrency not set (external replicas: learned from their metrics)"
			}
			parts = append(parts, fmt.Sprintf("%s: prefix mode with flow_control on at its defaults (VTC fairness, min_band_share 0.05, prefixlb's saturation rule with a prefill backlog of 2 s of model time: %s of wall time, max_queue_wait 30 s of model time: %s), %s", m, ScaleInterval(proxy.DefaultPrefillSaturation, mt.Speedup, MinTimerInterval), ScaleInterval(proxy.DefaultMaxQueueWait, mt.Speedup, MinTimerInterval), mc))
		case LLMDFCArm:
			scrape, stale := mt.gieIntervals()
			parts = append(parts, fmt.Sprintf("%s: the llm-d arm's placement with llm-d's flow-control defaults: strict bands (min_band_share 0), round-robin between flows, FCFS within a flow, GIE's saturation detector (waiting > 5, KV usage > 0.8, metrics older than %s of wall time: 200 ms of model time, at least 4 scrapes) on metrics scraped every %s of wall time (GIE's 50 ms refresh; floored at %s), no queue TTL (GIE's default: a queued request waits until its client gives up)", m, stale, scrape, MinScrapeInterval))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	who := "no tenants (every request priority 0, one flow per API key)"
	if len(tenants) > 0 {
		var ts []string
		for _, t := range tenants {
			ts = append(ts, fmt.Sprintf("%s %d", t.Name, t.Priority))
		}
		who = "a rule per tenant's API key (its SHA-256) giving its priority (" + strings.Join(ts, ", ") + "), the flow from x-prefixlb-flow (trusted_headers on: the bench plays the gateway that sets it)"
	}
	return "Flow-control arms, classified by " + who + ". " + strings.Join(parts, "; ") + " (bench/README.md, Flow-control arms)."
}
