package peering

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// TestSamplesWire: a samples message decodes to what was encoded; a truncated one is an error
// after the samples it held whole; an update is not a samples message.
func TestSamplesWire(t *testing.T) {
	in := []peerSample{{id: 1, work: 50_000, ttft: int64(3 * time.Second)}, {id: 1<<63 + 5, work: 0, ttft: 1}}
	buf := appendSamples(nil, in)
	var out []peerSample
	if err := decodeSamples(buf, &out); err != nil || len(out) != 2 || out[0] != in[0] || out[1] != in[1] {
		t.Fatalf("round trip: %v %+v, want %+v", err, out, in)
	}
	if err := decodeSamples(buf[:len(buf)-1], &out); err == nil || len(out) != 1 || out[0] != in[0] {
		t.Fatalf("truncated: %v %+v, want an error after the first sample", err, out)
	}
	if err := decodeSamples(appendHeader(nil, kindUpdate, "a"), &out); err == nil {
		t.Fatal("an update decoded as samples")
	}
	// Many samples take several packets, each within the budget.
	many := make([]peerSample, 500)
	for i := range many {
		many[i] = peerSample{id: ^uint64(0), work: 1<<63 - 1, ttft: 1<<63 - 1} // the widest varints
	}
	pkts := encodeSamples(nil, many)
	total := 0
	for _, p := range pkts {
		if len(p) > packetBudget {
			t.Fatalf("packet of %d bytes, budget %d", len(p), packetBudget)
		}
		if err := decodeSamples(p, &out); err != nil {
			t.Fatal(err)
		}
		total += len(out)
	}
	if len(pkts) < 2 || total != len(many) {
		t.Fatalf("%d packets carrying %d samples, want several carrying %d", len(pkts), total, len(many))
	}
}

// TestPeersSharePrefillSamples: a streamed request's time to first token through one replica
// teaches every peer's model of that backend, and only once (nothing is forwarded back).
func TestPeersSharePrefillSamples(t *testing.T) {
	rs := cluster(t, 3)
	url := backendURLs[1]
	var l backend.Lease
	l.Begin(rs[0].byName(url), 20_000, 0, true)
	time.Sleep(20 * time.Millisecond)
	l.FirstByte()
	l.Release()
	for i, r := range rs {
		testutil.Eventually(t, wait, "every replica's model of the backend has the sample", func() bool {
			return r.byName(url).Prefill().Samples() == 1
		})
		if n := r.byName(backendURLs[0]).Prefill().Samples(); n != 0 {
			t.Fatalf("replica %d: %d samples on another backend", i, n)
		}
	}
	testutil.Eventually(t, wait, "r0 counts one sample sent per peer (2)", func() bool {
		return rs[0].metric("prefixlb_peer_prefill_samples_sent_total") == "2"
	})
	time.Sleep(50 * time.Millisecond) // a sample echoed back would have arrived by now
	for i, r := range rs {
		if n := r.byName(url).Prefill().Samples(); n != 1 {
			t.Fatalf("replica %d: %d samples, want 1 (nothing forwarded)", i, n)
		}
	}
	if got := rs[1].metric("prefixlb_peer_prefill_samples_sent_total"); got != "0" {
		t.Fatalf("r1 sent %s samples, want none: it observed nothing itself", got)
	}
}

// TestSamplesDue: prefill samples go out a packet's worth at a time, or once the oldest has
// waited samplesMaxDelay.
func TestSamplesDue(t *testing.T) {
	for _, c := range []struct {
		n    int
		age  time.Duration
		want bool
	}{
		{0, time.Hour, false},
		{1, 0, false},
		{1, samplesMaxDelay - time.Nanosecond, false},
		{1, samplesMaxDelay, true},
		{samplesPerPacket - 1, time.Millisecond, false},
		{samplesPerPacket, 0, true},
		{3 * samplesPerPacket, 0, true},
	} {
		if got := samplesDue(c.n, c.age); got != c.want {
			t.Errorf("samplesDue(%d, %v) = %v, want %v", c.n, c.age, got, c.want)
		}
	}
}

// TestSamplesBatched: prefill samples observed a few milliseconds apart, while a request in
// flight keeps the flusher ticking every FlushInterval, reach the peer in one or two samples
// messages (a message per flush that took one would be about one per sample), and all of
// them arrive.
func TestSamplesBatched(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	url := backendURLs[0]
	var busy backend.Lease
	busy.Begin(a.byName(url), 100, 0, true)
	defer busy.Release()
	const n = 12
	before := a.node.samplesMsgs.Load()
	for range n {
		var l backend.Lease
		l.Begin(a.byName(url), 5_000, 0, true)
		time.Sleep(2 * time.Millisecond)
		l.FirstByte()
		l.Release()
	}
	testutil.Eventually(t, wait, "b's model of the backend has every sample", func() bool {
		return b.byName(url).Prefill().Samples() == n
	})
	// 12 samples over ~24 ms (more on a slow machine) against samplesMaxDelay (100 ms): one
	// message, or a few if the machine stalled the loop past the delay.
	if got := a.node.samplesMsgs.Load() - before; got > 3 {
		t.Fatalf("%d samples took %d samples messages, want at most 3", n, got)
	}
}
