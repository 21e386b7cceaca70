// Package backend holds the runtime state of each model-server replica (vLLM, SGLang) that
// prefixlb routes to: in-flight requests, pending prefill tokens, health and cache epoch.
// Policies read it; the proxy and the health checker write it. Nothing here does I/O.
package backend

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Backend is one replica. All mutable state is atomic, so a Backend is safe for concurrent use.
// It must not be copied after first use.
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

	// kvConfigured and weight are the replica's configured settings (KVCacheTokens, Weight):
	// a config reload changes them in place (SetKVCacheTokens, SetWeight), so that the
	// backend keeps its health, ejection state, index entries and learned rates.
	kvConfigured  atomic.Int64
	weight        atomic.Int64
	inFlight      atomic.Int64
	scraped       atomic.Int64 // running + waiting requests the replica reported (0: unknown)
	scrapedExcess atomic.Int64 // of those, beyond Counted around the fetch (ScrapedExcess)
	kvScraped     atomic.Int64 // KV capacity in tokens the replica reported (0: unknown)
	prefillTokens atomic.Int64
	drain         drain         // what of prefillTokens the replica has likely done (QueuedPrefill)
	prefillReqs   atomic.Int64  // in-flight requests that have not started answering
	kvUsage       atomic.Uint64 // float64 bits: the KV-cache usage the replica reported, 0..1
	prefill       PrefillModel
	fleet         atomic.Pointer[PrefillModel] // the fleet's model (SetFleetPrefill), nil: none
	unhealthy     atomic.Bool
	neverPassed   atomic.Bool
	reportsCached atomic.Bool // a response's usage carried a cached-token count
	epoch         atomic.Uint64
	served        atomic.Uint64
	completed     atomic.Uint64                   // requests answered in full with a success status (Lease.Complete)
	senders       atomic.Int32                    // Senders: the health checker's verdict
	peerInFlight  atomic.Int64                    // other prefixlb replicas' in-flight requests here (peer.go)
	peerPrefill   atomic.Int64                    // and their queued prefill tokens (in QueuedPrefill's queue)
	decodeSeqs    atomic.Int64                    // this proxy's streamed requests answering here (Decoding)
	decodeCtx     atomic.Int64                    // and their prompt tokens
	models        atomic.Pointer[ModelSet]        // nil: unknown (serves any model); see models.go
	routed        RecentSum                       // the prefix policy's recent prefill work here (recent.go)
	samples       sampleLog                       // own prefill observations for peers (samples.go)
	loadNotify    atomic.Pointer[chan<- struct{}] // signalled on a change of the own load (NotifyLoad)
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

// KVCacheTokens is the replica's configured KV-cache capacity in tokens (0: not configured;
// see KVCapacity).
func (b *Backend) KVCacheTokens() int64 { return b.kvConfigured.Load() }

// SetKVCacheTokens changes the configured KV-cache capacity (a config reload; negative
// counts as 0). The prefix index reads it when its backends are set again.
func (b *Backend) SetKVCacheTokens(tokens int64) { b.kvConfigured.Store(max(tokens, 0)) }

// Weight scales the backend's share of the hash ring and of the bounded-load cap (1 =
// normal; at least 1).
func (b *Backend) Weight() int { return int(b.weight.Load()) }

// SetWeight changes the weight (a config reload); 0 or below takes DefaultWeight. The hash
// ring reads it when its backends are set again.
func (b *Backend) SetWeight(w int) {
	if w <= 0 {
		w = DefaultWeight
	}
	b.weight.Store(int64(w))
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

// InFlight is the number of requests dispatched to the backend whose response has not
// finished, failed or been cancelled.
func (b *Backend) InFlight() int64 { return b.inFlight.Load() }

// Load is the number of requests the replica is working on or queueing as a router that
// reads the replica's metrics and its own count sees it: the larger of this prefixlb's own
// in-flight count (with peering, plus its peers', PeerInFlight) and the running + waiting
// requests the replica last reported (vLLM num_requests_running + num_requests_waiting). The
// scraped count is up to a scrape interval old, so it still lists requests answered since.
// bench's peer policies that read a replica's queue (llm-d, dynamo) see this; prefixlb's own
// policies rank by Busy.
func (b *Backend) Load() int64 {
	l := b.Counted()
	if s := b.scraped.Load(); s > l {
		return s
	}
	return l
}

// Busy is the number of requests the replica is working on or queueing as prefixlb counts
// them: this proxy's in-flight requests and its peers' (Counted), which react at once to a
// dispatch or an answer, plus the other senders' as of the last scrape (ScrapedExcess).
// Unlike Load, requests this proxy or its peers sent that were answered since the scrape
// are not counted. Least-load mode ranks by it, and prefix mode's cost model sums the same
// three terms.
func (b *Backend) Busy() int64 { return b.Counted() + b.scrapedExcess.Load() }

// Counted is the requests this proxy and its peers (PeerInFlight) have in flight on the
// backend.
func (b *Backend) Counted() int64 { return b.inFlight.Load() + b.peerInFlight.Load() }

// SetScrapedLoad stores the running + waiting requests the replica reported (0 when the
// scrape failed or is stale, so that Load falls back to the local in-flight count), in a
// scrape that started when this proxy and its peers had before requests in flight there
// (Counted, read before the fetch; 0 for none known). It keeps how many of the reported
// requests were beyond the larger of before and the count now (ScrapedExcess): requests of
// this proxy's that were answered during the fetch, which the replica may still have listed,
// are not taken for other senders' work, nor requests sent during it. The larger count gives
// the smallest excess: another sender's requests that arrived while as many of this proxy's
// were answered within one fetch (a few milliseconds) wait for the next scrape.
func (b *Backend) SetScrapedLoad(requests, before int64) {
	requests = max(requests, 0)
	b.scraped.Store(requests)
	b.scrapedExcess.Store(max(requests-max(before, b.Counted()), 0))
}

// ScrapedExcess is how many more requests the replica reported running and waiting at its
// last scrape than this proxy and its peers had in flight there around the scrape (the
// larger count of before and after the fetch; 0 when not more, or not scraped): other
// senders' work as of that scrape. Unlike Load less the in-flight count now, it does not
// count this proxy's own requests that answered since the scrape, which a scrape up to an
// interval old still lists.
func (b *Backend) ScrapedExcess() int64 { return b.scrapedExcess.Load() }

// KVCapacity is the replica's KV-cache capacity in tokens: the configured kv_cache_tokens,
// else what the replica reports (vLLM cache_config_info num_gpu_blocks × block_size, SGLang
// max_total_num_tokens), else def.
func (b *Backend) KVCapacity(def int64) int64 {
	if c := b.kvConfigured.Load(); c > 0 {
		return c
	}
	if s := b.kvScraped.Load(); s > 0 {
		return s
	}
	return def
}

// SetScrapedKVCacheTokens stores the KV capacity the replica reported and reports whether it
// changed.
func (b *Backend) SetScrapedKVCacheTokens(tokens int64) bool {
	return b.kvScraped.Swap(tokens) != tokens
}

// PrefillTokens is the prefill work this proxy has queued on the replica: the work given to
// Lease.Begin of in-flight requests that have not yet produced a first response byte. The
// prefix policy gives the prompt tokens it predicted uncached, weighted by their attention
// (router.PrefillWork: a token deep in a long context counts more); others the prompt tokens.
func (b *Backend) PrefillTokens() int64 { return b.prefillTokens.Load() }

// PrefillRequests is the number of this proxy's in-flight requests on the replica that have
// not yet produced a first response byte; InFlight less it are decoding.
func (b *Backend) PrefillRequests() int64 { return b.prefillReqs.Load() }

// Prefill is what this proxy has learned of the replica's prefill speed.
func (b *Backend) Prefill() *PrefillModel { return &b.prefill }

// SetFleetPrefill makes m the fleet's prefill model for b (nil: none): every observation of
// b's (ObservePrefill) teaches m too, and until b's own model has learned its rate
// (MinPrefillSamples), QueuedPrefill drains b's queue at m's rate rather than
// DefaultPrefillRate. The prefix policy gives the backends of each model pool one
// (router.Prefix.SetBackends, and ModelsChanged when a backend's models change), so that a
// fleet of like replicas is judged at its measured speed after its first 8 answers, not each
// replica's 8, and the replicas of another model (another speed) teach it nothing.
func (b *Backend) SetFleetPrefill(m *PrefillModel) { b.fleet.Store(m) }

// FleetPrefill is the pooled model SetFleetPrefill gave b (nil: none).
func (b *Backend) FleetPrefill() *PrefillModel { return b.fleet.Load() }

// ObservePrefill folds one measured time to first token after work tokens of prefill into
// b's prefill model and the fleet's (SetFleetPrefill).
func (b *Backend) ObservePrefill(work int64, ttft time.Duration) {
	b.prefill.Observe(work, ttft)
	if f := b.fleet.Load(); f != nil {
		f.Observe(work, ttft)
	}
}

// KVUsage is the fraction of the replica's KV cache in use as it last reported it
// (vllm:kv_cache_usage_perc, sglang:token_usage), 0 when unknown.
func (b *Backend) KVUsage() float64 { return math.Float64frombits(b.kvUsage.Load()) }

// SetScrapedKVUsage stores the KV-cache usage the replica reported (clamped to 0..1; 0 when the
// scrape failed).
func (b *Backend) SetScrapedKVUsage(u float64) {
	if !(u > 0) {
		u = 0
	}
	b.kvUsage.Store(math.Float64bits(math.Min(u, 1)))
}

// Served is the number of requests ever dispatched to the backend.
func (b *Backend) Served() uint64 { return b.served.Load() }

// ReportsCachedTokens reports whether a response from this backend has carried a cached-token
// count in its usage (prompt_tokens_details.cached_tokens or cache_read_input_tokens): from
// then on a usage without one means nothing was cached (vLLM omits a zero count).
func (b *Backend) ReportsCachedTokens() bool { return b.reportsCached.Load() }

// SetReportsCachedTokens records that the backend reports cached tokens.
func (b *Backend) SetReportsCachedTokens() {
	if !b.reportsCached.Load() {
		b.reportsCached.Store(true)
	}
}

// Healthy reports whether the backend may take new requests.
func (b *Backend) Healthy() bool { return !b.unhealthy.Load() }

// SetHealthy marks the backend healthy or not and reports whether the state changed.
func (b *Backend) SetHealthy(ok bool) bool { return b.unhealthy.Swap(!ok) == ok }

// NeverPassed reports whether the backend is waiting for its first passing active check: a
// new replica, typically still loading its model weights. Such a backend takes no traffic,
// not even in panic mode, and does not count toward the panic threshold (Envoy's
// ignore_new_hosts_until_first_hc). A new Backend is not marked; the health checker marks
// the backends it tracks with active checks on and clears the mark on their first pass.
func (b *Backend) NeverPassed() bool { return b.neverPassed.Load() }

// SetNeverPassed sets or clears the NeverPassed mark.
func (b *Backend) SetNeverPassed(v bool) { b.neverPassed.Store(v) }

// Epoch counts how often the backend's KV cache was lost (restart, return from unhealthy,
// removal). Index entries are valid only for the epoch they were recorded in.
func (b *Backend) Epoch() uint64 { return b.epoch.Load() }

// ResetCache bumps the epoch: everything recorded about the backend's cache is stale.
func (b *Backend) ResetCache() { b.epoch.Add(1) }

// Lease accounts one request on one backend. Begin increments the backend's counters;
// FirstByte and Release decrement them, each at most once, whatever the order or the number
// of calls (EOF, error and cancel may all try). The zero Lease is unused; it must not be
// copied after Begin.
type Lease struct {
	b       *Backend
	prefill int64
	ahead   int64 // prefill work queued on b before this request (this proxy's and its peers', QueuedPrefill)
	decode  int64 // DecodeWork of b's decoding sequences at Begin
	context int64 // the prompt's tokens: its KV cache while it decodes (Decoding)
	began   time.Time
	timed   bool          // the first byte is the first token: observe the prefill model
	state   atomic.Uint32 // bit 0: first byte accounted; bit 1: released; bit 2: counted decoding
}

// Lease states.
const (
	leaseAnswered = 1 << iota // the first byte was accounted
	leaseReleased
	leaseDecoding // counted in Decoding until Release
)

// Begin dispatches one request to b whose prefill is work prompt tokens (those the policy
// predicts b does not hold) of a prompt of prompt tokens. streamed says that the response's
// first byte comes with its first token (a streamed completion), so that its time teaches
// b's prefill model and it counts as decoding (Decoding) from then on; a non-streamed
// response's first byte comes at its end.
func (l *Lease) Begin(b *Backend, work, prompt int64, streamed bool) {
	l.b = b
	l.prefill = work
	l.context = max(prompt, 0)
	l.timed = streamed
	l.state.Store(0)
	l.began = time.Now()
	b.inFlight.Add(1)
	// Under the drain's lock, as SetPeerLoad decides, so that one of the two starts the drain.
	b.drain.mu.Lock()
	rate, raw := b.PrefillRate(), b.queuedRaw()
	l.ahead = b.drain.queuedLocked(l.began, raw, rate) // QueuedPrefill
	seqs, ctx := b.Decoding()
	l.decode = DecodeWork(seqs, ctx, l.ahead, work)
	b.prefillTokens.Add(work)
	if b.prefillReqs.Add(1) == 1 && b.peerPrefill.Load() == 0 {
		b.drain.startLocked(l.began) // the queue was empty: it starts now
	} else {
		b.drain.holdLocked(l.began, rate, raw) // this request's work counts in full
	}
	b.drain.mu.Unlock()
	b.served.Add(1)
	b.loadChanged()
}

// Sent marks the request sent, for a lease begun before the request was held (the proxy's
// settle, a few milliseconds): its prefill sample (FirstByte) times from now, with the work
// queued ahead of it less what b likely worked off meanwhile at its prefill rate. Call it
// before FirstByte, from the goroutine that began the lease.
func (l *Lease) Sent() {
	if l.b == nil {
		return
	}
	now := time.Now()
	l.ahead = max(l.ahead-int64(now.Sub(l.began).Seconds()*l.b.PrefillRate()), 0)
	l.began = now
}

// Backend is the leased backend (nil before Begin).
func (l *Lease) Backend() *Backend { return l.b }

// FirstByte marks the end of prefill: the backend started answering. For a streamed request
// the time since Begin is an observation of the backend's prefill model.
func (l *Lease) FirstByte() { l.firstByte(true) }

// Refused marks a request the backend answered with an error status (a 400 for a prompt
// over the context, a 429): its prefill work leaves the queue as at FirstByte, but its answer
// came without a prefill and teaches the prefill model nothing: a fast 400 for a huge prompt
// taken as its TTFT would make the replica look far faster than it is, and every replica
// that had not learned its own rate would take that one's (the fleet median). Safe to call
// after FirstByte or Release (then it does nothing).
func (l *Lease) Refused() { l.firstByte(false) }

func (l *Lease) firstByte(observe bool) {
	for {
		s := l.state.Load()
		if s&(leaseAnswered|leaseReleased) != 0 {
			return
		}
		decoding := observe && l.timed
		next := s | leaseAnswered
		if decoding {
			next |= leaseDecoding
		}
		if l.state.CompareAndSwap(s, next) {
			if decoding { // counted first: Release takes them back once the bit is set
				l.b.decodeSeqs.Add(1)
				l.b.decodeCtx.Add(l.context)
			}
			l.b.leaveQueue(l.prefill, true) // a prefill finished: the queue moved
			if decoding {
				// The sample's work is what the estimate charged: the queue ahead, this
				// prompt's, and the decodes' (router.estimate), so that the learned rate is
				// the replica's prefill speed with decode interference taken apart.
				s := PrefillSample{Work: l.ahead + l.prefill + l.decode, TTFT: time.Since(l.began)}
				l.b.ObservePrefill(s.Work, s.TTFT)
				l.b.samples.keep(s)
			}
			return
		}
	}
}

// Release ends the request: finished, failed or cancelled. Safe to call more than once.
func (l *Lease) Release() {
	for {
		s := l.state.Load()
		if s&leaseReleased != 0 || l.b == nil {
			return
		}
		if l.state.CompareAndSwap(s, s|leaseReleased) {
			if s&leaseDecoding != 0 {
				l.b.decodeSeqs.Add(-1)
				l.b.decodeCtx.Add(-l.context)
			}
			if s&leaseAnswered == 0 {
				l.b.leaveQueue(l.prefill, false) // it leaves the queue undone
			}
			l.b.inFlight.Add(-1)
			l.b.loadChanged()
			return
		}
	}
}

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
