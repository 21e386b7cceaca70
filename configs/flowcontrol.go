package configs

import (
	"fmt"
	"time"

	"github.com/prefixlb/prefixlb/flowcontrol"
	"github.com/prefixlb/prefixlb/proxy"
)

// FlowControl holds requests at prefixlb when every replica of their model pool is
// saturated, and serves them by priority and fair share (package flowcontrol;
// docs/flow-control.md). Off by default. Reloadable: a reload changes the queues' bounds,
// band share, work cap and LIFO age in place (flowcontrol.Queue.Reconfigure with QueueConfig), and the
// wait, the priorities and the rules apply to the requests that arrive after it (a new
// Classifier); queued requests stay queued.
type FlowControl struct {
	// Enabled holds requests whose pool is saturated; off, every request is forwarded at once.
	Enabled bool `yaml:"enabled"`
	// MaxQueueWait is the longest a request waits queued (default
	// flowcontrol.DefaultMaxQueueWait, 30s); a shorter deadline of the client's wins.
	MaxQueueWait Duration `yaml:"max_queue_wait"`
	// MaxQueued bounds the queued requests of one pool (default flowcontrol.DefaultMaxItems).
	MaxQueued int `yaml:"max_queued"`
	// MaxQueuedBytes bounds the queued request bodies of one pool, bytes (default
	// flowcontrol.DefaultMaxBytes, 64 MiB, raised to max_request_body_bytes and lowered to
	// half of limits.max_buffered_body_bytes, the body budget it is part of).
	MaxQueuedBytes int64 `yaml:"max_queued_bytes"`
	// MinBandShare is the share of GPU work guaranteed to each backlogged lower priority
	// band, 0 to 0.5 (nil: flowcontrol.DefaultMinBandShare, 0.05; 0: strict bands).
	MinBandShare *float64 `yaml:"min_band_share"`
	// MaxRequestWork caps what one request is charged, token-equivalents (default
	// flowcontrol.DefaultMaxRequestWork).
	MaxRequestWork int64 `yaml:"max_request_work"`
	// DefaultPriority is the priority of a request no rule or trusted header sets; below 0
	// is sheddable.
	DefaultPriority int `yaml:"default_priority"`
	// Objectives maps an llm-d objective name (x-llm-d-inference-objective) to a priority.
	Objectives map[string]int `yaml:"objectives"`
	// Rules set priority and flow by API key hash, model and path; the first match wins.
	Rules []FlowRule `yaml:"rules"`
	// TrustedHeaders reads x-prefixlb-priority, x-prefixlb-flow, x-llm-d-inference-objective
	// and x-llm-d-inference-fairness-id; only behind a gateway that sets them.
	TrustedHeaders bool `yaml:"trusted_headers"`
	// LIFOAfter is how long a flow's oldest queued request waits before the flow is served
	// newest first (flowcontrol.Config.LIFOAfter; nil: flowcontrol.DefaultLIFOAfter, 1s; 0:
	// arrival order always).
	LIFOAfter *Duration `yaml:"lifo_after"`
	// BurstCredit is the work, token-equivalents, a flow that comes back to the backlog may
	// have served before the flows served while it was away (flowcontrol.Config.BurstCredit;
	// nil: flowcontrol.DefaultBurstCredit; 0: none, the virtual token counter's plain lift).
	BurstCredit *int64 `yaml:"burst_credit"`
	// PrefillSaturation is the queued prefill, in time at a replica's prefill rate, at which
	// the replica is saturated (nil: proxy.DefaultPrefillSaturation, 2s; 0: the rule off).
	PrefillSaturation *Duration `yaml:"prefill_saturation"`
	// ReservePrefill keeps room for a higher band: while one was served lately, a lower
	// band's request starts only on a replica whose queued prefill takes less (nil:
	// proxy.DefaultReservePrefill, 5ms; 0: the rule off).
	ReservePrefill *Duration `yaml:"reserve_prefill"`
}

// FlowRule is one rule of flow_control.rules (flowcontrol.Rule): its non-empty match
// fields must all match; it sets priority and/or flow.
type FlowRule struct {
	// APIKeySHA256 is the hex SHA-256 of the API key (prefixlb hash-key); never the key.
	APIKeySHA256 string `yaml:"api_key_sha256"`
	// Model matches the request's model exactly.
	Model string `yaml:"model"`
	// Path matches the URL path exactly.
	Path string `yaml:"path"`
	// Priority is the priority set (nil: not set by this rule).
	Priority *int `yaml:"priority"`
	// Flow is the flow set ("": not set).
	Flow string `yaml:"flow"`
}

// Bounds that validate enforces on the section.
const (
	// maxQueueWait bounds flow_control.max_queue_wait: a client held longer has given up.
	maxQueueWait = time.Hour
	// maxQueued bounds flow_control.max_queued per pool (a queued request holds its body and
	// a goroutine).
	maxQueued = 1 << 20
	// maxRequestWork bounds flow_control.max_request_work: far above any request (a
	// 10M-token prompt), far below overflowing the flows' int64 counters.
	maxRequestWork = 1 << 32
)

// applyDefaults fills the section; c's body limits must be defaulted already.
func (f *FlowControl) applyDefaults(c *Config) {
	setD(&f.MaxQueueWait, flowcontrol.DefaultMaxQueueWait)
	setI(&f.MaxQueued, flowcontrol.DefaultMaxItems)
	if f.MaxQueuedBytes == 0 {
		f.MaxQueuedBytes = min(max(flowcontrol.DefaultMaxBytes, int64(c.MaxRequestBodyBytes)), c.Limits.MaxBufferedBodyBytes/2)
	}
	if f.MinBandShare == nil {
		f.MinBandShare = new(float64(flowcontrol.DefaultMinBandShare))
	}
	if f.MaxRequestWork == 0 {
		f.MaxRequestWork = flowcontrol.DefaultMaxRequestWork
	}
	if f.LIFOAfter == nil {
		f.LIFOAfter = new(Duration(flowcontrol.DefaultLIFOAfter))
	}
	if f.BurstCredit == nil {
		f.BurstCredit = new(int64(flowcontrol.DefaultBurstCredit))
	}
	if f.PrefillSaturation == nil {
		f.PrefillSaturation = new(Duration(proxy.DefaultPrefillSaturation))
	}
	if f.ReservePrefill == nil {
		f.ReservePrefill = new(Duration(proxy.DefaultReservePrefill))
	}
}

// validate checks the section, on or off (a mistake is found before it is turned on),
// against c's body limits. No error quotes an api_key_sha256 value: it may be a key written
// there by mistake.
func (f *FlowControl) validate(c *Config) error {
	budget := c.Limits.MaxBufferedBodyBytes
	switch {
	case f.MaxQueueWait < 0 || f.MaxQueueWait.D() > maxQueueWait:
		return fmt.Errorf("flow_control.max_queue_wait: %s is outside 0..%s", f.MaxQueueWait.D(), maxQueueWait)
	case f.MaxQueued < 1 || f.MaxQueued > maxQueued:
		return fmt.Errorf("flow_control.max_queued: %d is outside 1..%d", f.MaxQueued, maxQueued)
	case f.MaxQueuedBytes > budget/2:
		// Queued bodies are part of the body budget; the other half stays for the bodies
		// being read and forwarded, so that a full queue never keeps a request of a higher
		// priority from being read (and taking a queued one's place).
		return fmt.Errorf("flow_control.max_queued_bytes: %d is over half of limits.max_buffered_body_bytes (%d / 2): queued bodies are part of that budget, and the rest must stay for the requests being read and forwarded",
			f.MaxQueuedBytes, budget)
	case f.MaxQueuedBytes < int64(c.MaxRequestBodyBytes):
		return fmt.Errorf("flow_control.max_queued_bytes: %d is below max_request_body_bytes (%d): a body of the maximum size could never be queued",
			f.MaxQueuedBytes, c.MaxRequestBodyBytes)
	case f.MinBandShare != nil && !(*f.MinBandShare >= 0 && *f.MinBandShare <= 0.5): // NaN fails both
		return fmt.Errorf("flow_control.min_band_share: %g is outside 0..0.5 (0: strict priority bands)", *f.MinBandShare)
	case f.MaxRequestWork < 1 || f.MaxRequestWork > maxRequestWork:
		return fmt.Errorf("flow_control.max_request_work: %d is outside 1..%d token-equivalents", f.MaxRequestWork, int64(maxRequestWork))
	case f.LIFOAfter != nil && (*f.LIFOAfter < 0 || f.LIFOAfter.D() > maxQueueWait):
		return fmt.Errorf("flow_control.lifo_after: %s is outside 0..%s (0: arrival order always)", f.LIFOAfter.D(), maxQueueWait)
	case f.BurstCredit != nil && (*f.BurstCredit < 0 || *f.BurstCredit > maxRequestWork):
		return fmt.Errorf("flow_control.burst_credit: %d is outside 0..%d token-equivalents (0: none)", *f.BurstCredit, int64(maxRequestWork))
	case f.PrefillSaturation != nil && (*f.PrefillSaturation < 0 || f.PrefillSaturation.D() > maxQueueWait):
		return fmt.Errorf("flow_control.prefill_saturation: %s is outside 0..%s (0: the rule off)", f.PrefillSaturation.D(), maxQueueWait)
	case f.ReservePrefill != nil && (*f.ReservePrefill < 0 || f.ReservePrefill.D() > maxQueueWait):
		return fmt.Errorf("flow_control.reserve_prefill: %s is outside 0..%s (0: the rule off)", f.ReservePrefill.D(), maxQueueWait)
	}
	if _, err := flowcontrol.NewClassifier(f.ClassifierConfig()); err != nil {
		return fmt.Errorf("flow_control.%w", err)
	}
	if _, err := flowcontrol.New(f.QueueConfig()); err != nil {
		return fmt.Errorf("flow_control: %w", err)
	}
	return nil
}

// QueueConfig is the queue's configuration of a defaulted section (one Queue per pool).
func (f *FlowControl) QueueConfig() flowcontrol.Config {
	share := flowcontrol.DefaultMinBandShare
	if f.MinBandShare != nil {
		share = *f.MinBandShare
	}
	if share == 0 {
		share = -1 // flowcontrol reads 0 as its default, negative as strict bands
	}
	return flowcontrol.Config{MaxItems: f.MaxQueued, MaxBytes: f.MaxQueuedBytes, MinBandShare: share, MaxRequestWork: f.MaxRequestWork,
		LIFOAfter: offNegative(f.LIFOAfter, flowcontrol.DefaultLIFOAfter), BurstCredit: offNegative(f.BurstCredit, int64(flowcontrol.DefaultBurstCredit))}
}

// PrefillSaturationOption is proxy.FlowControl.PrefillSaturation of a defaulted section:
// 0 (the rule off) becomes negative, which the proxy reads so.
func (f *FlowControl) PrefillSaturationOption() time.Duration {
	return offNegative(f.PrefillSaturation, proxy.DefaultPrefillSaturation)
}

// ReservePrefillOption is proxy.FlowControl.ReservePrefill of a defaulted section, 0 (the
// rule off) negative.
func (f *FlowControl) ReservePrefillOption() time.Duration {
	return offNegative(f.ReservePrefill, proxy.DefaultReservePrefill)
}

// offNegative is *v (def when nil), 0 turned into -1: the proxy and flowcontrol read 0 as
// their default and a negative value as off. For durations (time.Duration of a Duration)
// and counts (burst_credit).
func offNegative[V, R ~int64](v *V, def R) R {
	r := def
	if v != nil {
		r = R(*v)
	}
	if r == 0 {
		return -1
	}
	return r
}

// ClassifierConfig is the classifier's configuration of the section; build it with
// flowcontrol.NewClassifier (Validate has checked that it builds).
func (f *FlowControl) ClassifierConfig() flowcontrol.ClassifierConfig {
	cc := flowcontrol.ClassifierConfig{DefaultPriority: f.DefaultPriority, Objectives: f.Objectives, TrustedHeaders: f.TrustedHeaders}
	for _, r := range f.Rules {
		cc.Rules = append(cc.Rules, flowcontrol.Rule{APIKeySHA256: r.APIKeySHA256, Model: r.Model, Path: r.Path, Priority: r.Priority, Flow: r.Flow})
	}
	return cc
}
