package peering

import (
	"cmp"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// metricSet is the node's Prometheus metrics.
type metricSet struct {
	set       *metrics.Set
	sent      *metrics.Counter // learned groups sent, per peer they went to
	received  *metrics.Counter // learned groups received
	bytesSent *metrics.Counter // update payload bytes sent, per peer
	bytesRecv *metrics.Counter // update payload bytes received
	dropped   *metrics.Counter // learned groups not queued (queue full)
	// sendErrors counts update packets whose send failed (the kernel refused the write,
	// an unresolvable peer address).
	sendErrors *metrics.Counter
	unknown    *metrics.Counter // learned groups received for a backend not configured here
	bad        *metrics.Counter // messages that did not decode
	rejected   *metrics.Counter // packets and streams memberlist refused (see levelWriter)
	snapshots  *metrics.Counter // snapshot entries imported
	// streamsDropped counts inbound streams the peer port's guard dropped, by reason
	// (guard.go); each counts in rejected too.
	streamsDropped map[dropReason]*metrics.Counter
	// forgetsSent and forgetsRecv count withdrawn Learns (a backend refused the request),
	// sent per peer and received.
	forgetsSent *metrics.Counter
	forgetsRecv *metrics.Counter
	// samplesSent and samplesRecv count prefill observations sent per peer and received.
	samplesSent *metrics.Counter
	samplesRecv *metrics.Counter
	// settles counts holds for SettleWait (up to two per request: a request decided again
	// may be held again); resettles the holds decided again because a peer's decision on
	// their backend that ranks ahead of them (settle.go's rank) arrived meanwhile.
	settles   *metrics.Counter
	resettles *metrics.Counter
	// delay is how long a peer's decision took to count here: from its stamp (the sender's
	// clock when it decided) to when this replica had recorded it, seconds.
	delay *metrics.Histogram
	// sendDelay is how long this replica's own decisions took to go out: from the stamp
	// (its Learn, or a held request's Hold) to the flush that held it written to every live
	// peer, seconds; a flush whose send to a peer failed, or with no live peer, is not
	// observed. Against delay at the peers, it tells a slow sender (its flusher waiting for
	// a core) from a slow path or receiver.
	sendDelay *metrics.Histogram
}

func newMetrics(alive func() float64) metricSet {
	s := metrics.NewSet()
	s.NewGauge("prefixlb_peers_alive", alive)
	dropped := make(map[dropReason]*metrics.Counter, len(dropReasons))
	for _, r := range dropReasons {
		dropped[r] = s.NewCounter(`prefixlb_peer_streams_dropped_total{reason="` + string(r) + `"}`)
	}
	return metricSet{
		streamsDropped: dropped,
		set:            s,
		sent:           s.NewCounter("prefixlb_peer_updates_sent_total"),
		received:       s.NewCounter("prefixlb_peer_updates_received_total"),
		bytesSent:      s.NewCounter("prefixlb_peer_bytes_sent_total"),
		bytesRecv:      s.NewCounter("prefixlb_peer_bytes_received_total"),
		dropped:        s.NewCounter("prefixlb_peer_updates_dropped_total"),
		sendErrors:     s.NewCounter("prefixlb_peer_send_errors_total"),
		unknown:        s.NewCounter("prefixlb_peer_updates_unknown_backend_total"),
		bad:            s.NewCounter("prefixlb_peer_messages_invalid_total"),
		rejected:       s.NewCounter("prefixlb_peer_packets_rejected_total"),
		snapshots:      s.NewCounter("prefixlb_peer_snapshot_entries_imported_total"),

		forgetsSent: s.NewCounter("prefixlb_peer_forgets_sent_total"),
		forgetsRecv: s.NewCounter("prefixlb_peer_forgets_received_total"),
		samplesSent: s.NewCounter("prefixlb_peer_prefill_samples_sent_total"),
		samplesRecv: s.NewCounter("prefixlb_peer_prefill_samples_received_total"),
		settles:     s.NewCounter("prefixlb_peer_settles_total"),
		resettles:   s.NewCounter("prefixlb_peer_resettles_total"),
		delay:       s.NewHistogram("prefixlb_peer_decision_delay_seconds"),
		sendDelay:   s.NewHistogram("prefixlb_peer_send_delay_seconds"),
	}
}

// WriteMetrics writes the node's metrics in Prometheus text format:
// prefixlb_peers_alive (gauge: live peers, this replica not counted),
// prefixlb_peer_updates_sent_total / _received_total (learned requests' chunk lists: sent
// counted once per request and peer sent to; received once per group taken from a packet,
// so a long prompt split across packets counts once a part, and a held request's decision
// and its chunks sent later count twice: the two are not a loss rate), prefixlb_peer_bytes_sent_total / _received_total (update payload
// bytes, before framing and encryption: 41 bytes a direct packet, direct.go),
// prefixlb_peer_updates_dropped_total (queue full), prefixlb_peer_send_errors_total (update
// packets whose send failed; none of that flush's updates, forgets and samples then count as
// sent to that peer), prefixlb_peer_updates_unknown_backend_total (groups for a backend not
// configured here, counted as received too; logged at most once a second: the replicas'
// backend URLs differ), prefixlb_peer_messages_invalid_total (decrypted updates that did not
// decode), prefixlb_peer_packets_rejected_total (packets and streams memberlist refused before
// they reached this package: not decryptable with the secret, mislabelled, truncated,
// oversized; each also a memberlist log line, at most one a second per kind; and direct
// update packets that did not open, each kind of those a "peering: rejected update packet"
// line at most once a second; and the inbound streams the peer port's guard dropped),
// prefixlb_peer_streams_dropped_total{reason} (those streams by reason, guard.go: idle, no
// frame header within Options.HandshakeTimeout; slow, the first frame under 2 MiB/s past
// it; invalid, not an encrypted memberlist frame or one over 17 MiB; per_source, over 8
// unauthenticated streams from one address; busy, over 256 in all, or a large frame without
// a stream slot within 3 s; too_long, a stream past 17 MiB; each reason a "peering: inbound
// stream dropped" warning at most once a second),
// prefixlb_peer_snapshot_entries_imported_total, and prefixlb_peer_forgets_sent_total /
// _received_total (Learns withdrawn after the update went out: the backend refused the
// request; counted once per peer sent to), prefixlb_peer_prefill_samples_sent_total /
// _received_total (prefill observations, time to first token against the work, that each
// replica shares so that all learn a backend's prefill rate from every request; sent counted
// once per peer), and prefixlb_peer_settles_total / _resettles_total (holds for
// Options.SettleWait, up to two per request; those decided again, settle.go), and
// prefixlb_peer_decision_delay_seconds (histogram: from a peer's decision, by its clock, to
// this replica having recorded it; between machines it includes their clocks' offset, and
// a decision stamped ahead of this clock counts 0; decisions that recorded nothing carry no
// stamp and are not observed), and prefixlb_peer_send_delay_seconds (histogram: from this
// replica's decision, its Learn or a held request's Hold, to the flush holding it written to
// every live peer; one clock; flushes a peer missed are not observed).
func (n *Node) WriteMetrics(w io.Writer) { n.m.set.WritePrometheus(w) }

// Stats are the node's counters (those of WriteMetrics).
type Stats struct {
	PeersAlive      int
	UpdatesSent     uint64
	UpdatesReceived uint64
	BytesSent       uint64
	BytesReceived   uint64
	SnapshotEntries uint64
	// DecisionDelay are the buckets of prefixlb_peer_decision_delay_seconds with counts, in
	// increasing order.
	DecisionDelay []DelayBucket
	// SendDelay are those of prefixlb_peer_send_delay_seconds.
	SendDelay []DelayBucket
}

// DelayBucket is one bucket of a delay histogram: Count observations above the previous
// bucket's Upper and at most this Upper (seconds).
type DelayBucket struct {
	Upper float64
	Count uint64
}

// Stats returns the node's counters now.
func (n *Node) Stats() Stats {
	return Stats{PeersAlive: n.Alive(), UpdatesSent: n.m.sent.Get(), UpdatesReceived: n.m.received.Get(),
		BytesSent: n.m.bytesSent.Get(), BytesReceived: n.m.bytesRecv.Get(), SnapshotEntries: n.m.snapshots.Get(),
		DecisionDelay: buckets(n.m.delay), SendDelay: buckets(n.m.sendDelay)}
}

// observeSince observes in h the seconds from a decision's stamp (unix ns) to now, 0 for a
// stamp ahead; a decision without a stamp (0: a Learn that recorded nothing) is not observed.
func observeSince(h *metrics.Histogram, stamp int64, now time.Time) {
	if stamp != 0 {
		h.Update(max(now.Sub(time.Unix(0, stamp)), 0).Seconds())
	}
}

// buckets are h's non-empty buckets in increasing order (VictoriaMetrics' vmrange buckets,
// 18 a decade).
func buckets(h *metrics.Histogram) []DelayBucket {
	var out []DelayBucket
	h.VisitNonZeroBuckets(func(vmrange string, count uint64) {
		_, hi, ok := strings.Cut(vmrange, "...")
		if up, err := strconv.ParseFloat(hi, 64); ok && err == nil {
			out = append(out, DelayBucket{Upper: up, Count: count})
		}
	})
	return MergeDelays(out) // sorted
}

// DelayQuantile is the upper bound of the bucket holding quantile q (0..1) of bs (sorted by
// Upper, as Stats gives them; several nodes' merged with MergeDelays); 0 for none.
func DelayQuantile(bs []DelayBucket, q float64) float64 {
	var total uint64
	for _, b := range bs {
		total += b.Count
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for _, b := range bs {
		if seen += b.Count; seen >= max(rank, 1) {
			return b.Upper
		}
	}
	return bs[len(bs)-1].Upper
}

// MergeDelays sums several nodes' delay buckets (alike bounds: the same histogram kind).
func MergeDelays(all ...[]DelayBucket) []DelayBucket {
	sum := map[float64]uint64{}
	for _, bs := range all {
		for _, b := range bs {
			sum[b.Upper] += b.Count
		}
	}
	out := make([]DelayBucket, 0, len(sum))
	for up, c := range sum {
		out = append(out, DelayBucket{Upper: up, Count: c})
	}
	slices.SortFunc(out, func(a, b DelayBucket) int { return cmp.Compare(a.Upper, b.Upper) })
	return out
}
