// Package backend holds the runtime state of each model-server replica (vLLM, SGLang) that
// prefixlb routes to, grouped by the package that writes it: the configured settings, the
// health checker's report, the peers' load, this proxy's own counts (see Backend). Policies
// read it. Nothing here does I/O.
package backend

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// Backend is one replica: its identity, and its runtime state grouped by the one package
// that writes each group, each group read whole through a snapshot (a small struct value):
//
//   - Settings (settings.go): the configured KV capacity and weight, set by New and changed in
//     place by a config reload (package proxy).
//   - HealthReport (report.go): the health checker's verdict and what the replica's metrics
//     last reported: running and waiting requests, KV usage and capacity, other senders
//     (package health).
//   - PeerLoad (peer.go): the other prefixlb replicas' in-flight requests and queued prefill
//     here (package peering).
//   - Counts (counts.go): this proxy's own requests here, counted by the Lease each holds
//     (package proxy).
//
// Beside them, each with its writers named where it is declared: the model set (models.go;
// the config's wins over the health checker's discovered one), the cache epoch
// (ResetCache), the learned prefill model and the pool's (prefill.go, drain.go), and the
// samples kept for peers (samples.go). writers_test.go holds the map of which packages call
// which setter and fails when another package does. All mutable state is atomic or locked,
// so a Backend is safe for concurrent use. It must not be copied after first use.
type Backend struct {
	// Name is the backend's identity: its configured URL without a trailing slash. Two
	// prefixlb replicas configured with the same URLs give their backends the same Name, and
	// so the same ID and the same hash-ring points.
	Name string
	// Scheme is "http" or "https".
	Scheme string
	// Addr is the host:port that is dialled.
	Addr string
	// ID is xxhash64(Name): a stable, deterministic identity used to break ties and to place
	// the backend on the hash ring.
	ID uint64

	settings settingsState // the config: SetKVCacheTokens, SetWeight
	report   reportState   // package health: SetHealthy, SetScrapedLoad, …
	peers    peerState     // package peering: SetPeerLoad
	counts   countState    // this proxy's requests: Lease

	// drain is what of the queued prefill (Counts.PrefillTokens and PeerLoad.PrefillTokens)
	// the replica has likely done (QueuedPrefill): both writers of the queue, a Lease and
	// SetPeerLoad, change it and the counts it drains under its lock.
	drain drain
	// models is the set of models the replica serves (models.go): SetConfiguredModels (the
	// config) and SetDiscoveredModels (package health) write it, the configured set winning.
	models atomic.Pointer[ModelSet]
	// epoch counts losses of the replica's KV cache (ResetCache): the health checker's
	// restarts and returns, the proxy's removals.
	epoch atomic.Uint64
	// prefill is the replica's learned prefill model, taught by its Leases' first bytes and
	// by the peers' samples (ObservePrefill, package peering); fleet is its pool's, which
	// the prefix policy binds (SetFleetPrefill, package router; nil: none).
	prefill PrefillModel
	fleet   atomic.Pointer[PrefillModel]
	// samples are this proxy's own prefill observations, kept by its Leases for peering to
	// take (SharePrefillSamples, TakePrefillSamples).
	samples sampleLog
	// loadNotify is signalled on a change of the own load (NotifyLoad, package peering).
	loadNotify atomic.Pointer[chan<- struct{}]
	// roomNotify is signalled when the replica may have room for another request
	// (NotifyRoom, package proxy: its flow-control dispatcher).
	roomNotify atomic.Pointer[chan<- struct{}]
}

// DefaultWeight is the weight of a backend configured without one: 1, an equal share of the
// hash ring (and so of new, cold prefixes) with every other default-weight backend.
const DefaultWeight = 1

// New parses rawURL ("http://host:port", optional path is ignored) into a Backend. A weight
// of 0 or below takes DefaultWeight.
// Errors say what is wrong with the URL; the caller prefixes the config field name. A URL
// with credentials (user:password@host) is refused: prefixlb would never send them, and the
// URL is the backend's name in the x-prefixlb-backend header, logs and metric labels. No
// error message repeats the credentials.
func New(rawURL string, kvCacheTokens int64, weight int) (*Backend, error) {
	if rawURL == "" {
		return nil, fmt.Errorf("empty")
	}
	shown := redactURL(rawURL)
	if !strings.Contains(rawURL, "://") {
		return nil, fmt.Errorf("missing scheme (want http:// or https://): %q", shown)
	}
	const credentials = "%q has credentials (user:password@): prefixlb does not send them, and the URL is the backend's name in headers, logs and metrics; remove them"
	if strings.Contains(rawURL, "@") {
		// Refused before parsing: a password with an unencoded '/', '?' or '#' makes the
		// parser read part of it as the host or port, and its error would quote that part.
		return nil, fmt.Errorf(credentials, shown)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message quotes the whole URL
		}
		return nil, fmt.Errorf("%q is not a URL: %v", shown, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("unsupported scheme %q (want http or https)", u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("missing host: %q", shown)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%q has a path or query (or a #fragment); give the server root (http://host:port): requests keep their own path", shown)
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	name := strings.TrimRight(rawURL, "/")
	b := &Backend{
		Name:   name,
		Scheme: u.Scheme,
		Addr:   addr,
		ID:     xxhash.Sum64String(name),
	}
	b.SetKVCacheTokens(kvCacheTokens)
	b.SetWeight(weight)
	return b, nil
}

// redactURL returns raw for error messages with what may hold a secret masked: everything
// between the scheme and its last '@' (userinfo; a password may hold an unencoded '/', '?' or
// '#', as base64 tokens do, so the authority's end cannot be trusted) and whatever follows the
// first '?' or '#' after that (an API key in a query or fragment), each as "xxxxx". raw need
// not parse. An '@' in a path or query also masks what precedes it, which costs an error
// message its host, never a secret.
func redactURL(raw string) string {
	start := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		start = i + len("://")
	}
	out := raw
	if at := strings.LastIndexByte(raw[start:], '@'); at >= 0 {
		out = raw[:start] + "xxxxx" + raw[start+at:]
		start += len("xxxxx") + 1
	}
	if q := strings.IndexAny(out[start:], "?#"); q >= 0 {
		out = out[:start+q+1] + "xxxxx"
	}
	return out
}

// Epoch counts how often the backend's KV cache was lost (restart, return from unhealthy,
// removal). Index entries are valid only for the epoch they were recorded in.
func (b *Backend) Epoch() uint64 { return b.epoch.Load() }

// ResetCache bumps the epoch: everything recorded about the backend's cache is stale.
func (b *Backend) ResetCache() { b.epoch.Add(1) }

// Pool is the current list of backends. Readers take an immutable snapshot without locking;
// writers replace the whole list (config reload, discovery).
type Pool struct {
	list atomic.Pointer[[]*Backend]
}

// NewPool returns a pool holding bs.
func NewPool(bs []*Backend) *Pool {
	p := &Pool{}
	p.Set(bs)
	return p
}

// Snapshot returns the current backends. The slice must not be modified.
func (p *Pool) Snapshot() []*Backend {
	if l := p.list.Load(); l != nil {
		return *l
	}
	return nil
}

// Set replaces the backend list.
func (p *Pool) Set(bs []*Backend) {
	c := append([]*Backend(nil), bs...)
	p.list.Store(&c)
}

// Healthy appends the healthy backends of bs to dst and returns it. Backends that never
// passed an active check (NeverPassed) are neither returned nor counted. When fewer than half
// of the others are healthy it returns all of those others (panic mode, as Envoy's 50% panic
// threshold): routing to a replica that was up and may be dead beats refusing every request,
// but a replica that never came up (still loading its weights) would only fail the request.
func Healthy(dst, bs []*Backend) (out []*Backend, panicMode bool) {
	dst = dst[:0]
	counted := 0
	for _, b := range bs {
		if b.NeverPassed() {
			continue
		}
		counted++
		if b.Healthy() {
			dst = append(dst, b)
		}
	}
	if 2*len(dst) >= counted {
		return dst, false
	}
	dst = dst[:0]
	for _, b := range bs {
		if !b.NeverPassed() {
			dst = append(dst, b)
		}
	}
	return dst, true
}
