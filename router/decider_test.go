package router

import (
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// newTestDecider wraps a new policy of mode over bs.
func newTestDecider(t *testing.T, mode string, bs []*backend.Backend) *Decider {
	t.Helper()
	p, err := NewPolicy(mode, PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := NewDecider(p)
	d.SetBackends(bs)
	return d
}

// Requests that are not prefix-routed go round-robin in every mode, on a counter of their
// own: the least loaded is not preferred, and the mode's own round-robin is not advanced.
func TestDeciderPassthrough(t *testing.T) {
	for _, mode := range ModeNames() {
		t.Run(mode, func(t *testing.T) {
			bs := prefixBackends(t, 3)
			d := newTestDecider(t, mode, bs)
			var rs inflight
			defer rs.releaseAll()
			rs.begin(bs[0], 10)
			rs.begin(bs[1], 10)
			var got []*backend.Backend
			for range 3 {
				dec := d.Pick(&key.Key{}, bs)
				if dec.Reason != ReasonPassthrough {
					t.Errorf("not routed: reason %s, want passthrough", dec.Reason)
				}
				got = append(got, dec.Backend)
			}
			if !slices.Equal(got, bs) {
				t.Errorf("passthrough picked %v, want each backend in turn", names(got))
			}
			if mode == "round-robin" {
				if dec := d.Pick(routedKey(nil), bs); dec.Backend != bs[0] || dec.Reason != ReasonRoundRobin {
					t.Errorf("the mode's first pick after 3 passthroughs: %s on %s, want round-robin on %s (its own counter)",
						dec.Reason, dec.Backend.Name, bs[0].Name)
				}
			}
		})
	}
}

// A routed body that did not parse is placed by the mode's policy as a key without chunks,
// labelled parse-fallback, and not learned.
func TestDeciderParseFallback(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		idle   bool // the fallback goes to the idle backend
		learns bool // a parsed key is learned
	}{
		{"prefix", true, true},
		{"least-load", true, false},
		{"round-robin", false, false},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			bs := prefixBackends(t, 3)
			d := newTestDecider(t, tc.mode, bs)
			var rs inflight
			defer rs.releaseAll()
			rs.begin(bs[0], 10)
			rs.begin(bs[1], 10)
			unparsed := &key.Key{Routed: true}
			dec := d.Pick(unparsed, bs)
			if dec.Reason != ReasonParseFallback || dec.Backend == nil || dec.MatchedChunks != 0 {
				t.Errorf("unparsed: %+v, want parse-fallback with a backend and no match", dec)
			}
			if tc.idle && dec.Backend != bs[2] {
				t.Errorf("unparsed: on %s, want the idle %s", dec.Backend.Name, bs[2].Name)
			}
			if tk := d.Ticket(unparsed); tk.Learns() {
				t.Errorf("an unparsed key is learned")
			}
			if tk := d.Ticket(routedKey(chunkChain{}.extend("p", 4))); tk.Learns() != tc.learns {
				t.Errorf("a parsed key learned: %v, want %v", tk.Learns(), tc.learns)
			}
		})
	}
}

// A retry of a round-robin or passthrough decision takes the candidate at the request's
// sequence number among those left, keeping the reason and leaving the shared counter; other
// retries pick again.
func TestDeciderRepick(t *testing.T) {
	chunks := chunkChain{}.extend("p", 4)
	for _, tc := range []struct {
		name     string
		mode     string
		k        *key.Key
		inTurn   bool   // the retry is the seq-th of the candidates left
		reason   Reason // of the retry
		advances bool   // the retry advanced the mode's round-robin counter
	}{
		{"round-robin", "round-robin", routedKey(chunks), true, ReasonRoundRobin, false},
		{"passthrough", "round-robin", &key.Key{}, true, ReasonPassthrough, false},
		{"round-robin unparsed", "round-robin", &key.Key{Routed: true}, false, ReasonParseFallback, true},
		{"prefix", "prefix", routedKey(chunks), false, ReasonCold, false},
		{"least-load", "least-load", routedKey(chunks), false, ReasonLeastLoad, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := prefixBackends(t, 4)
			d := newTestDecider(t, tc.mode, bs)
			first := d.Pick(tc.k, bs)
			left := slices.DeleteFunc(slices.Clone(bs), func(b *backend.Backend) bool { return b == first.Backend })
			const seq = 7
			retry := d.Repick(tc.k, first, left, seq)
			if !slices.Contains(left, retry.Backend) {
				t.Fatalf("retry on %v, not among the candidates left %v", retry.Backend, names(left))
			}
			if tc.inTurn && retry.Backend != left[seq%len(left)] {
				t.Errorf("retry on %s, want %s (sequence %d among %d left)", retry.Backend.Name, left[seq%len(left)].Name, seq, len(left))
			}
			if retry.Reason != tc.reason {
				t.Errorf("retry reason %s, want %s", retry.Reason, tc.reason)
			}
			if tc.mode == "round-robin" {
				// The mode's counter advanced by the first pick (not a passthrough one) and by
				// a retry that picked again.
				n := 0
				if tc.k.Routed {
					n++
				}
				if tc.advances {
					n++
				}
				want := bs[n]
				if next := d.Policy().Pick(routedKey(chunks), bs); next.Backend != want {
					t.Errorf("the next request's pick: %s, want %s (retry advanced the counter: %v)", next.Backend.Name, want.Name, tc.advances)
				}
			}
		})
	}
}

// The Decider finds the policy's abilities: the prefix policy's index gets the backends;
// round-robin has neither index nor learning.
func TestDeciderAbilities(t *testing.T) {
	bs := prefixBackends(t, 2)
	d := newTestDecider(t, "prefix", bs)
	ix := d.Index()
	if ix == nil {
		t.Fatal("prefix: no index")
	}
	if st := ix.Stats(nil); len(st) != len(bs) {
		t.Errorf("prefix: index has %d backends after SetBackends of %d", len(st), len(bs))
	}
	rr := newTestDecider(t, "round-robin", bs)
	if tk := rr.Ticket(routedKey(chunkChain{}.extend("p", 2))); rr.Index() != nil || tk.Learns() {
		t.Errorf("round-robin: index %v, learns %v; want none", rr.Index(), tk.Learns())
	}
}

// The table of modes: names in order, the default first, each building its own policy.
func TestModes(t *testing.T) {
	want := []string{"prefix", "round-robin", "least-load"}
	if got := ModeNames(); !slices.Equal(got, want) || got[0] != DefaultMode {
		t.Errorf("ModeNames %v, want %v, the default %q first", got, want, DefaultMode)
	}
	for _, tc := range []struct {
		name string
		is   func(Policy) bool
	}{
		{"prefix", func(p Policy) bool { _, ok := p.(*Prefix); return ok }},
		{"round-robin", func(p Policy) bool { _, ok := p.(*RoundRobin); return ok }},
		{"least-load", func(p Policy) bool { _, ok := p.(*LeastLoad); return ok }},
	} {
		p, err := NewPolicy(tc.name, PolicyOptions{})
		if err != nil || !tc.is(p) {
			t.Errorf("NewPolicy(%q) = %T, %v", tc.name, p, err)
		}
	}
	_, err := NewPolicy("fastest", PolicyOptions{})
	if err == nil || !strings.Contains(err.Error(), `"fastest"`) || !strings.Contains(err.Error(), strings.Join(want, ", ")) {
		t.Errorf("unknown mode: error %v, want one naming it and the modes", err)
	}
}

func names(bs []*backend.Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		if b != nil {
			out[i] = b.Name
		}
	}
	return out
}
