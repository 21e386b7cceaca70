// The peers as memberlist tells of them: who is alive, who was lost or left (and how it was
// known), and the leaving notice a closing replica sends first.

package peering

import (
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

// sendLeaving sends this replica's leaving notice (kindLeaving) to each live peer that takes
// one (metaNotices: not a replica of an older version, which would count it invalid), once,
// by UDP: a lost one leaves the metadata to say it.
func (n *Node) sendLeaving() {
	msg := appendHeader(nil, kindLeaving, n.name)
	for _, m := range n.livePeers() {
		if takesNotices(m.Meta) {
			_ = n.ml.SendBestEffort(m, msg)
		}
	}
}

// leavingNoticeTTL is how long a peer's leaving notice says that its departure is one: a
// leave takes at most leaveTimeout; a peer that sent one and never left is lost after this.
const leavingNoticeTTL = 10 * leaveTimeout

// receiveLeaving notes a peer's leaving notice for setMember.
func (n *Node) receiveLeaving(buf []byte) {
	name, err := decodeLeaving(buf)
	if err != nil {
		n.m.bad.Inc()
		n.log.Debug("peering: invalid leaving notice", zap.Error(err))
		return
	}
	if name == n.name {
		return
	}
	now := n.now()
	n.mu.Lock()
	defer n.mu.Unlock()
	for p, at := range n.leaving { // notices of peers that never left
		if now.Sub(at) > leavingNoticeTTL {
			delete(n.leaving, p)
		}
	}
	n.leaving[name] = now
}

// setMember records a live or gone peer m (a copy: copyNode; left: its metadata said it was
// leaving; so does a recent leaving notice) and logs the loss of the last one and the
// return of the first. A departure's line says how it was known to be one (by: notice or
// metadata).
func (n *Node) setMember(m *memberlist.Node, alive, left bool) {
	by := "metadata"
	name, addr := m.Name, m.Address()
	if name == n.name || n.closing.Load() {
		// A closing replica's view of its peers no longer matters, and is wrong: its own
		// probes fail once its sockets are closed, and memberlist's suspicion timers still
		// fire after its Shutdown, declaring live peers dead (the bench's shutdowns logged
		// "peer lost" for the survivors).
		return
	}
	n.mu.Lock()
	_, back := n.lost[name]
	_, wasMember := n.members[name]
	if alive {
		n.members[name] = m
		delete(n.lost, name)
		delete(n.leaving, name) // a notice from before this join is not about it
		// A replica restarted at a dead one's address under a new name replaces it.
		for lname, l := range n.lost {
			if l.addr == addr {
				delete(n.lost, lname)
			}
		}
	} else {
		if at, ok := n.leaving[name]; ok {
			if n.now().Sub(at) <= leavingNoticeTTL {
				left, by = true, "notice"
			}
			delete(n.leaving, name)
		}
		delete(n.members, name)
		// Memberlist does not say here whether the peer died or left (Node.State is not
		// updated for the event; a peer closing says so in its metadata first, left): either
		// is joined again until lostForget, which costs a refused connection every
		// RejoinInterval for a peer that is gone for good, and finds one restarted at its
		// address whose own join list lacks this replica.
		n.lost[name] = lostPeer{addr: addr, since: time.Now()}
	}
	n.publishPeers()
	count := len(n.members)
	was := n.alone
	n.alone = count == 0
	n.mu.Unlock()
	// One line per peer lost (or left: a warning only for a loss) and per peer back; a
	// further one when the last is gone and when the first is back.
	level := zap.WarnLevel
	if left {
		level = zap.InfoLevel
	}
	switch {
	case !alive && wasMember && left:
		n.log.Info("peering: peer left", zap.String("peer", name), zap.String("addr", addr), zap.Int("peers", count), zap.String("by", by))
	case !alive && wasMember:
		n.log.Warn("peering: peer lost", zap.String("peer", name), zap.String("addr", addr), zap.Int("peers", count))
	case alive && back:
		n.log.Info("peering: peer back", zap.String("peer", name), zap.String("addr", addr), zap.Int("peers", count))
	case alive && !wasMember:
		n.log.Info("peering: peer joined", zap.String("peer", name), zap.String("addr", addr), zap.Int("peers", count))
	}
	switch {
	case count == 0 && !was:
		n.log.Log(level, "peering: no live peers; routing on this replica's own state", zap.String("last", name))
	case count > 0 && was:
		n.log.Info("peering: peers regained", zap.Int("peers", count), zap.String("first", name))
	}
	if !alive {
		if set := n.backends.Load(); set != nil {
			n.loads.forget(name, n.now(), set.byID)
		}
	}
	if alive && back {
		// A peer lost and back (a healed partition, which memberlist may notice by itself
		// before the rejoin loop joins it) exchanges snapshots once, so that what each side
		// learned meanwhile converges. Not from here: memberlist's state is locked.
		go n.exchange(addr)
	}
}

// events is memberlist's EventDelegate. It is called with memberlist's state locked: it must
// not call back into memberlist.
type events struct{ n *Node }

// NotifyLeave's node carries the last metadata the peer announced: a closing one's says it
// is leaving (metaLeaving).
func (e events) NotifyJoin(m *memberlist.Node) { e.n.setMember(copyNode(m), true, false) }
func (e events) NotifyLeave(m *memberlist.Node) {
	e.n.setMember(copyNode(m), false, leavingMeta(m.Meta))
}
func (e events) NotifyUpdate(m *memberlist.Node) { e.n.updateMember(copyNode(m)) }

// copyNode copies a member as memberlist hands it to the event delegate, under its lock:
// the nodes that Memberlist.Members returns are memberlist's own, which it updates (address,
// metadata) under that lock, so that reading them outside it races.
func copyNode(m *memberlist.Node) *memberlist.Node {
	c := *m
	c.Addr = slices.Clone(m.Addr)
	c.Meta = slices.Clone(m.Meta)
	return &c
}

// updateMember replaces a live peer's copy after memberlist updated it (its metadata: a
// replica closing, or one that took direct packets and no longer does after a restart).
func (n *Node) updateMember(m *memberlist.Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.members[m.Name]; ok {
		n.members[m.Name] = m
		n.publishPeers()
	}
}

// publishPeers makes the flusher's list of live peers (livePeers) from members. Called with
// n.mu held.
func (n *Node) publishPeers() {
	ps := make([]*memberlist.Node, 0, len(n.members))
	for _, m := range n.members {
		ps = append(ps, m)
	}
	n.peers.Store(&ps)
}

// livePeers are the live peers, as memberlist last told of them (copies, not to be
// modified): what the flusher sends to. A suspect peer is one until memberlist declares it
// dead (NotifyLeave): it may be slow, not gone, and its updates keep it converged.
func (n *Node) livePeers() []*memberlist.Node {
	if ps := n.peers.Load(); ps != nil {
		return *ps
	}
	return nil
}
