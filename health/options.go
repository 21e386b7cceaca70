// Options: what a Checker does and its defaults.

package health

import "time"

// Options configures a Checker. Zero values take the defaults of DefaultOptions, except
// ScrapeInterval, where 0 turns scraping off, and Disabled.
type Options struct {
	// Path is the active-check path: "/health" (vLLM and SGLang both serve it; 200 once the
	// model is loaded).
	Path string
	// Interval is the time between active checks of one backend (5 s). Timeout bounds one
	// check, connect to end of headers (2 s). HAProxy checks every 2 s; vLLM's /health is
	// cheap, 5 s keeps a hundred prefixlb replicas from adding up to a load.
	Interval, Timeout time.Duration
	// Rise is how many consecutive passes mark an unhealthy backend healthy again (2; a backend
	// that never passed needs one, as Envoy's first check at start-up); Fall how many consecutive
	// failures mark it unhealthy (3). HAProxy's defaults; sglang PR #9198 settled on the same
	// after single results flapped.
	Rise, Fall int
	// Disabled turns active checks off: backends are healthy unless passively ejected.
	Disabled bool
	// ConsecutiveFailures is how many connect errors, header timeouts or 5xx responses in a
	// row eject a backend (5, Envoy's consecutive_5xx). 4xx and 429 never count. Negative
	// turns passive ejection off.
	ConsecutiveFailures int
	// BaseEjection × n is how long the n-th ejection of a backend lasts (30 s, Envoy's
	// base_ejection_time), capped at MaxEjection (300 s, Envoy's max_ejection_time).
	BaseEjection, MaxEjection time.Duration
	// MaxEjectedPercent caps passive ejection: a backend is not ejected when that would leave
	// more than this percentage of backends ejected or unhealthy (50; Envoy's default is 10%
	// but it always allows one host, which with 2–4 LLM replicas is the same or more).
	MaxEjectedPercent int
	// ScrapeInterval is the time between scrapes of MetricsPath (1 s: vLLM's gauges move with
	// every engine step, and routing on 10 s old load piles onto a replica, as sglang-router's
	// 10 s poll does). 0 turns scraping off.
	ScrapeInterval time.Duration
	// MetricsPath is the Prometheus text endpoint of the model server ("/metrics").
	MetricsPath string
	// ScrapeStaleAfter is how old the last successful scrape may be before Load reports it
	// not fresh (5 s).
	ScrapeStaleAfter time.Duration
	// ModelsInterval is the time between reads of a backend's ModelsPath (30 s; models.go):
	// the served models change only when the replica restarts or loads a LoRA adapter, and a
	// read also follows every return to healthy and every restart the scrape detects.
	// Negative turns model discovery off.
	ModelsInterval time.Duration
	// ModelsPath is the OpenAI model list of the model server ("/v1/models").
	ModelsPath string
}

// Defaults of Options left at zero (docs/configuration.md, "Health, ejection, metrics
// scraping, models"; the reasons are on the fields of Options).
const (
	// DefaultPath is the active-check path, served by vLLM and SGLang (200 once the model is loaded).
	DefaultPath = "/health"
	// DefaultInterval between active checks of one backend: 5 s.
	DefaultInterval = 5 * time.Second
	// DefaultTimeout bounds one active check or scrape, connect to end of headers: 2 s.
	DefaultTimeout = 2 * time.Second
	// DefaultRise is 2 consecutive passes to turn healthy again (HAProxy's rise).
	DefaultRise = 2
	// DefaultFall is 3 consecutive failures to turn unhealthy (HAProxy's fall).
	DefaultFall = 3
	// DefaultConsecutiveFailures is 5 counted failures in a row to eject (Envoy's consecutive_5xx).
	DefaultConsecutiveFailures = 5
	// DefaultBaseEjection is the first ejection's length, 30 s (Envoy's base_ejection_time).
	DefaultBaseEjection = 30 * time.Second
	// DefaultMaxEjection caps an ejection's length at 300 s (Envoy's max_ejection_time).
	DefaultMaxEjection = 300 * time.Second
	// DefaultMaxEjectedPercent: at most 50 % of the backends ejected or unhealthy.
	DefaultMaxEjectedPercent = 50
	// DefaultScrapeInterval between metrics scrapes of one backend: 1 s.
	DefaultScrapeInterval = time.Second
	// DefaultMetricsPath is the model server's Prometheus text endpoint.
	DefaultMetricsPath = "/metrics"
	// DefaultScrapeStaleAfter is how old a scrape may be before its load is not fresh: 5 s.
	DefaultScrapeStaleAfter = 5 * time.Second
	// DefaultModelsInterval between reads of a backend's model list: 30 s.
	DefaultModelsInterval = 30 * time.Second
	// DefaultModelsPath is the OpenAI model list, served by vLLM and SGLang.
	DefaultModelsPath = "/v1/models"
)

// DefaultOptions returns the defaults documented on Options.
func DefaultOptions() Options {
	return Options{
		Path:                DefaultPath,
		Interval:            DefaultInterval,
		Timeout:             DefaultTimeout,
		Rise:                DefaultRise,
		Fall:                DefaultFall,
		ConsecutiveFailures: DefaultConsecutiveFailures,
		BaseEjection:        DefaultBaseEjection,
		MaxEjection:         DefaultMaxEjection,
		MaxEjectedPercent:   DefaultMaxEjectedPercent,
		ScrapeInterval:      DefaultScrapeInterval,
		MetricsPath:         DefaultMetricsPath,
		ScrapeStaleAfter:    DefaultScrapeStaleAfter,
		ModelsInterval:      DefaultModelsInterval,
		ModelsPath:          DefaultModelsPath,
	}
}

// withDefaults returns o with every field left at zero (or below) set to its default, except
// ConsecutiveFailures and ModelsInterval (negative: off) and ScrapeInterval (0 or negative: off), and the
// ejection bounds made consistent.
func (o Options) withDefaults() Options {
	def := DefaultOptions()
	if o.Path == "" {
		o.Path = def.Path
	}
	if o.MetricsPath == "" {
		o.MetricsPath = def.MetricsPath
	}
	if o.ModelsPath == "" {
		o.ModelsPath = def.ModelsPath
	}
	if o.ModelsInterval == 0 {
		o.ModelsInterval = def.ModelsInterval
	}
	positiveOr(&o.Interval, def.Interval)
	positiveOr(&o.Timeout, def.Timeout)
	positiveOr(&o.Rise, def.Rise)
	positiveOr(&o.Fall, def.Fall)
	if o.ConsecutiveFailures == 0 {
		o.ConsecutiveFailures = def.ConsecutiveFailures
	}
	positiveOr(&o.BaseEjection, def.BaseEjection)
	positiveOr(&o.MaxEjection, def.MaxEjection)
	o.MaxEjection = max(o.MaxEjection, o.BaseEjection)
	positiveOr(&o.MaxEjectedPercent, def.MaxEjectedPercent)
	o.MaxEjectedPercent = min(o.MaxEjectedPercent, allPercent)
	o.ScrapeInterval = max(o.ScrapeInterval, 0)
	positiveOr(&o.ScrapeStaleAfter, def.ScrapeStaleAfter)
	return o
}

// allPercent is every backend, as a MaxEjectedPercent.
const allPercent = 100

// positiveOr sets *v to def unless *v is positive.
func positiveOr[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
