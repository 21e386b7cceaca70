package sim

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// Cluster is N replicas in one process, each on its own port.
type Cluster struct {
	replicas []*Replica
	urls     []string
	wg       sync.WaitGroup
	mu       sync.Mutex
	serveErr []error
}

// StartCluster starts n replicas named sim-0 … sim-(n-1) on host:basePort … host:basePort+n-1
// (basePort 0: an ephemeral port each) and serves them in the background until Close.
func StartCluster(cfg Config, n int, host string, basePort int) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lns, urls, err := listenN(n, host, basePort)
	if err != nil {
		return nil, err
	}
	c := &Cluster{urls: urls}
	for i := range n {
		rep := NewReplica("sim-"+strconv.Itoa(i), cfg)
		c.replicas = append(c.replicas, rep)
		if cfg.KVEventsEndpoint == "" {
			continue
		}
		ep, err := replicaEndpoint(cfg.KVEventsEndpoint, i)
		if err == nil {
			err = rep.openKVEvents(ep)
		}
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			for _, r := range c.replicas {
				_ = r.Close()
			}
			return nil, err
		}
	}
	for i, rep := range c.replicas {
		c.wg.Add(1)
		go func(rep *Replica, ln net.Listener) {
			defer c.wg.Done()
			if err := rep.Serve(ln); err != nil {
				c.mu.Lock()
				c.serveErr = append(c.serveErr, fmt.Errorf("%s: %w", rep.Name(), err))
				c.mu.Unlock()
			}
		}(rep, lns[i])
	}
	return c, nil
}

// listenN binds n listeners on host:basePort … host:basePort+n-1 (basePort 0: an ephemeral
// port each) and returns them with their base URLs ("http://127.0.0.1:PORT" when host is
// empty or unspecified). On failure it closes what it opened.
func listenN(n int, host string, basePort int) ([]net.Listener, []string, error) {
	if n < 1 {
		return nil, nil, fmt.Errorf("--replicas must be >= 1, got %d", n)
	}
	if basePort < 0 || basePort+n-1 > 65535 {
		return nil, nil, fmt.Errorf("--base-port %d does not leave room for %d ports", basePort, n)
	}
	urlHost := host
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		urlHost = "127.0.0.1"
	}
	lns := make([]net.Listener, 0, n)
	urls := make([]string, 0, n)
	for i := range n {
		port := 0
		if basePort > 0 {
			port = basePort + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, nil, fmt.Errorf("replica %d: %w", i, err)
		}
		lns = append(lns, ln)
		_, p, _ := net.SplitHostPort(ln.Addr().String())
		urls = append(urls, "http://"+net.JoinHostPort(urlHost, p))
	}
	return lns, urls, nil
}

// URLs returns the replicas' base URLs ("http://127.0.0.1:PORT"), in replica order.
func (c *Cluster) URLs() []string { return append([]string(nil), c.urls...) }

// Replicas returns the replicas, in the order of URLs.
func (c *Cluster) Replicas() []*Replica { return append([]*Replica(nil), c.replicas...) }

// Close stops every replica and waits for them; it returns their errors joined.
func (c *Cluster) Close() error {
	var errs []error
	for _, r := range c.replicas {
		if err := r.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Name(), err))
		}
	}
	c.wg.Wait()
	c.mu.Lock()
	errs = append(errs, c.serveErr...)
	c.mu.Unlock()
	return errors.Join(errs...)
}
