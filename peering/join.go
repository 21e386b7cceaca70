// Joining the peers: at the start (taking a snapshot of one's index before Ready), again
// while no peer is alive or a lost one may be back, and once with a peer back from a
// partition. A join target may accept and never answer (a frozen replica, a port flooded by
// others); memberlist.Join with several addresses tries them one after another, each up to
// its push/pull timeout, so here each target is joined on its own and the next one is not
// kept waiting (joinEach).

package peering

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/discovery"
)

// joinHedge is how long a join target has to answer before the next one is tried beside
// it: 1 s. A replica answers a join within a round trip plus making and sending its
// snapshot (at most maxSnapshotBytes: tens of milliseconds on a LAN), while one that does
// not answer would hold a join for its push/pull timeout (tcpTimeout, twice over: the
// state sent, then the answer awaited). A slow target still answers later: its attempt goes
// on beside the next.
const joinHedge = time.Second

// joinEach joins each of targets (memberlist.Join with that one address), in order, the
// next as soon as the one before has ended or after joinHedge, whichever is first. Each
// attempt's error (nil: joined) is sent on the channel, which is closed once every attempt
// has ended; no further target is started after Close. Each attempt is bounded by
// memberlist's push/pull timeout for each of its steps (dial, send, answer).
func (n *Node) joinEach(targets []string) <-chan error {
	out := make(chan error, len(targets))
	go func() {
		defer close(out)
		ended := make(chan error, len(targets))
		running := 0
		hedge := time.NewTimer(joinHedge)
		defer hedge.Stop()
	start:
		for i, a := range targets {
			running++
			go func() {
				_, err := n.ml.Join([]string{a}) // err only when it did not join
				ended <- err
			}()
			if i == len(targets)-1 {
				break
			}
			hedge.Reset(joinHedge)
			select {
			case err := <-ended:
				running--
				out <- err
			case <-hedge.C:
			case <-n.stop:
				break start
			}
		}
		for ; running > 0; running-- {
			out <- <-ended
		}
	}()
	return out
}

// initialJoin joins the configured peers, then marks ready: once a peer's snapshot is
// taken (from a join target, or from a peer that joins this replica), else after
// SnapshotTimeout.
func (n *Node) initialJoin(ctx context.Context) {
	defer n.markReady()
	targets := n.targets(ctx)
	if len(targets) == 0 {
		n.log.Info("peering: no peer to take an index snapshot from; ready with an empty index", zap.String("addr", n.addr))
		return
	}
	results := n.joinEach(targets)
	t := time.NewTimer(n.o.SnapshotTimeout)
	defer t.Stop()
	joined := func() {
		n.log.Info("peering: joined", zap.Int("peers", n.Alive()), zap.Int64("snapshot_entries", int64(n.m.snapshots.Get())))
	}
	var errs []error
	var joinErr error
	for {
		select {
		case err, more := <-results:
			switch {
			case err == nil && more, n.merged.Load():
				joined()
				return
			case more:
				errs = append(errs, err)
				continue
			}
			// No target answered; a peer that joins this replica meanwhile (its rejoin loop)
			// still brings a snapshot within the timeout.
			joinErr, results = errors.Join(errs...), nil
		case <-n.ready:
			// A peer's snapshot came first (a peer joining this replica; a join target slow
			// to answer goes on in the background), or Close.
			if n.merged.Load() {
				joined()
			}
			return
		case <-t.C:
			if joinErr != nil {
				fields := []zap.Field{zap.Strings("peers", targets), zap.Duration("waited", n.o.SnapshotTimeout), zap.Error(joinErr)}
				if secretMismatch(joinErr) {
					fields = append(fields, zap.String("hint", secretHint))
				}
				n.log.Warn("peering: no peer answered; ready with an empty index", fields...)
				return
			}
			n.log.Warn("peering: no index snapshot within the timeout; ready with what this replica has",
				zap.Duration("timeout", n.o.SnapshotTimeout), zap.Strings("peers", targets))
			return
		case <-n.stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

// targets returns the configured peers' addresses (the static list and the DNS name's
// records), this replica's own left out in any spelling (isSelf).
func (n *Node) targets(ctx context.Context) []string {
	var out []string
	for _, a := range n.o.Join {
		if !n.isSelf(ctx, a) {
			out = append(out, a)
		}
	}
	if n.o.DNS != "" {
		_, port, _ := splitHostPort(n.o.Listen)
		if _, ap, err := net.SplitHostPort(n.addr); err == nil {
			port, _ = strconv.Atoi(ap)
		}
		d := &discovery.DNS{Name: n.o.DNS, Port: port, Resolver: n.o.Resolver, Timeout: n.o.SnapshotTimeout}
		urls, err := d.Resolve(ctx)
		if err != nil {
			n.log.Debug("peering: DNS", zap.Error(err))
		}
		for _, u := range urls {
			a := strings.TrimPrefix(u, discovery.DefaultScheme+"://")
			if !n.isSelf(ctx, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// rejoinLoop joins dead peers again, and the configured ones while no peer is alive; never
// an address a live peer has (a dead peer's replacement there already holds the index, and
// every join is a full snapshot exchange).
func (n *Node) rejoinLoop(ctx context.Context) {
	t := time.NewTicker(n.o.RejoinInterval)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.rejoins.Add(1)
		select {
		case <-n.ready:
		default:
			continue // the initial join is still on
		}
		now := time.Now()
		var targets []string
		n.mu.Lock()
		live := make(map[string]bool, len(n.members))
		for _, m := range n.members {
			live[m.Address()] = true
		}
		for name, l := range n.lost {
			if now.Sub(l.since) > lostForget || live[l.addr] {
				delete(n.lost, name)
				continue
			}
			targets = append(targets, l.addr)
		}
		none := len(n.members) == 0
		n.mu.Unlock()
		if none {
			targets = append(targets, n.targets(ctx)...)
		}
		if len(targets) == 0 {
			continue
		}
		for err := range n.joinEach(targets) {
			if err != nil {
				n.log.Debug("peering: rejoin failed", zap.Error(err))
			}
		}
	}
}

// exchange runs one push/pull (both indexes' snapshots) with the peer at addr.
func (n *Node) exchange(addr string) {
	select {
	case <-n.stop:
		return
	default:
	}
	if _, err := n.ml.Join([]string{addr}); err != nil {
		n.log.Debug("peering: snapshot exchange after a peer's return failed", zap.String("peer", addr), zap.Error(err))
	}
}
