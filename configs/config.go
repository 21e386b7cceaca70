// Package configs holds prefixlb's configuration: the YAML schema, defaults applied in one
// place (ApplyDefaults), and validation whose errors name the field (Validate).
//
// The defaults of a library's options are the library's own (health.DefaultOptions,
// router.DefaultLoadFactor, router.DefaultMode, index.DefaultKVCacheTokens,
// key.DefaultChunkTokens, discovery.DefaultInterval, backend.DefaultWeight, the proxy's
// timeouts and body limits); ApplyDefaults writes them into the Config, so that a parsed
// Config shows every value in force. Only the application's own settings (listeners,
// logging, shutdown grace, response headers) have their defaults here. The modes are
// router's table (router.ModeNames).
package configs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/discovery"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// Config is the whole configuration file. Every field is documented in configs/prefixlb.yaml.
type Config struct {
	// Listen is the data listener (OpenAI-compatible API), host:port.
	Listen string `yaml:"listen"`
	// AdminListen is the metrics/health/debug listener; loopback by default.
	AdminListen string `yaml:"admin_listen"`
	// Mode is the routing policy: prefix | round-robin | least-load.
	Mode string `yaml:"mode"`
	// Shadow runs a second policy beside the mode's on every request, only to report what it
	// would have chosen (router.Shadow): "prefix" with mode round-robin or least-load; "": off.
	Shadow string `yaml:"shadow"`
	// MaxRequestBodyBytes caps a request body (bytes); larger bodies get 413.
	MaxRequestBodyBytes int `yaml:"max_request_body_bytes"`
	// ResponseHeaders chooses the headers prefixlb adds to responses.
	ResponseHeaders ResponseHeaders `yaml:"response_headers"`
	// Limits bound what all requests together may hold.
	Limits Limits `yaml:"limits"`
	// Log configures logging.
	Log Log `yaml:"log"`
	// Timeouts are the proxy's timeouts.
	Timeouts Timeouts `yaml:"timeouts"`
	// Prefix tunes mode prefix.
	Prefix Prefix `yaml:"prefix"`
	// Health configures active checks, passive ejection and model-server metrics scraping.
	Health Health `yaml:"health"`
	// Backends are the model-server replicas.
	Backends []Backend `yaml:"backends"`
	// Discovery adds backends found at runtime (besides Backends).
	Discovery Discovery `yaml:"discovery"`
	// Peering makes several prefixlb replicas route as one (nil: off; configs/peering.go).
	Peering *Peering `yaml:"peering"`
	// Tracing exports OpenTelemetry spans of requests (configs/tracing.go; off by default).
	Tracing Tracing `yaml:"tracing"`
	// FlowControl holds requests while their pool is saturated (configs/flowcontrol.go; off
	// by default).
	FlowControl FlowControl `yaml:"flow_control"`
}

// ResponseHeaders chooses the headers prefixlb adds to each response. x-prefixlb-route (the
// routing reason and matched chunks) is always added.
type ResponseHeaders struct {
	// Backend adds x-prefixlb-backend: the URL of the replica that served the request (nil:
	// the default, true). Off, the header is absent, also when a backend sent one.
	Backend *bool `yaml:"backend"`
}

// BackendOn reports whether x-prefixlb-backend is added (Backend, true when unset).
func (r ResponseHeaders) BackendOn() bool { return r.Backend == nil || *r.Backend }

// Discovery configures dynamic backends.
type Discovery struct {
	// DNS follows a Kubernetes headless Service.
	DNS *DNSDiscovery `yaml:"dns"`
}

// DNSDiscovery resolves a headless Service's name into backends on an interval.
type DNSDiscovery struct {
	// Name is the DNS name, e.g. vllm.default.svc.cluster.local (or _http._tcp.vllm… with srv).
	Name string `yaml:"name"`
	// Port is the backends' port with A/AAAA records.
	Port int `yaml:"port"`
	// SRV uses SRV records (target and port) instead of A/AAAA.
	SRV bool `yaml:"srv"`
	// Scheme is http or https.
	Scheme string `yaml:"scheme"`
	// Interval between resolutions (default discovery.DefaultInterval, 10s).
	Interval Duration `yaml:"interval"`
	// KVCacheTokens is each discovered backend's KV capacity in tokens (0: prefix.default_kv_cache_tokens).
	KVCacheTokens int64 `yaml:"kv_cache_tokens"`
}

// Limits bound the memory that requests in flight hold together.
type Limits struct {
	// MaxBufferedBodyBytes caps the request-body bytes buffered at once over all requests
	// (bytes), charged as they arrive: a body whose next buffer growth does not fit gets 503.
	// At least twice max_request_body_bytes.
	MaxBufferedBodyBytes int64 `yaml:"max_buffered_body_bytes"`
}

// Log configures zap.
type Log struct {
	// Level: debug | info | warn | error.
	Level string `yaml:"level"`
	// Format: json | console.
	Format string `yaml:"format"`
}

// Timeouts of the proxy. Zero means the default; there is no total timeout on a stream.
type Timeouts struct {
	// Connect bounds dialling a backend.
	Connect Duration `yaml:"connect"`
	// ResponseHeader bounds the wait for the backend's response headers (queueing + prefill
	// of a non-streamed or header-late response; long, prefill of 100k tokens under load can
	// take minutes).
	ResponseHeader Duration `yaml:"response_header"`
	// Idle bounds the silence between two chunks of a response body.
	Idle Duration `yaml:"idle"`
	// ShutdownGrace is how long in-flight streams may finish after SIGTERM/SIGINT.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// ClientRead bounds reading one client request, headers and body (slow or stalled clients).
	ClientRead Duration `yaml:"client_read"`
	// ClientWrite bounds how long a client may leave the response unread: a write to it that
	// makes no progress for this long closes the client and the backend connection (the
	// backend's in-flight slot is freed). Not a total timeout: a stream read steadily never hits it.
	ClientWrite Duration `yaml:"client_write"`
	// ClientBodyIdle bounds the silence between two reads of a request body: a client that
	// stalls mid-body gives its share of limits.max_buffered_body_bytes back after this.
	ClientBodyIdle Duration `yaml:"client_body_idle"`
}

// Prefix tunes the prefix-aware policy.
type Prefix struct {
	// ChunkTokens is the chunk size in approximate tokens (1 token ≈ 4 bytes).
	ChunkTokens int `yaml:"chunk_tokens"`
	// LoadFactor is c in the bounded-load cap ceil(c × (total in-flight + 1) / n).
	LoadFactor float64 `yaml:"load_factor"`
	// LoadMargin is an absolute number of requests added to the cap so low load does not
	// flap. Left out: router.DefaultLoadMargin (2); 0: no margin.
	LoadMargin OptionalInt `yaml:"load_margin"`
	// HardLoadFactor is the factor of the hard cap ceil(h × (total in-flight + 1) / n) +
	// margin, up to which a backend over the cap still takes a request that the cost model
	// estimates it fastest for. Left out: router.DefaultHardLoadFactor (2.5); equal to
	// load_factor: the cap alone.
	HardLoadFactor float64 `yaml:"hard_load_factor"`
	// TieMarginPercent is how close, in percent of the least, a backend's estimated TTFT must
	// be to count as a near-tie, which the consistent-hash ring breaks so that prefixlb
	// replicas agree where a new prefix lives. Left out: 50 (router.DefaultTieMargin); 0:
	// exact ties only.
	TieMarginPercent OptionalInt `yaml:"tie_margin_percent"`
	// TieBreak is how near-ties holding the same prefix are broken: "ring" (the
	// consistent-hash ring alone, so unpeered replicas agree), "load" (the least loaded first,
	// the ring among equals: by in-flight requests, and with peering on by the fleet's recent
	// routed share first; for peered replicas or one alone) or "auto" (left out:
	// "load" with peering on; without, "load" while this replica is its backends' only
	// sender and "ring" as soon as another sends to them, see router.TieBreakAuto;
	// Config.PrefixOptions resolves it).
	TieBreak string `yaml:"tie_break"`
	// SpreadNewPrefixes spreads new prefixes among near-ties that go by load (see
	// router.PrefixOptions.NoSpreadNewPrefixes): a thin match counts as none there on a
	// replica above its share, and a replica alone under tie_break auto, or peered replicas
	// under load (counting one another's decisions), send a new prefix to the near-tie routed
	// the least prefill work lately. Left out: true.
	SpreadNewPrefixes OptionalBool `yaml:"spread_new_prefixes"`
	// DefaultKVCacheTokens is a backend's KV capacity in tokens when backends[i].kv_cache_tokens is unset.
	DefaultKVCacheTokens int64 `yaml:"default_kv_cache_tokens"`
	// MaxIndexEntries caps the prefix index's entries over all backends.
	MaxIndexEntries int `yaml:"max_index_entries"`
}

// Health configures the health package. Durations and counts left at zero take the defaults
// documented in configs/prefixlb.yaml (HAProxy's rise/fall, Envoy's outlier detection).
type Health struct {
	// Disabled turns active checks off: backends are healthy unless passively ejected.
	Disabled bool `yaml:"disabled"`
	// Path is the active-check path.
	Path string `yaml:"path"`
	// Interval between checks of one backend; Timeout bounds one check (unset: the default,
	// or the interval when that is shorter).
	Interval Duration `yaml:"interval"`
	Timeout  Duration `yaml:"timeout"`
	// HealthyThreshold consecutive passes mark a backend healthy; UnhealthyThreshold failures unhealthy.
	HealthyThreshold   int `yaml:"healthy_threshold"`
	UnhealthyThreshold int `yaml:"unhealthy_threshold"`
	// ConsecutiveFailures connect errors, header timeouts or 5xx in a row eject a backend
	// (-1: no passive ejection).
	ConsecutiveFailures int `yaml:"consecutive_failures"`
	// BaseEjection × n is the n-th ejection's length, capped at MaxEjection.
	BaseEjection Duration `yaml:"base_ejection"`
	MaxEjection  Duration `yaml:"max_ejection"`
	// MaxEjectedPercent: never eject more than this share of the backends.
	MaxEjectedPercent int `yaml:"max_ejected_percent"`
	// ScrapeDisabled turns model-server metrics scraping off.
	ScrapeDisabled bool `yaml:"scrape_disabled"`
	// ScrapeInterval between scrapes of MetricsPath; a scrape older than ScrapeStaleAfter is ignored.
	ScrapeInterval   Duration `yaml:"scrape_interval"`
	MetricsPath      string   `yaml:"metrics_path"`
	ScrapeStaleAfter Duration `yaml:"scrape_stale_after"`
	// ModelsDisabled turns model discovery off (backends without models serve any model).
	ModelsDisabled bool `yaml:"models_disabled"`
	// ModelsInterval between reads of ModelsPath, each backend's OpenAI model list.
	ModelsInterval Duration `yaml:"models_interval"`
	ModelsPath     string   `yaml:"models_path"`
}

// Backend is one replica in the static list.
type Backend struct {
	// URL is http(s)://host:port of an OpenAI-compatible server.
	URL string `yaml:"url"`
	// KVCacheTokens is the replica's KV-cache capacity in tokens (optional).
	KVCacheTokens int64 `yaml:"kv_cache_tokens"`
	// Weight scales the replica's share of cold prefixes (default 1).
	Weight int `yaml:"weight"`
	// Models are the model names (LoRA adapters included) the replica serves; they win over
	// its /v1/models. Empty: discovered.
	Models []string `yaml:"models"`
	// MaxConcurrency is the requests the replica runs at once (vLLM --max-num-seqs): flow
	// control takes it as saturated there (docs/flow-control.md). 0: only a queue in its last
	// scrape says so.
	MaxConcurrency int64 `yaml:"max_concurrency"`
}

// maxLoadFactor bounds prefix.load_factor and hard_load_factor: a cap 100 times the mean
// is no cap; past that (and at infinity, where ceil(c × n) overflows int64) the policy would
// read every backend as over its cap.
const maxLoadFactor = 100

// maxTieMarginPercent bounds prefix.tie_margin_percent: a near-tie 100% slower than the best
// is not a tie, and the ring would override the load.
const maxTieMarginPercent = 100

// OptionalInt is an integer field whose zero is a meaningful value (prefix.load_margin: 0 is
// no margin), so that a 0 written in the file is told apart from a field left out: Set
// records that the file, or ApplyDefaults, gave the field its value V. In YAML it is a plain
// integer; a null leaves it unset.
type OptionalInt struct {
	V   int
	Set bool
}

// UnmarshalYAML reads an integer and marks the field set.
func (o *OptionalInt) UnmarshalYAML(n *yaml.Node) error {
	var v int
	if err := n.Decode(&v); err != nil {
		return err
	}
	*o = OptionalInt{V: v, Set: true}
	return nil
}

// MarshalYAML writes the integer, or null when unset (which reads back as unset).
func (o OptionalInt) MarshalYAML() (any, error) {
	if !o.Set {
		return nil, nil
	}
	return o.V, nil
}

// orDefault sets o to def when the file left it out.
func (o *OptionalInt) orDefault(def int) {
	if !o.Set {
		*o = OptionalInt{V: def, Set: true}
	}
}

// OptionalBool is a boolean field whose default is true (prefix.spread_new_prefixes), so that
// a false written in the file is told apart from a field left out, as OptionalInt; the struct
// stays comparable (a reload compares the prefix section with ==).
type OptionalBool struct {
	V   bool
	Set bool
}

// UnmarshalYAML reads a boolean and marks the field set.
func (o *OptionalBool) UnmarshalYAML(n *yaml.Node) error {
	var v bool
	if err := n.Decode(&v); err != nil {
		return err
	}
	*o = OptionalBool{V: v, Set: true}
	return nil
}

// MarshalYAML writes the boolean, or null when unset (which reads back as unset).
func (o OptionalBool) MarshalYAML() (any, error) {
	if !o.Set {
		return nil, nil
	}
	return o.V, nil
}

// orDefault sets o to def when the file left it out.
func (o *OptionalBool) orDefault(def bool) {
	if !o.Set {
		*o = OptionalBool{V: def, Set: true}
	}
}

// Duration is a time.Duration written as "5s", "10m" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (want e.g. 500ms, 5s, 10m): %v", n.Line, s, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Defaults of the application's own settings. Each names its source. The other defaults
// belong to the packages that use them (see the package comment).
const (
	// DefaultListen is the data listener: every interface, port 8080.
	DefaultListen = "0.0.0.0:8080"
	// DefaultAdminListen is loopback only, so that the debug endpoints are not exposed
	// (docs/operating.md, "Admin endpoints").
	DefaultAdminListen = "127.0.0.1:9090"
	// DefaultMode is the first of router's table: the prefix-aware policy.
	DefaultMode = router.DefaultMode
	// DefaultLogLevel logs one line per request and every change of state, never prompts.
	DefaultLogLevel = "info"
	// DefaultLogFormat is one JSON object a line, for log collectors.
	DefaultLogFormat = "json"
	// DefaultShutdownGrace matches Kubernetes' default terminationGracePeriodSeconds.
	DefaultShutdownGrace = 30 * time.Second
	// DefaultResponseHeaderBackend: x-prefixlb-backend is on, for debugging routing from the
	// client side.
	DefaultResponseHeaderBackend = true
)

// Bounds that Validate enforces.
const (
	// minRequestBodyBytes: 1 KiB, the smallest body limit accepted.
	minRequestBodyBytes = 1 << 10
	// maxRequestBodyBytes: 4 GiB, the largest body limit accepted; far above any LLM request
	// (a million-token prompt is about 4 MB of JSON, an image a few MB of base64), and low
	// enough that twice it (limits.max_buffered_body_bytes' floor) and the body buffer's
	// growth arithmetic stay far from overflowing.
	maxRequestBodyBytes int64 = 4 << 30
	// maxChunkTokens is the largest chunk size accepted, in approximate tokens.
	maxChunkTokens = 4096
	// minInterval bounds health checks, scrapes and DNS resolutions from below, so that a
	// typo (1ms) does not flood the replicas or the resolver.
	minInterval = 100 * time.Millisecond
	// maxThreshold bounds health.healthy_threshold and health.unhealthy_threshold.
	maxThreshold = 100
	// maxWeight bounds backends[].weight.
	maxWeight = 1000
	// maxPort is the largest TCP port.
	maxPort = 65535
)

// logLevels and logFormats are the values log.level and log.format accept.
var (
	logLevels  = []string{"debug", "info", "warn", "error"}
	logFormats = []string{"json", "console"}
)

// Parse parses YAML, applies defaults and validates. Unknown fields are errors.
func Parse(data []byte) (*Config, error) {
	c, err := ParseRaw(data)
	if err != nil {
		return nil, err
	}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// ParseRaw parses YAML without defaults or validation, for callers that override fields
// (command-line flags) before ApplyDefaults and Validate. Unknown fields are errors. A
// decoding error is one line naming the field's path and line (decodeError).
func ParseRaw(data []byte) (*Config, error) {
	c := &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, decodeError(data, err)
	}
	if err := walkError(data); err != nil {
		return nil, err
	}
	return c, nil
}

// ApplyDefaults fills every field left out with its default. It is the one place the
// Config's defaults are applied; the numbers are those of the packages that use them.
func (c *Config) ApplyDefaults() {
	setS(&c.Listen, DefaultListen)
	setS(&c.AdminListen, DefaultAdminListen)
	setS(&c.Mode, DefaultMode)
	if c.ResponseHeaders.Backend == nil {
		on := DefaultResponseHeaderBackend
		c.ResponseHeaders.Backend = &on
	}
	setS(&c.Log.Level, DefaultLogLevel)
	setS(&c.Log.Format, DefaultLogFormat)
	setI(&c.MaxRequestBodyBytes, proxy.DefaultMaxRequestBodyBytes)
	t := &c.Timeouts
	setD(&t.Connect, proxy.DefaultConnectTimeout)
	setD(&t.ResponseHeader, proxy.DefaultResponseHeaderTimeout)
	setD(&t.Idle, proxy.DefaultIdleTimeout)
	setD(&t.ShutdownGrace, DefaultShutdownGrace)
	setD(&t.ClientRead, proxy.DefaultClientReadTimeout)
	setD(&t.ClientWrite, proxy.DefaultClientWriteTimeout)
	setD(&t.ClientBodyIdle, proxy.DefaultClientBodyIdleTimeout)
	if c.Limits.MaxBufferedBodyBytes == 0 {
		c.Limits.MaxBufferedBodyBytes = proxy.DefaultMaxBufferedBodyBytes
	}
	p := &c.Prefix
	setI(&p.ChunkTokens, key.DefaultChunkTokens)
	if p.LoadFactor == 0 {
		p.LoadFactor = router.DefaultLoadFactor
	}
	if p.HardLoadFactor == 0 {
		p.HardLoadFactor = max(router.DefaultHardLoadFactor, p.LoadFactor)
	}
	p.LoadMargin.orDefault(router.DefaultLoadMargin)
	p.TieMarginPercent.orDefault(int(math.Round(router.DefaultTieMargin * 100)))
	p.SpreadNewPrefixes.orDefault(true) // router.PrefixOptions' zero value spreads
	if p.DefaultKVCacheTokens == 0 {
		p.DefaultKVCacheTokens = index.DefaultKVCacheTokens
	}
	setI(&p.MaxIndexEntries, index.DefaultMaxEntries)
	for i := range c.Backends {
		setI(&c.Backends[i].Weight, backend.DefaultWeight)
	}
	h, d := &c.Health, health.DefaultOptions()
	setS(&h.Path, d.Path)
	setS(&h.MetricsPath, d.MetricsPath)
	setS(&h.ModelsPath, d.ModelsPath)
	setD(&h.ModelsInterval, d.ModelsInterval)
	setD(&h.Interval, d.Interval)
	// An unset timeout follows a shorter interval (a check must end before the next), so
	// that setting health.interval alone below the default timeout is not an error.
	setD(&h.Timeout, min(d.Timeout, h.Interval.D()))
	setD(&h.BaseEjection, d.BaseEjection)
	setD(&h.MaxEjection, d.MaxEjection)
	setD(&h.ScrapeInterval, d.ScrapeInterval)
	setD(&h.ScrapeStaleAfter, d.ScrapeStaleAfter)
	setI(&h.HealthyThreshold, d.Rise)
	setI(&h.UnhealthyThreshold, d.Fall)
	setI(&h.ConsecutiveFailures, d.ConsecutiveFailures)
	setI(&h.MaxEjectedPercent, d.MaxEjectedPercent)
	if dns := c.Discovery.DNS; dns != nil {
		setS(&dns.Scheme, discovery.DefaultScheme)
		setD(&dns.Interval, discovery.DefaultInterval)
	}
	c.Peering.applyDefaults()
	c.Tracing.applyDefaults()
	c.FlowControl.applyDefaults(c)
	setS(&p.TieBreak, TieBreakAuto)
}

// Values of prefix.tie_break.
const (
	TieBreakAuto = "auto"
	TieBreakRing = "ring"
	TieBreakLoad = "load"
)

// PrefixOptions are the prefix policy's options (Prefix.RouterOptions) with tie_break
// "auto" resolved: TieBreakLoad when peering is on (the replicas share their loads), else
// router.TieBreakAuto (load while this replica is its backends' only sender, the ring as soon
// as another sends to them).
func (c *Config) PrefixOptions() router.PrefixOptions {
	o := c.Prefix.RouterOptions()
	if c.Prefix.TieBreak == TieBreakAuto && c.Peering != nil {
		o.TieBreak = router.TieBreakLoad
	}
	return o
}

// setS, setI and setD set a field left at zero to its default.
func setS(p *string, v string) {
	if *p == "" {
		*p = v
	}
}

func setI(p *int, v int) {
	if *p == 0 {
		*p = v
	}
}

func setD(p *Duration, v time.Duration) {
	if *p == 0 {
		*p = Duration(v)
	}
}

// RouterOptions are the prefix policy's options from a defaulted prefix section: a
// load_margin of 0 becomes router.NoLoadMargin, so that it means no margin, and a
// tie_margin_percent of 0 router.NoTieMargin; tie_break "auto" is router.TieBreakAuto here
// (Config.PrefixOptions, which knows whether peering is on, makes it TieBreakLoad with it).
func (p Prefix) RouterOptions() router.PrefixOptions {
	margin := p.LoadMargin.V
	if p.LoadMargin.Set && margin == 0 {
		margin = router.NoLoadMargin
	}
	tie := float64(p.TieMarginPercent.V) / 100
	if p.TieMarginPercent.Set && p.TieMarginPercent.V == 0 {
		tie = router.NoTieMargin
	}
	tb := router.TieBreakRing
	switch p.TieBreak {
	case TieBreakLoad:
		tb = router.TieBreakLoad
	case TieBreakAuto:
		tb = router.TieBreakAuto
	}
	return router.PrefixOptions{
		TieBreak:             tb,
		NoSpreadNewPrefixes:  !p.SpreadNewPrefixes.V,
		ChunkTokens:          p.ChunkTokens,
		LoadFactor:           p.LoadFactor,
		HardLoadFactor:       p.HardLoadFactor,
		LoadMargin:           margin,
		TieMargin:            tie,
		MaxIndexEntries:      p.MaxIndexEntries,
		DefaultKVCacheTokens: p.DefaultKVCacheTokens,
	}
}

// Validate checks every field; the error names the first wrong field as it is written in YAML.
func (c *Config) Validate() error {
	if err := checkHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if err := checkHostPort(c.AdminListen); err != nil {
		return fmt.Errorf("admin_listen: %w", err)
	}
	if samePort(c.AdminListen, c.Listen) {
		return fmt.Errorf("admin_listen: %q has the port of listen (%q); the admin listener needs a port of its own", c.AdminListen, c.Listen)
	}
	if modes := router.ModeNames(); !slices.Contains(modes, c.Mode) {
		return fmt.Errorf("mode: %q is not one of %v", c.Mode, modes)
	}
	if err := router.CheckShadow(c.Shadow, c.Mode); err != nil {
		return fmt.Errorf("shadow: %w", err)
	}
	if !slices.Contains(logLevels, c.Log.Level) {
		return fmt.Errorf("log.level: %q is not one of debug, info, warn, error", c.Log.Level)
	}
	if !slices.Contains(logFormats, c.Log.Format) {
		return fmt.Errorf("log.format: %q is not one of json, console", c.Log.Format)
	}
	if c.MaxRequestBodyBytes < minRequestBodyBytes || int64(c.MaxRequestBodyBytes) > maxRequestBodyBytes {
		return fmt.Errorf("max_request_body_bytes: %d is outside %d..%d (1 KiB..4 GiB)", c.MaxRequestBodyBytes, minRequestBodyBytes, maxRequestBodyBytes)
	}
	if c.Limits.MaxBufferedBodyBytes/2 < int64(c.MaxRequestBodyBytes) { // ⌊b/2⌋ < m ⇔ b < 2m, without overflow
		// A body's buffer grows as its bytes arrive, and its last growth holds up to 1.5 ×
		// the body while it copies (proxy/bodypool.go): below twice the largest body, a body
		// of the maximum size could never be accepted.
		return fmt.Errorf("limits.max_buffered_body_bytes: %d is below twice max_request_body_bytes (2 × %d): a body of the maximum size could never be accepted",
			c.Limits.MaxBufferedBodyBytes, c.MaxRequestBodyBytes)
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"timeouts.connect", c.Timeouts.Connect}, {"timeouts.response_header", c.Timeouts.ResponseHeader},
		{"timeouts.idle", c.Timeouts.Idle}, {"timeouts.shutdown_grace", c.Timeouts.ShutdownGrace},
		{"timeouts.client_read", c.Timeouts.ClientRead}, {"timeouts.client_write", c.Timeouts.ClientWrite},
		{"timeouts.client_body_idle", c.Timeouts.ClientBodyIdle}} {
		if d.v < 0 {
			return fmt.Errorf("%s: negative duration %s", d.name, d.v.D())
		}
	}
	p := c.Prefix
	switch {
	case p.ChunkTokens < 1 || p.ChunkTokens > maxChunkTokens:
		return fmt.Errorf("prefix.chunk_tokens: %d is outside 1..%d", p.ChunkTokens, maxChunkTokens)
	case !(p.LoadFactor >= 1 && p.LoadFactor <= maxLoadFactor): // NaN fails both
		return fmt.Errorf("prefix.load_factor: %g is outside 1..%d (1 = perfect balance, no affinity)", p.LoadFactor, maxLoadFactor)
	case !(p.HardLoadFactor <= maxLoadFactor):
		return fmt.Errorf("prefix.hard_load_factor: %g is over %d", p.HardLoadFactor, maxLoadFactor)
	case p.HardLoadFactor < p.LoadFactor:
		return fmt.Errorf("prefix.hard_load_factor: %g is below prefix.load_factor (%g): the hard cap cannot be tighter than the cap", p.HardLoadFactor, p.LoadFactor)
	case p.LoadMargin.V < 0:
		return fmt.Errorf("prefix.load_margin: %d is negative", p.LoadMargin.V)
	case p.TieBreak != TieBreakAuto && p.TieBreak != TieBreakRing && p.TieBreak != TieBreakLoad:
		return fmt.Errorf("prefix.tie_break: %q is not %s, %s or %s", p.TieBreak, TieBreakAuto, TieBreakRing, TieBreakLoad)
	case p.TieMarginPercent.V < 0 || p.TieMarginPercent.V > maxTieMarginPercent:
		return fmt.Errorf("prefix.tie_margin_percent: %d is outside 0..%d", p.TieMarginPercent.V, maxTieMarginPercent)
	case p.DefaultKVCacheTokens < int64(p.ChunkTokens):
		return fmt.Errorf("prefix.default_kv_cache_tokens: %d is below one chunk (%d tokens)", p.DefaultKVCacheTokens, p.ChunkTokens)
	case p.MaxIndexEntries < 1:
		return fmt.Errorf("prefix.max_index_entries: %d is below 1", p.MaxIndexEntries)
	}
	if err := c.Health.validate(); err != nil {
		return err
	}
	if d := c.Discovery.DNS; d != nil {
		switch {
		case d.Name == "":
			return errors.New("discovery.dns.name: required")
		case !d.SRV && (d.Port < 1 || d.Port > maxPort):
			return fmt.Errorf("discovery.dns.port: %d is outside 1..%d (required without srv)", d.Port, maxPort)
		case d.Scheme != "http" && d.Scheme != "https":
			return fmt.Errorf("discovery.dns.scheme: %q is not http or https", d.Scheme)
		case d.Interval.D() < minInterval:
			return fmt.Errorf("discovery.dns.interval: %s is below %s", d.Interval.D(), minInterval)
		case d.KVCacheTokens < 0:
			return fmt.Errorf("discovery.dns.kv_cache_tokens: %d is negative", d.KVCacheTokens)
		}
	}
	if err := c.Peering.validate(c); err != nil {
		return err
	}
	if err := c.Tracing.validate(); err != nil {
		return err
	}
	if err := c.FlowControl.validate(c); err != nil {
		return err
	}
	if len(c.Backends) == 0 && c.Discovery.DNS == nil {
		return errors.New("backends: at least one backend (or discovery.dns) is required")
	}
	seen := map[string]int{}
	for i, b := range c.Backends {
		nb, err := backend.New(b.URL, b.KVCacheTokens, b.Weight)
		if err != nil {
			return fmt.Errorf("backends[%d].url: %w", i, err)
		}
		if j, dup := seen[nb.Name]; dup {
			return fmt.Errorf("backends[%d].url: %q duplicates backends[%d]", i, b.URL, j)
		}
		seen[nb.Name] = i
		if b.KVCacheTokens < 0 {
			return fmt.Errorf("backends[%d].kv_cache_tokens: %d is negative", i, b.KVCacheTokens)
		}
		if b.Weight < 0 || b.Weight > maxWeight {
			return fmt.Errorf("backends[%d].weight: %d is outside 1..%d", i, b.Weight, maxWeight)
		}
		if b.MaxConcurrency < 0 {
			return fmt.Errorf("backends[%d].max_concurrency: %d is negative", i, b.MaxConcurrency)
		}
		for j, m := range b.Models {
			if m == "" {
				return fmt.Errorf("backends[%d].models[%d]: empty model name", i, j)
			}
			if k := slices.Index(b.Models[:j], m); k >= 0 {
				return fmt.Errorf("backends[%d].models[%d]: %q duplicates models[%d]", i, j, m, k)
			}
		}
	}
	return nil
}

func (h *Health) validate() error {
	switch {
	case len(h.Path) == 0 || h.Path[0] != '/':
		return fmt.Errorf("health.path: %q must start with /", h.Path)
	case len(h.MetricsPath) == 0 || h.MetricsPath[0] != '/':
		return fmt.Errorf("health.metrics_path: %q must start with /", h.MetricsPath)
	case h.Interval.D() < minInterval:
		return fmt.Errorf("health.interval: %s is below %s", h.Interval.D(), minInterval)
	case h.Timeout.D() <= 0 || h.Timeout.D() > h.Interval.D():
		return fmt.Errorf("health.timeout: %s must be positive and at most health.interval (%s)", h.Timeout.D(), h.Interval.D())
	case h.HealthyThreshold < 1 || h.HealthyThreshold > maxThreshold:
		return fmt.Errorf("health.healthy_threshold: %d is outside 1..%d", h.HealthyThreshold, maxThreshold)
	case h.UnhealthyThreshold < 1 || h.UnhealthyThreshold > maxThreshold:
		return fmt.Errorf("health.unhealthy_threshold: %d is outside 1..%d", h.UnhealthyThreshold, maxThreshold)
	case h.ConsecutiveFailures < -1:
		return fmt.Errorf("health.consecutive_failures: %d is below -1 (-1 disables passive ejection)", h.ConsecutiveFailures)
	case h.BaseEjection < 0 || h.MaxEjection < h.BaseEjection:
		return fmt.Errorf("health.max_ejection: %s must be at least health.base_ejection (%s)", h.MaxEjection.D(), h.BaseEjection.D())
	case h.MaxEjectedPercent < 1 || h.MaxEjectedPercent > 100:
		return fmt.Errorf("health.max_ejected_percent: %d is outside 1..100", h.MaxEjectedPercent)
	case h.ScrapeInterval.D() < minInterval:
		return fmt.Errorf("health.scrape_interval: %s is below %s", h.ScrapeInterval.D(), minInterval)
	case h.ScrapeStaleAfter.D() < h.ScrapeInterval.D():
		return fmt.Errorf("health.scrape_stale_after: %s is below health.scrape_interval (%s)", h.ScrapeStaleAfter.D(), h.ScrapeInterval.D())
	case len(h.ModelsPath) == 0 || h.ModelsPath[0] != '/':
		return fmt.Errorf("health.models_path: %q must start with /", h.ModelsPath)
	case h.ModelsInterval.D() < minInterval:
		return fmt.Errorf("health.models_interval: %s is below %s", h.ModelsInterval.D(), minInterval)
	}
	return nil
}

func checkHostPort(s string) error {
	if _, _, err := net.SplitHostPort(s); err != nil {
		return fmt.Errorf("%q is not host:port: %v", s, err)
	}
	return nil
}
