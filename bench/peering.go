package bench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
)

// peerJoinWait bounds the wait for an arm's peered replicas to see one another.
const peerJoinWait = 10 * time.Second

// startPeeredProxies runs n in-process prefixlb replicas in mode prefix, peered over
// 127.0.0.1 (package peering) with a fresh random secret: the first alone, the others joining
// it. It returns once every one sees all the others, with the proxies and their nodes, and a
// stop that stops the proxies and closes the nodes. mt puts their load signals and flushes
// on the run's clock (ModelTime).
func startPeeredProxies(base *configs.Config, backends []string, kvTokens int64, sims bool, n int, mt ModelTime) ([]*proxy.Serving, []*peering.Node, func(), error) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	f, err := os.CreateTemp("", "prefixlb-bench-peering-*")
	if err != nil {
		return nil, nil, nil, err
	}
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(key))
	_ = f.Close()
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		_ = os.Remove(f.Name())
	}
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	var svs []*proxy.Serving
	var nodes []*peering.Node
	for i := range n {
		cfg := *base
		cfg.Peering = &configs.Peering{Listen: "127.0.0.1:0", SecretFile: f.Name()}
		if i > 0 {
			cfg.Peering.Join = []string{nodes[0].Addr()}
		}
		sv, node, stopOne, err := startPeered(&cfg, backends, kvTokens, sims, mt)
		if err != nil {
			stop()
			return nil, nil, nil, err
		}
		stops = append(stops, stopOne)
		svs, nodes = append(svs, sv), append(nodes, node)
	}
	deadline := time.Now().Add(peerJoinWait)
	for _, node := range nodes {
		for node.Alive() < n-1 {
			if time.Now().After(deadline) {
				stop()
				return nil, nil, nil, fmt.Errorf("peering: replica %s sees %d of %d peers after %s", node.Name(), node.Alive(), n-1, peerJoinWait)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return svs, nodes, stop, nil
}

// startPeered is startProxy's prefix mode with cfg's peering section.
func startPeered(cfg *configs.Config, backends []string, kvTokens int64, sims bool, mt ModelTime) (*proxy.Serving, *peering.Node, func(), error) {
	cfg.Mode = "prefix"
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.Log.Level == "" || cfg.Log.Level == "info" || cfg.Log.Level == "debug" {
		cfg.Log.Level = "warn"
	}
	cfg.Log.Format = "console"
	cfg.Backends = nil
	for _, u := range backends {
		b := configs.Backend{URL: u}
		if sims {
			b.KVCacheTokens = kvTokens
		}
		cfg.Backends = append(cfg.Backends, b)
	}
	log, err := app.NewLogger(cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		return nil, nil, nil, err
	}
	sv, node, err := app.StartPeeredTuned(context.Background(), cfg, log, mt.Tuning("", nil))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("proxy: %w", err)
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), proxyStopGrace)
		defer cancel()
		if err := sv.Stop(sctx); err != nil {
			log.Warn("proxy stop", zap.Error(err))
		}
		_ = node.Close()
		_ = log.Sync()
	}
	return sv, node, stop, nil
}

// reportPeerTraffic writes one line of the arm's peer traffic per routed request (the update
// bytes sent over all peers), how long the replicas' decisions took to be sent to every peer,
// and to count at the others (one process, one clock: exact).
func reportPeerTraffic(w io.Writer, label string, nodes []*peering.Node, requests int) {
	var bytes, updates, decisions uint64
	var delays, sends [][]peering.DelayBucket
	for _, n := range nodes {
		s := n.Stats()
		bytes += s.BytesSent
		updates += s.UpdatesSent
		delays = append(delays, s.DecisionDelay)
		sends = append(sends, s.SendDelay)
	}
	d, sd := peering.MergeDelays(delays...), peering.MergeDelays(sends...)
	for _, b := range d {
		decisions += b.Count
	}
	ms := func(bs []peering.DelayBucket, q float64) float64 { return 1000 * peering.DelayQuantile(bs, q) }
	fmt.Fprintf(w, "%s: peer traffic %d update bytes for %d requests (%.0f bytes per request over all peers; %d updates sent); a decision sent to every peer after p50 %.2f / p90 %.2f / p99 %.2f ms, counted at a peer after p50 %.2f / p90 %.2f / p99 %.2f ms (%d decisions received)\n",
		label, bytes, requests, float64(bytes)/float64(max(requests, 1)), updates,
		ms(sd, 0.5), ms(sd, 0.9), ms(sd, 0.99), ms(d, 0.5), ms(d, 0.9), ms(d, 0.99), decisions)
}

// routerReplicasNote is the report's note on the arms' n prefixlb replicas: independent, or
// (peered, for the prefix arm among modes) sharing what each learned and has in flight.
func routerReplicasNote(n int, peered bool, modes []string) string {
	spread := "the load generator sent each request to the next one in turn (round-robin per request, as a Kubernetes Service in front of a Deployment)."
	if !peered || !slices.Contains(modes, "prefix") {
		return fmt.Sprintf("Each prefixlb arm ran %d independent in-process prefixlb replicas, each with its own index, in front of the same replicas; %s", n, spread)
	}
	others := ""
	if slices.ContainsFunc(modes, func(m string) bool { return m != "prefix" }) {
		others = fmt.Sprintf(" The other modes' arms ran %d independent replicas, each with its own index.", n)
	}
	return fmt.Sprintf("The prefix arm (prefix×%d+peer) ran %d in-process prefixlb replicas peered over 127.0.0.1 (package peering) in front of the same replicas: each sent the others what it learned and what it had in flight per backend every %s, so that all routed on one shared index and load view; %s%s",
		n, n, peering.DefaultFlushInterval, spread, others)
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
