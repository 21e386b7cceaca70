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
	set  *metrics.Set
	sent *metrics.Counter // learned groups sent, per peer they went to
	// received counts learned groups received, once per part of a group split across
	// packets, and a held request's decision and its later chunks twice: against sent it
	// is not a loss rate.
	received  *metrics.Counter
	bytesSent *metrics.Counter // update payload bytes sent, per peer, before framing and encryption
	bytesRecv *metrics.Counter // update payload bytes received
	dropped   *metrics.Counter // learned groups not queued (queue full)
	// sendErrors counts update packets whose send failed (the kernel refused the write,
	// an unresolvable peer address); none of that flush's updates, forgets and samples then
	// count as sent to that peer.
	sendErrors *metrics.Counter
	unknown    *metrics.Counter // learned groups received for a backend not configured here (in received too)
	bad        *metrics.Counter // decrypted messages that did not decode
	// rejected counts packets and streams memberlist refused (see levelWriter), direct
	// update packets that did not open, and streams the guard dropped.
	rejected  *metrics.Counter
	snapshots *metrics.Counter // snapshot entries imported
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
	// clock when it decided) to when this replica had recorded it, seconds; a stamp ahead of
	// this clock counts 0, and decisions that recorded nothing carry no stamp and are not
	// observed.
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

// WriteMetrics writes the node's metrics in Prometheus text format: prefixlb_peers_alive
// and the prefixlb_peer_* series of metricSet (reference: docs/metrics.md, Peering).
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
