// Sending and receiving: the flusher's batches, the receiver, and the join snapshot.

package peering

import (
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prefixlb/prefixlb/backend"
	"go.uber.org/zap"
)

// flushLoop sends what was learned since the last flush and the local loads (when they
// changed, and every loadKeepalive while any is not zero, idleRepeats times more once none
// is) to every live peer. It sleeps until something changes or falls due (flusher.flush).
// A decision (a Learn or Unlearn queued: the queue's kick) that finds it idle goes out at
// once, and the flusher then ticks every FlushInterval while decisions keep coming, each
// tick sending what came since the last; a change of the local load alone (a request here
// begins, gets its first byte or ends: backend.NotifyLoad, loadKick) goes a FlushInterval
// after it, with whatever else changed meanwhile. So at most one flush per FlushInterval
// under load, and between changes only the keepalives. Prefill samples wait for a packet's
// worth or samplesMaxDelay (samplesDue).
//
// It does not poll every FlushInterval while a request is in flight: that would wake each
// replica 1000 times a second for the seconds an LLM request streams. Load changes wait
// because a flush at once would run at the worst moment, right after a first byte being
// relayed (the woken flusher runs next on that processor). Decisions tick rather than wait
// out a FlushInterval each: a Go timer fires no sooner than ~1 ms however short (the
// netpoller waits whole milliseconds), so a decision made between two flushes would reach
// the peers a whole timer later instead of half a tick on average.
func (n *Node) flushLoop() {
	f := flusher{n: n}
	t := time.NewTimer(loadKeepalive)
	defer t.Stop()
	ticking := false // the last flush carried decisions: the next goes a FlushInterval later
	for {
		kicked := false // woken by a change (a kick), not by its timer
		if ticking {
			select {
			case <-n.stop:
				return
			case <-t.C:
			}
		} else {
			select {
			case <-n.stop:
				return
			case <-t.C:
			case <-n.q.kick:
				kicked = true
			case <-n.loadKick:
				kicked = true
				t.Reset(n.o.FlushInterval)
				select {
				case <-n.stop:
					return
				case <-t.C:
				case <-n.q.kick: // a decision meanwhile goes at once
				}
			}
		}
		n.flushes.Add(1)
		for _, c := range []chan struct{}{n.q.kick, n.loadKick} {
			select {
			case <-c: // what it signalled is taken now
			default:
			}
		}
		now := n.now()
		next, decided := f.flush(now)
		if ticking = decided; ticking {
			next = n.o.FlushInterval
		}
		if n.flushed != nil {
			n.flushed(now, kicked, next)
		}
		t.Reset(next)
	}
}

// idleRepeats is how many times a replica whose loads fell to none repeats that report, a
// loadKeepalive apart, before it stops: a lost report of none would otherwise leave its peers
// counting requests that ended until the last busy report expires (loadTTL).
const idleRepeats = 2

// flusher is flushLoop's state between flushes, with the buffers it reuses.
type flusher struct {
	n            *Node
	items        []queued
	hashes       []uint64
	loads        []peerLoad
	last         []peerLoad // as last sent
	lastSent     time.Time
	lastApply    time.Time
	quiet        int // reports of no load sent in a row (idleRepeats)
	packets      [][]byte
	sealed       []byte // the direct packet being sent
	samples      []backend.PrefillSample
	shared       []peerSample // prefill samples not sent yet, the oldest taken at samplesSince
	samplesSince time.Time
}

// flush sends what is due at now and returns how long the flusher may sleep, short of a
// change, before something else falls due (the next keepalive, the held samples'
// samplesMaxDelay, or loadKeepalive: the peers' reports expire on that beat, loads.apply),
// and whether it took decisions to send.
func (f *flusher) flush(now time.Time) (time.Duration, bool) {
	n := f.n
	f.items, f.hashes = n.q.take(f.items, f.hashes)
	learned, forgets := 0, 0
	for _, it := range f.items {
		if it.forget {
			forgets++
		} else {
			learned++
		}
	}
	set := n.backends.Load()
	if now.Sub(f.lastApply) >= loadKeepalive {
		n.loads.apply(set.byID, now) // expire stale peers' reports
		f.lastApply = now
	}
	f.loads = f.loads[:0]
	for _, b := range set.list {
		f.loads = append(f.loads, peerLoad{id: b.ID, inFlight: b.InFlight(), prefill: b.PrefillTokens()})
	}
	// A backend no longer configured whose last report was busy is reported idle once: the
	// peers merge reports by backend and would count it until this replica's reports stop.
	for _, l := range f.last {
		if l.busy() && set.byID[l.id] == nil {
			f.loads = append(f.loads, peerLoad{id: l.id})
		}
	}
	pending := len(f.shared)
	for _, b := range set.list {
		f.samples = b.TakePrefillSamples(f.samples[:0])
		for _, x := range f.samples {
			f.shared = append(f.shared, peerSample{id: b.ID, work: x.Work, ttft: int64(x.TTFT)})
		}
	}
	if pending == 0 && len(f.shared) > 0 {
		f.samplesSince = now
	}
	sendLoads := !slices.Equal(f.loads, f.last) || f.keepalive() && now.Sub(f.lastSent) >= loadKeepalive
	sendSamples, wholeOnly := samplesDue(f.shared, now.Sub(f.samplesSince))
	if learned+forgets > 0 || sendSamples || sendLoads {
		f.send(now, learned, forgets, sendLoads, sendSamples, wholeOnly)
	}
	// Deadlines passed unmet (no live peer took the keepalive) wait for loadKeepalive.
	next := loadKeepalive
	if d := f.lastSent.Add(loadKeepalive).Sub(now); f.keepalive() && !f.lastSent.IsZero() && d > 0 {
		next = min(next, d)
	}
	if d := f.samplesSince.Add(samplesMaxDelay).Sub(now); len(f.shared) > 0 && d > 0 {
		next = min(next, d)
	}
	return max(next, n.o.FlushInterval), learned+forgets > 0
}

// keepalive reports whether the loads last sent are repeated every loadKeepalive: while busy,
// and idleRepeats times once none.
func (f *flusher) keepalive() bool { return busy(f.last) || f.quiet <= idleRepeats }

// send sends this flush's learned prompts and forgets, with the loads and due prefill
// samples, to every live peer; with none, what was learned stays this replica's own.
func (f *flusher) send(now time.Time, learned, forgets int, sendLoads, sendSamples, wholeOnly bool) {
	n := f.n
	peers := n.livePeers()
	if len(peers) == 0 {
		f.shared = f.shared[:0]
		return
	}
	f.packets = f.packets[:0]
	if sendLoads {
		f.packets = n.encode(f.packets, f.loads, f.items, f.hashes)
		f.last = append(f.last[:0], f.loads...)
		f.lastSent = now
		if busy(f.loads) {
			f.quiet = 0
		} else {
			f.quiet++
		}
	} else if learned+forgets > 0 {
		f.packets = n.encode(f.packets, nil, f.items, f.hashes)
	}
	sentSamples, updates := 0, len(f.packets)
	if sendSamples {
		// Due by size only: whole messages, the rest (this flush's take: what waited
		// before it was under a message's worth) waits on.
		f.packets, sentSamples = encodeSamples(f.packets, f.shared, wholeOnly)
		f.shared = append(f.shared[:0], f.shared[sentSamples:]...)
		f.samplesSince = now
	}
	everyPeer := true // every packet went to every live peer
	for _, p := range peers {
		failed := false
		for _, pkt := range f.packets {
			var err error
			if f.sealed, err = n.sendUpdate(f.sealed, p, pkt); err != nil {
				n.m.sendErrors.Inc()
				n.log.Debug("peering: send", zap.String("peer", p.Name), zap.Error(err))
				failed = true
				continue
			}
			n.m.bytesSent.Add(len(pkt))
		}
		if failed {
			everyPeer = false
			continue // what the packets held is counted only where all of them went out
		}
		n.m.sent.Add(learned)
		n.m.forgetsSent.Add(forgets)
		n.m.samplesSent.Add(sentSamples)
		n.samplesMsgs.Add(uint64(len(f.packets) - updates))
	}
	if learned > 0 && everyPeer {
		// Once per decision: its first item (the Learn's, or a Hold's), which carries its
		// work; the chunks of a held request after its Release carry work 0 (counted and
		// stamped at its Hold).
		done := time.Now()
		for _, it := range f.items {
			if !it.forget && it.work > 0 {
				observeSince(n.m.sendDelay, it.stamp, done)
			}
		}
	}
}

// sendUpdate sends the update msg to peer p as a direct packet (direct.go), sealed in buf's
// storage, and returns that storage (the transport's WriteTo must not keep it: netTransport
// writes it to the socket before it returns); through memberlist when this transport has no
// direct path or p does not take direct packets (its metadata: a replica of an older
// version).
func (n *Node) sendUpdate(buf []byte, p *memberlist.Node, msg []byte) ([]byte, error) {
	if !n.direct || !takesDirect(p.Meta) {
		return buf, n.ml.SendBestEffort(p, msg)
	}
	buf = n.codec.seal(buf, msg)
	_, err := n.tr.WriteTo(buf, p.Address())
	return buf, err
}

// samplesRoom is the bytes of sample records one samples message holds: packetBudget less
// the message's version, kind and count (appendSamples). A record takes 10–28 bytes
// (peerSample.wireBytes), typically 14–16: about 85 samples a message.
const samplesRoom = packetBudget - 2 - binaryMaxVarint

// samplesMaxDelay is how long the flusher holds a prefill sample it took before it sends it
// short of a message's worth: loadKeepalive (100 ms), the idle flusher's period, so that an
// idle flusher's next wake-up sends it. A sample observed while the flusher sleeps waits in
// the backend (backend.TakePrefillSamples) until that wake-up too: at most about twice
// loadKeepalive from its first token to the peers.
//
// The flusher sends prefill samples a full message at a time (samplesRoom bytes of records)
// or once the oldest it holds has waited samplesMaxDelay. Samples only teach the peers'
// prefill models (backend.PrefillModel), which a tenth of a second does not age, while a
// samples message per 1 ms flush would be a large share of a busy replica's packets (bench
// overhead, prefixlb-prefix-peer), each a send and an encryption here and a wake-up and a
// decryption on every peer. Samples held when the node stops are dropped.
const samplesMaxDelay = loadKeepalive

// samplesDue reports whether the flusher sends the prefill samples ss it holds (the oldest
// taken age ago), and whether only full messages (due by size alone): see samplesMaxDelay.
func samplesDue(ss []peerSample, age time.Duration) (send, wholeOnly bool) {
	if len(ss) > 0 && age >= samplesMaxDelay {
		return true, false
	}
	size := 0
	for _, x := range ss {
		size += x.wireBytes()
	}
	return size >= samplesRoom, true
}

// busy reports whether loads hold a request in flight or prefill work: a report of none
// needs no keepalive once repeated (idleRepeats), since a peer counts an expired report as
// none too (loadTTL).
func busy(loads []peerLoad) bool { return slices.ContainsFunc(loads, peerLoad.busy) }

// busy reports whether l holds a request in flight or prefill work.
func (l peerLoad) busy() bool { return l.inFlight != 0 || l.prefill != 0 }

// encode packs loads (nil: none) and items into packets of at most packetBudget bytes,
// reusing the packets' buffers. A prompt that does not fit the room left is split, its
// deepest part first, so that the receiver records its shallower chunks last (most recent),
// as one Record of the whole prompt would.
func (n *Node) encode(packets [][]byte, loads []peerLoad, items []queued, hashes []uint64) [][]byte {
	start := func(withLoads []peerLoad) {
		buf := appendHeader(spareBuffer(packets), kindUpdate, n.name)
		buf = appendLoads(buf, withLoads)
		packets = append(packets, buf)
	}
	// Loads of many backends take several packets: recordBytes each at most.
	perPacket := max((packetBudget-len(appendHeader(nil, kindUpdate, n.name))-binaryMaxVarint)/recordBytes, 1)
	for first := true; first || len(loads) > 0; first = false {
		k := min(len(loads), perPacket)
		start(loads[:k])
		loads = loads[k:]
	}
	for _, it := range items {
		hs := hashes[it.off : it.off+it.n]
		if len(hs) == 0 { // a decision on a prompt held whole: the group alone
			if packetBudget-len(packets[len(packets)-1]) < groupOverhead {
				start(nil)
			}
			packets[len(packets)-1] = appendGroup(packets[len(packets)-1], it.id, it.stamp, it.work, it.class, nil)
			continue
		}
		for len(hs) > 0 {
			cur := packets[len(packets)-1]
			room := (packetBudget - len(cur) - groupOverhead) / hashBytes
			if room < min(len(hs), minGroupHashes) {
				start(nil)
				continue
			}
			part := hs[max(len(hs)-room, 0):]
			if it.forget {
				packets[len(packets)-1] = appendForget(cur, it.id, it.stamp, part)
			} else {
				packets[len(packets)-1] = appendGroup(cur, it.id, it.stamp, it.work, it.class, part)
			}
			hs = hs[:len(hs)-len(part)]
		}
	}
	return packets
}

// encodeSamples appends to packets samples messages of at most packetBudget bytes carrying
// ss in order, as many records a message as fit, reusing the packets' buffers past the end,
// and returns how many samples it encoded: all of them, or with whole only those that fill
// their messages (the last message is left out when another record could still fit in it).
func encodeSamples(packets [][]byte, ss []peerSample, whole bool) ([][]byte, int) {
	sent := 0
	for len(ss) > 0 {
		k, size := 0, 0
		for k < len(ss) && size+ss[k].wireBytes() <= samplesRoom {
			size += ss[k].wireBytes()
			k++
		}
		k = max(k, 1) // a record is at most recordBytes, far under samplesRoom
		if whole && k == len(ss) && size+recordMinBytes <= samplesRoom {
			break // the last message would not be full: those wait
		}
		packets = append(packets, appendSamples(spareBuffer(packets), ss[:k]))
		ss, sent = ss[k:], sent+k
	}
	return packets, sent
}

// spareBuffer is the emptied buffer of the packet past packets' end, kept from an earlier
// flush, or nil.
func spareBuffer(packets [][]byte) []byte {
	if len(packets) < cap(packets) {
		return packets[:len(packets)+1][len(packets)][:0]
	}
	return nil
}

// minGroupHashes: a prompt is split only into parts of at least 16 hashes, unless fewer are
// left; below that a new packet is started.
const minGroupHashes = 16

// binaryMaxVarint is the most bytes of one uvarint.
const binaryMaxVarint = 10

// delegate is memberlist's Delegate: the receiver and the join snapshot.
type delegate struct{ n *Node }

// NodeMeta says whether this replica takes direct packets (metaDirect) and whether it is
// closing (metaLeaving); it takes leaving notices (metaNotices).
func (d delegate) NodeMeta(int) []byte {
	meta := metaNotices
	if d.n.direct {
		meta |= metaDirect
	}
	if d.n.closing.Load() {
		meta |= metaLeaving
	}
	return []byte{meta}
}

func (d delegate) GetBroadcasts(_, _ int) [][]byte     { return nil }
func (d delegate) NotifyMsg(buf []byte)                { d.n.receive(buf) }
func (d delegate) LocalState(join bool) []byte         { return d.n.snapshot(join) }
func (d delegate) MergeRemoteState(buf []byte, j bool) { d.n.merge(buf, j) }

// receive applies one peer's update: its loads, and its learned prompts recorded in this
// replica's index for the backend of the same ID (unknown IDs are ignored). Nothing is
// forwarded: every replica sends only what it learned itself.
func (n *Node) receive(buf []byte) {
	n.recvMu.Lock()
	defer n.recvMu.Unlock()
	n.m.bytesRecv.Add(len(buf))
	set := n.backends.Load()
	if len(buf) >= 2 && buf[0] == wireVersion {
		switch buf[1] {
		case kindSamples:
			n.receiveSamples(buf, set)
			return
		case kindLeaving:
			n.receiveLeaving(buf)
			return
		}
	}
	now := n.now()
	idx := n.pol.Index()
	var sender string
	err := decodeUpdate(buf, &n.recvLoads, &n.recvHashes,
		func(from string, ls []peerLoad) {
			sender = from
			if sender != n.name && len(ls) > 0 {
				n.loads.report(sender, ls, now, set.byID)
			}
		},
		func(g group, hs []uint64) {
			if g.forget {
				n.m.forgetsRecv.Inc()
			} else {
				n.m.received.Inc()
			}
			b := set.byID[g.id]
			if b == nil {
				n.m.unknown.Inc()
				n.warnUnknown("update", sender, g.id, set)
				return
			}
			if g.forget {
				for _, local := range n.recent.forget(sender, g.id, g.stamp, now) {
					idx.Forget(hs, b, local)
				}
				return
			}
			// Work 0 is a decision counted already (router.Prefix.RoutedWork is ≥ 1): the
			// chunks of a request held to settle, whose decision came first (settle.go), or
			// such a group cancelled before its flush.
			counted := g.work == 0
			if len(hs) == 0 {
				// A decision on a prompt held whole, with nothing to learn, or held to settle:
				// never split.
				if !counted {
					n.countDecision(b, g, now)
				}
				return
			}
			if n.recent.forgotten(sender, g.id, g.stamp) {
				return // a part that arrived after the group's forget
			}
			// A peer's clock ahead of this one's must not stamp the future.
			local := idx.RecordNew(hs, b, time.Unix(0, min(g.stamp, now.UnixNano())))
			if n.recent.add(sender, g.id, g.stamp, local, now) && !counted {
				// One decision per group, not per part of a prompt split across packets,
				// which memberlist may hand over in any order.
				n.countDecision(b, g, now)
			}
		})
	if err != nil {
		n.m.bad.Inc()
		n.log.Debug("peering: invalid update", zap.Error(err))
	}
}

// warnUnknown logs that a peer's update or snapshot (what) named a backend ID this replica
// does not have, with this replica's backends to compare with the peer's configuration: at
// most once a second for each of what.
func (n *Node) warnUnknown(what, sender string, id uint64, set *backendSet) {
	ok, suppressed := n.mlog.allow("unknown backend " + what)
	if !ok {
		return
	}
	names := make([]string, 0, min(len(set.list), maxNamesLogged))
	for _, b := range set.list[:min(len(set.list), maxNamesLogged)] {
		names = append(names, b.Name)
	}
	fields := []zap.Field{zap.String("peer", sanitize(sender, maxNameBytes)), zap.String("backend_id", fmt.Sprintf("%016x", id)),
		zap.Strings("backends_here", names)}
	if suppressed > 0 {
		fields = append(fields, zap.Int("suppressed", suppressed))
	}
	n.log.Warn("peering: a peer's "+what+" names a backend this replica does not have (an ID from its URL); give every replica the same backend URLs", fields...)
}

// maxNamesLogged bounds the backend names a warning lists.
const maxNamesLogged = 16

// countDecision counts a peer's decision g on b: in b's recent share
// (router.Prefix.NotePeerRouted), in the arrivals that settling reads (settle.go), and in
// the decision delay (measured now that it counts).
func (n *Node) countDecision(b *backend.Backend, g group, now time.Time) {
	n.pol.NotePeerRouted(b, g.work)
	n.arrivals.add(arrival{id: b.ID, stamp: g.stamp, work: g.work, class: g.class, arrived: now.UnixNano()})
	observeSince(n.m.delay, g.stamp, time.Now())
}

// receiveSamples folds a peer's prefill observations into the models of the backends they
// name (unknown IDs are ignored); they are not kept for this replica's own peers (each
// replica sends only what it observed itself).
func (n *Node) receiveSamples(buf []byte, set *backendSet) {
	err := decodeSamples(buf, &n.recvSample)
	for _, x := range n.recvSample {
		n.m.samplesRecv.Inc()
		if b := set.byID[x.id]; b != nil {
			b.ObservePrefill(x.work, time.Duration(x.ttft))
		} else {
			n.m.unknown.Inc()
		}
	}
	if err != nil {
		n.m.bad.Inc()
		n.log.Debug("peering: invalid prefill samples", zap.Error(err))
	}
}

// snapshot is the join push/pull's state (kindAgedSnapshot): the index's most recent entries
// per backend with their ages, in all at most maxSnapshotBytes. Periodic push/pulls carry
// nothing (the updates keep the peers current; a rejoin after a partition is a join).
func (n *Node) snapshot(join bool) []byte {
	if !join {
		return nil
	}
	n.pushes.Add(1)
	set := n.backends.Load()
	if len(set.list) == 0 {
		return nil
	}
	// An entry takes its hash and an age of nominalAgeBytes (ages most often differ by less
	// than 2 s, 3 bytes); a snapshot whose ages took more is taken again with fewer entries.
	const nominalAgeBytes = 3
	per := (maxSnapshotBytes/len(set.list) - groupOverhead) / (hashBytes + nominalAgeBytes)
	for {
		exp := n.pol.Index().Export(set.list, per)
		taken := n.now().UnixNano()
		size := 2
		for _, e := range exp {
			size += groupOverhead + (hashBytes+nominalAgeBytes)*len(e.Hashes)
		}
		buf := appendHeader(make([]byte, 0, size+len(n.name)), kindAgedSnapshot, n.name)
		for _, e := range exp {
			buf = appendAgedGroup(buf, e.ID, e.Hashes, e.Used, taken)
		}
		if len(buf) > maxSnapshotBytes && per > 1 {
			per = max(int(float64(per)*float64(maxSnapshotBytes)/float64(len(buf))*0.95), 1) // ≤ 0 would export all
			continue
		}
		return buf
	}
}

// merge takes a peer's join snapshot into the index, each entry placed by its age among this
// replica's own (index.Merge; an older replica's snapshot, without ages, as of now:
// index.Import), and marks the replica ready: a peer answered. This replica's own snapshot,
// come back over a join to itself (a join target naming it in a spelling isSelf missed), is
// not taken.
func (n *Node) merge(buf []byte, join bool) {
	if !join || len(buf) == 0 {
		return
	}
	set := n.backends.Load()
	now := n.now()
	idx := n.pol.Index()
	var entries int
	var used []int64
	own, from := false, ""
	err := decodeSnapshot(buf, func(sender string) bool {
		own, from = sender == n.name, sender
		return !own
	}, func(id uint64, hs []uint64, ages []time.Duration) {
		b := set.byID[id]
		switch {
		case b == nil:
			if len(hs) > 0 {
				n.warnUnknown("snapshot", from, id, set)
			}
		case ages == nil: // an older replica's: every entry as of now
			entries += idx.Import(b, hs, now)
		default:
			used = used[:0]
			for _, a := range ages {
				used = append(used, now.Add(-a).UnixNano())
			}
			entries += idx.Merge(b, hs, used)
		}
	})
	if own {
		n.log.Debug("peering: own index snapshot not imported (a join target is this replica)", zap.Int("bytes", len(buf)))
		return
	}
	n.m.snapshots.Add(entries)
	if err != nil {
		n.m.bad.Inc()
		n.log.Warn("peering: invalid index snapshot", zap.Error(err))
		if entries == 0 {
			return
		}
	}
	n.log.Info("peering: index snapshot imported", zap.Int("entries", entries), zap.Int("bytes", len(buf)))
	n.merged.Store(true)
	n.markReady()
}
