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
	pkts, sent := encodeSamples(nil, many, false)
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
	if len(pkts) < 2 || total != len(many) || sent != len(many) {
		t.Fatalf("%d packets carrying %d samples, want several carrying %d", len(pkts), total, len(many))
	}
}

// TestPeersSharePrefillSamples: a streamed request's time to first token through one replica
// teaches every peer's model of that backend, and only once (nothing is forwarded back).
func TestPeersSharePrefillSamples(t *testing.T) {
	rs := clusterOpts(t, 3, replicaOpts{recordFlushes: true})
	url := backendURLs[1]
	var l backend.Lease
	l.Begin(rs[0].byName(url), 20_000, 0, true)
	time.Sleep(20 * time.Millisecond) // the point: a time to first token to sample
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
	// An echo would be taken by the peer's first flush since the sample arrived, and sent
	// (and counted) by its first flush samplesMaxDelay after that one.
	arrived := time.Now()
	for i, r := range rs[1:] {
		r.flushedSince(t, r.flushedSince(t, arrived).at.Add(samplesMaxDelay))
		if got := r.metric("prefixlb_peer_prefill_samples_sent_total"); got != "0" {
			t.Fatalf("r%d sent %s samples, want none: it observed nothing itself", i+1, got)
		}
	}
	for i, r := range rs {
		if n := r.byName(url).Prefill().Samples(); n != 1 {
			t.Fatalf("replica %d: %d samples, want 1 (nothing forwarded)", i, n)
		}
	}
}

// TestSamplesDue: prefill samples go out a full message at a time, or all of them once the
// oldest has waited samplesMaxDelay.
func TestSamplesDue(t *testing.T) {
	typical := peerSample{id: 7, work: 5_000, ttft: int64(120 * time.Millisecond)}
	per := samplesRoom / typical.wireBytes() // a full message of typical records
	fill := func(n int) []peerSample {
		ss := make([]peerSample, n)
		for i := range ss {
			ss[i] = typical
		}
		return ss
	}
	for _, c := range []struct {
		n               int
		age             time.Duration
		send, wholeOnly bool
	}{
		{0, time.Hour, false, true},
		{1, 0, false, true},
		{1, samplesMaxDelay - time.Nanosecond, false, true},
		{1, samplesMaxDelay, true, false},
		{per, time.Millisecond, false, true},
		{per + 1, 0, true, true},
		{3 * per, 0, true, true},
		{3 * per, samplesMaxDelay, true, false},
	} {
		send, whole := samplesDue(fill(c.n), c.age)
		if send != c.send || (send && whole != c.wholeOnly) {
			t.Errorf("samplesDue(%d samples, %v) = %v, %v; want %v, %v", c.n, c.age, send, whole, c.send, c.wholeOnly)
		}
	}
}

// TestSamplesPacking: samples pack by their records' real size (about 85 typical ones a
// message, not the 47 of the widest); whole sends only full messages and keeps the rest;
// wireBytes is what appendRecord writes.
func TestSamplesPacking(t *testing.T) {
	for _, x := range []peerSample{{1, 0, 0}, {1, 127, 128}, {1, 50_000, int64(3 * time.Second)}, {^uint64(0), 1<<63 - 1, 1<<63 - 1}} {
		if got, want := x.wireBytes(), len(appendRecord(nil, x.id, x.work, x.ttft)); got != want {
			t.Errorf("%+v: wireBytes %d, appendRecord writes %d", x, got, want)
		}
	}
	typical := peerSample{id: 7, work: 5_000, ttft: int64(120 * time.Millisecond)} // 8+2+4 bytes
	ss := make([]peerSample, 200)
	for i := range ss {
		ss[i] = typical
	}
	per := samplesRoom / typical.wireBytes()
	pkts, sent := encodeSamples(nil, ss, false)
	var out []peerSample
	if err := decodeSamples(pkts[0], &out); err != nil || len(out) != per || sent != len(ss) {
		t.Fatalf("first message %d samples (%v), want %d; sent %d of %d", len(out), err, per, sent, len(ss))
	}
	pkts, sent = encodeSamples(nil, ss, true)
	if len(pkts) != len(ss)/per || sent != len(pkts)*per {
		t.Fatalf("whole: %d messages, %d sent; want %d full messages", len(pkts), sent, len(ss)/per)
	}
	if pkts, sent = encodeSamples(nil, ss[:per-1], true); len(pkts) != 0 || sent != 0 {
		t.Fatalf("whole with under a message's worth: %d messages, %d sent; want none", len(pkts), sent)
	}
	if pkts, sent = encodeSamples(nil, ss[:per], true); len(pkts) != 1 || sent != per {
		t.Fatalf("whole with exactly a message's worth: %d messages, %d sent; want 1, %d", len(pkts), sent, per)
	}
}

// TestSamplesBatched: prefill samples observed a few milliseconds apart, each request's
// begin, first byte and end waking the flusher (a flush or two per sample), reach the peer
// in one or two samples messages (a message per flush that took one would be about one per
// sample), and all of them arrive.
func TestSamplesBatched(t *testing.T) {
	rs := cluster(t, 2)
	a, b := rs[0], rs[1]
	url := backendURLs[0]
	const n = 12
	before, flushes := a.node.samplesMsgs.Load(), a.node.flushes.Load()
	for range n {
		var l backend.Lease
		l.Begin(a.byName(url), 5_000, 0, true)
		time.Sleep(2 * time.Millisecond) // the point: a time to first token to sample
		l.FirstByte()
		l.Release()
	}
	testutil.Eventually(t, wait, "b's model of the backend has every sample", func() bool {
		return b.byName(url).Prefill().Samples() == n
	})
	// 12 samples over ~24 ms (more on a slow machine) against samplesMaxDelay (100 ms): one
	// message, or a few if the machine stalled the loop past the delay.
	got, ticks := a.node.samplesMsgs.Load()-before, a.node.flushes.Load()-flushes
	if got > 3 {
		t.Fatalf("%d samples took %d samples messages over %d flushes, want at most 3", n, got, ticks)
	}
	if ticks < n/2 {
		t.Logf("only %d flushes while %d samples were observed: a slow machine; the batching went untested", ticks, n)
	}
}
