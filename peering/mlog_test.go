package peering

import (
	"crypto/rand"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// TestLevelWriterLimits: memberlist lines are logged at most one per kind per mlogInterval,
// the next one saying how many were suppressed, cut and sanitised; rejected ones count.
func TestLevelWriterLimits(t *testing.T) {
	lg, rec := testutil.RecordingLogger()
	s := metrics.NewSet()
	rej := s.NewCounter("rejected")
	w := newLevelWriter(lg, rej)
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	forged := "[ERR] memberlist: discarding packet with unacceptable label \"" + strings.Repeat("A", 200) + "\x1b[31m\": from=127.0.0.1:5"
	steps := []struct {
		line     string
		advance  time.Duration
		logged   bool
		supp     int
		rejected uint64
	}{
		{forged, 0, true, 0, 1},
		{forged, 10 * time.Millisecond, false, 0, 2},
		{forged, 10 * time.Millisecond, false, 0, 3},
		{"[ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message from=x", 0, true, 0, 4},
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:1", 0, true, 0, 4},
		{forged, mlogInterval, true, 2, 5},
		{"[INFO] memberlist: Suspect b has failed", 0, true, 0, 5},
		{"[ERR] memberlist: cannot decode label; packet has been truncated from=127.0.0.1:9", 0, true, 0, 6},
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		if _, err := w.Write([]byte(st.line + "\n")); err != nil {
			t.Fatal(err)
		}
		got := rec.Take()
		if (len(got) == 1) != st.logged || len(got) > 1 {
			t.Fatalf("step %d: %d lines logged, want logged %v", i, len(got), st.logged)
		}
		if rej.Get() != st.rejected {
			t.Fatalf("step %d: rejected %d, want %d", i, rej.Get(), st.rejected)
		}
		if !st.logged {
			continue
		}
		line, _ := got[0].Fields["line"].(string)
		if len(line) > mlogExcerpt+len("…") || strings.ContainsAny(line, "\x1b") || strings.Contains(line, strings.Repeat("A", mlogExcerpt)) {
			t.Fatalf("step %d: line not cut or not sanitised: %q", i, line)
		}
		if st.line == forged {
			// The forger's label is not logged at all, and the sender is, whatever the cut.
			if strings.Contains(line, "AAAA") {
				t.Fatalf("step %d: the forged label reached the log: %q", i, line)
			}
			if from, _ := got[0].Fields["from"].(string); from != "127.0.0.1:5" {
				t.Fatalf("step %d: from %q, want 127.0.0.1:5 (%v)", i, from, got[0].Fields)
			}
		}
		supp, _ := got[0].Fields["suppressed"].(int64)
		if int(supp) != st.supp {
			t.Fatalf("step %d: suppressed %d, want %d (%v)", i, supp, st.supp, got[0].Fields)
		}
	}
}

// TestRedact: what a rejected line quotes is replaced, escaped quotes included, an
// unterminated quote to the end; the sender address is found after the redaction.
func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want, from string }{
		{`discarding packet with unacceptable label "secret=hunter2 from=10.0.0.9:1": from=127.0.0.1:5`, `discarding packet with unacceptable label "…": from=127.0.0.1:5`, "127.0.0.1:5"},
		{`label "a\"b" and 'c' from=[::1]:7`, `label "…" and '…' from=[::1]:7`, "[::1]:7"},
		{`unterminated "abc from=1.2.3.4:5`, `unterminated "…`, ""},
		{`no quotes here`, `no quotes here`, ""},
	} {
		got := redact(tc.in)
		if got != tc.want {
			t.Errorf("redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if f := fromOf(got); f != tc.from {
			t.Errorf("fromOf(%q) = %q, want %q", got, f, tc.from)
		}
	}
}

// TestForgedPacketsCountedNotFlooded: forged UDP packets at the peer port count in
// prefixlb_peer_packets_rejected_total and log a handful of short lines, not one each.
func TestForgedPacketsCountedNotFlooded(t *testing.T) {
	r, c := forgeryTarget(t)
	const sent = 3000
	label := append([]byte{244, 200}, []byte(strings.Repeat("A", 200))...)
	for i := 0; i < sent; i++ {
		var pkt []byte
		switch i % 3 {
		case 0:
			pkt = make([]byte, 1+12+16+20)
			pkt[0] = 1
			_, _ = rand.Read(pkt[1:])
		case 1:
			pkt = label
		default:
			pkt = []byte{0}
		}
		_, _ = c.Write(pkt)
	}
	testutil.Eventually(t, wait, "forged packets counted as rejected", func() bool {
		v, _ := strconv.Atoi(r.metric("prefixlb_peer_packets_rejected_total"))
		return v >= sent/10
	})
	drained(t, r, c)
	var lines int
	for _, e := range r.logs.Take() {
		if e.Message != "peering: memberlist" {
			continue
		}
		lines++
		if l, _ := e.Fields["line"].(string); len(l) > mlogExcerpt+len("…") {
			t.Fatalf("a logged line of %d bytes: %q", len(l), l)
		}
	}
	if lines >= sent/10 {
		t.Fatalf("%d memberlist lines for %d forged packets: not rate-limited", lines, sent)
	}
}

// TestForgedDirectPacketsCountedNotFlooded: forged direct update packets (direct.go: random
// bytes after the magic byte, one too long to be a peer's) count in
// prefixlb_peer_packets_rejected_total, each of them, and log a handful of lines of their
// own kind, none of them applied.
func TestForgedDirectPacketsCountedNotFlooded(t *testing.T) {
	r, c := forgeryTarget(t)
	const sent = 1000
	for i := 0; i < sent; i++ {
		pkt := make([]byte, directOverhead+20)
		if i%10 == 0 {
			pkt = make([]byte, maxDirectPacket+1)
		}
		pkt[0] = directMagic
		_, _ = rand.Read(pkt[1:])
		_, _ = c.Write(pkt)
	}
	// Loopback UDP may drop some when the receiver falls behind; most arrive.
	testutil.Eventually(t, wait, "forged direct packets counted as rejected", func() bool {
		v, _ := strconv.Atoi(r.metric("prefixlb_peer_packets_rejected_total"))
		return v >= sent/2
	})
	drained(t, r, c)
	lines := r.logs.WithMessage("peering: rejected update packet")
	if len(lines) == 0 || len(lines) >= sent/10 {
		t.Fatalf("%d lines for %d forged direct packets; want a few", len(lines), sent)
	}
	if got := r.metric("prefixlb_peer_updates_received_total"); got != "0" {
		t.Fatalf("%s updates received from forged packets", got)
	}
}

// drained waits (bounded) until r's transport has read every packet sent through c before:
// a load report sealed with r's secret, sent through c after them, is applied. The read loop
// takes packets in order, applies a direct one itself and hands memberlist's over one at a
// time, so by then memberlist holds every earlier one (and is through with all but the
// last). The report is sent again until it is applied: loopback UDP drops packets when the
// reader falls behind.
func drained(t *testing.T, r *replica, c net.Conn) {
	t.Helper()
	b := r.bs[0]
	before := b.PeerInFlight()
	pkt := r.node.codec.seal(nil, appendLoads(appendHeader(nil, kindUpdate, "drain"), []peerLoad{{id: b.ID, inFlight: 1}}))
	testutil.Eventually(t, wait, "a sealed load report sent after the forged packets applied", func() bool {
		_, _ = c.Write(pkt)
		return b.PeerInFlight() == before+1
	})
}

// forgeryTarget starts a replica and dials its peer port over UDP, its logs so far taken.
func forgeryTarget(t *testing.T) (*replica, net.Conn) {
	t.Helper()
	r := startReplica(t, "target", replicaOpts{})
	c, err := net.Dial("udp", r.node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	r.logs.Take()
	return r, c
}
