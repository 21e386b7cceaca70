// Package discovery follows the model-server pods behind a Kubernetes headless Service by
// DNS, without cluster credentials: the Service name resolves to one A/AAAA record per ready
// pod, and to SRV records that carry the port.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
)

// Defaults of a DNS left at zero.
const (
	// DefaultInterval is the time between two resolutions: 10 s, twice the 5 s TTL that
	// CoreDNS (the kubernetes plugin's default) gives a Service's records, so that a pod that
	// became ready takes traffic within about 15 s without a lookup per request.
	DefaultInterval = 10 * time.Second
	// DefaultScheme is the URL scheme of discovered backends: vLLM and SGLang serve plain
	// HTTP unless started with TLS certificates.
	DefaultScheme = "http"
)

// Resolver is the part of *net.Resolver discovery uses; tests inject their own.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// DNS resolves a headless Service into backend URLs.
type DNS struct {
	// Name is the DNS name, e.g. vllm.default.svc.cluster.local.
	Name string
	// Port is the backend port used with A/AAAA records (ignored with SRV).
	Port int
	// SRV selects SRV lookup of Name (targets and ports from the records) instead of A/AAAA.
	SRV bool
	// Scheme is http or https ("": DefaultScheme).
	Scheme string
	// Interval between resolutions (0 or below: DefaultInterval).
	Interval time.Duration
	// Timeout bounds one resolution (0 or below: no bound but ctx's).
	Timeout time.Duration
	// Resolver answers lookups; nil means net.DefaultResolver.
	Resolver Resolver
	// Log, if set, gets one line per change of state of Run's resolutions: the first failure
	// (warn), the first success after failures (info); repeated failures log at debug only.
	Log *zap.Logger
}

// Resolve returns the sorted, de-duplicated backend URLs the name resolves to now.
// An empty answer is an error: a Service that momentarily has no ready pod must not empty
// the backend list (the previous list keeps serving).
func (d *DNS) Resolve(ctx context.Context) ([]string, error) {
	r := d.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	scheme := d.Scheme
	if scheme == "" {
		scheme = DefaultScheme
	}
	var urls []string
	if d.SRV {
		_, recs, err := r.LookupSRV(ctx, "", "", d.Name)
		if err != nil {
			return nil, fmt.Errorf("discovery.dns: SRV %s: %w", d.Name, err)
		}
		for _, rec := range recs {
			host := strings.TrimSuffix(rec.Target, ".") // the root of a fully qualified name
			urls = append(urls, scheme+"://"+net.JoinHostPort(host, strconv.Itoa(int(rec.Port))))
		}
	} else {
		addrs, err := r.LookupHost(ctx, d.Name)
		if err != nil {
			return nil, fmt.Errorf("discovery.dns: %s: %w", d.Name, err)
		}
		for _, a := range addrs {
			urls = append(urls, scheme+"://"+net.JoinHostPort(a, strconv.Itoa(d.Port)))
		}
	}
	for i, u := range urls {
		// A record that does not make a plain http(s)://host:port URL (credentials, a path)
		// fails the whole answer, so that the previous list keeps serving.
		if _, err := backend.New(u, 0, backend.DefaultWeight); err != nil {
			return nil, fmt.Errorf("discovery.dns: %s: record %d: %w", d.Name, i, err)
		}
	}
	slices.Sort(urls)
	urls = slices.Compact(urls)
	if len(urls) == 0 {
		return nil, errors.New("discovery.dns: " + d.Name + " resolved to no address")
	}
	return urls, nil
}

// Run resolves now and then every Interval until ctx is done, calling onChange with the
// URL list whenever it differs from the last one delivered, and onError (if not nil) on every
// failure; the last good list stays in use. Log hears of changes of state only: a name that
// fails for hours logs one warning, not one per Interval.
func (d *DNS) Run(ctx context.Context, onChange func([]string), onError func(error)) {
	var last []string
	interval := d.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	log := d.Log
	if log == nil {
		log = zap.NewNop()
	}
	var failures int // consecutive failed resolutions
	var failingSince time.Time
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		urls, err := d.Resolve(ctx)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 {
				failingSince = time.Now()
				log.Warn("discovery: resolution failed; keeping the previous backends",
					zap.String("name", d.Name), zap.Error(err))
			} else {
				log.Debug("discovery: resolution still failing", zap.String("name", d.Name),
					zap.Int("failures", failures), zap.Error(err))
			}
			if onError != nil {
				onError(err)
			}
		default:
			if failures > 0 {
				log.Info("discovery: resolution recovered", zap.String("name", d.Name),
					zap.Int("failures", failures), zap.Duration("failing_for", time.Since(failingSince)))
				failures = 0
			}
			if !slices.Equal(urls, last) {
				last = urls
				onChange(urls)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
