package proxy

import (
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/tracing"
)

// Options are what a Server needs. Policy is required; the other zero fields take the
// defaults below (Health and ChunkTokens take their own packages' defaults).
type Options struct {
	// Mode names the policy in the prefixlb_requests_total{mode} label and /debug/backends.
	Mode string
	// Policy picks a backend per request (router.NewPolicy builds a mode's). The Server wraps
	// it in a router.Decider: passthrough, parse-fallback and retries are the same in every mode.
	Policy router.Policy
	// Backends are the replicas at start; UpdateBackends and SetBackends change them later.
	Backends []*backend.Backend
	// ChunkTokens is the chunk size of routing keys in approximate tokens; it must be the
	// policy's (router.PrefixOptions.ChunkTokens). 0: key.DefaultChunkTokens.
	ChunkTokens int
	// DefaultKVCacheTokens is the KV capacity in tokens shown for a backend that has none
	// configured or reported (/debug/backends, the log line when a replica reports its own);
	// it should be the index's (router.PrefixOptions.DefaultKVCacheTokens).
	DefaultKVCacheTokens int64
	// Health configures active checks, passive ejection and scraping, as health.New reads it
	// (zero fields take health's defaults; ScrapeInterval 0 turns scraping off).
	Health health.Options
	// Timeouts bound the phases of a request; there is no total timeout on a stream.
	Timeouts Timeouts
	// MaxRequestBodyBytes caps one request body in bytes; a larger one gets 413.
	MaxRequestBodyBytes int
	// MaxBufferedBodyBytes caps the request-body bytes buffered at once over all requests; a
	// request whose body does not fit what is left gets 503 at once.
	MaxBufferedBodyBytes int64
	// OmitBackendHeader leaves x-prefixlb-backend out of responses, and removes a backend's
	// own (a prefixlb in front of others). By default the header names the backend.
	OmitBackendHeader bool
	// Log receives the request lines and changes of state (nil: nothing is logged).
	Log *zap.Logger
	// Tracing turns on OpenTelemetry spans of requests, whose trace context goes to the
	// backends in traceparent (trace.go); nil: off. New builds its tracer, and Shutdown
	// exports the spans still queued.
	Tracing *tracing.Options
	// FlowControl holds requests while every replica of their pool is saturated
	// (flowctl.go; off by default). Server.SetFlowControl changes it on a reload.
	FlowControl FlowControl
}

// Timeouts of the proxy (zero: the default).
type Timeouts struct {
	// Connect bounds dialling a backend.
	Connect time.Duration
	// ResponseHeader bounds the wait for a backend's response headers: queueing and prefill,
	// all of generation for a non-streamed response.
	ResponseHeader time.Duration
	// Idle bounds the silence between two chunks of a response body.
	Idle time.Duration
	// ClientRead bounds reading one client request, headers and body.
	ClientRead time.Duration
	// ClientWrite bounds how long a client may leave the response unread: a write to it that
	// makes no progress for this long closes the client and the backend connection.
	ClientWrite time.Duration
	// ClientBodyIdle bounds the silence between two reads of a request body; a client that
	// stalls mid-body gives its share of MaxBufferedBodyBytes back after it.
	ClientBodyIdle time.Duration
}

// Defaults. Each names its source.
const (
	// DefaultConnectTimeout is Envoy's connect timeout.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultResponseHeaderTimeout: 10 minutes, because a non-streamed response sends headers
	// only when generation ends, which a long generation takes minutes to reach.
	DefaultResponseHeaderTimeout = 10 * time.Minute
	// DefaultIdleTimeout is Envoy's stream_idle_timeout.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultClientReadTimeout: a 64 MiB body at 10 Mbit/s takes about 55 s; a client that
	// sends nothing (slowloris) is dropped after this.
	DefaultClientReadTimeout = 60 * time.Second
	// DefaultClientWriteTimeout: a client that has read nothing of its response for a minute
	// has stopped reading (a hung script, a laptop asleep); a slow but live link drains a
	// 16 KB chunk in well under that.
	DefaultClientWriteTimeout = 60 * time.Second
	// DefaultClientBodyIdleTimeout: longer than a run of TCP retransmissions on a lossy link
	// (200 ms doubling: 6.2 s for five), short enough that a stalled upload frees its budget.
	DefaultClientBodyIdleTimeout = 10 * time.Second
	// DefaultMaxRequestBodyBytes is 64 MiB: sglang raised its chat limit to 32 MiB for
	// images (sglang PR #38735); fasthttp's own 4 MiB default is too small.
	DefaultMaxRequestBodyBytes = 64 << 20
	// DefaultMaxBufferedBodyBytes is 1 GiB: a pod with a 2 GiB memory limit keeps the
	// prefix index (about 350 MB at its default size) and the rest beside it; sixteen
	// maximum-size bodies fit at once, thousands of ordinary chat requests.
	DefaultMaxBufferedBodyBytes = 1 << 30
)

// withDefaults returns o with its zero durations and limits set to the defaults.
func (o Options) withDefaults() Options {
	t := &o.Timeouts
	for _, d := range []struct {
		p *time.Duration
		v time.Duration
	}{{&t.Connect, DefaultConnectTimeout}, {&t.ResponseHeader, DefaultResponseHeaderTimeout}, {&t.Idle, DefaultIdleTimeout},
		{&t.ClientRead, DefaultClientReadTimeout}, {&t.ClientWrite, DefaultClientWriteTimeout},
		{&t.ClientBodyIdle, DefaultClientBodyIdleTimeout}} {
		if *d.p == 0 {
			*d.p = d.v
		}
	}
	if o.MaxRequestBodyBytes == 0 {
		o.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	}
	if o.MaxBufferedBodyBytes == 0 {
		o.MaxBufferedBodyBytes = DefaultMaxBufferedBodyBytes
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return o
}
