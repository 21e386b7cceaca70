package router

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

func TestCheckShadow(t *testing.T) {
	cases := []struct{ shadow, mode, err string }{
		{"", "prefix", ""},
		{"", "round-robin", ""},
		{"prefix", "round-robin", ""},
		{"prefix", "least-load", ""},
		{"prefix", "prefix", `runs only beside mode round-robin or least-load, not mode "prefix"`},
		{"oracle", "round-robin", `"oracle" is not a shadow policy`},
	}
	for _, c := range cases {
		err := CheckShadow(c.shadow, c.mode)
		if (c.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("CheckShadow(%q, %q) = %v, want %q", c.shadow, c.mode, err, c.err)
		}
	}
	if _, err := NewShadow("prefix", "prefix", NewPrefix(PrefixOptions{}, nil), PolicyOptions{}); err == nil {
		t.Error("NewShadow beside mode prefix: no error")
	}
}

// newTestShadow is a shadow beside round-robin over bs.
func newTestShadow(t testing.TB, bs []*backend.Backend) *Shadow {
	t.Helper()
	s, err := NewShadow(ShadowPrefix, "round-robin", &RoundRobin{}, PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.SetBackends(bs)
	return s
}

// The shadow never changes the backend: a shadowed round-robin picks exactly what a plain
// one does, request by request, while its index learns the actual placements and its
// counters show that the prefix policy would have found the conversations' earlier turns.
func TestShadowKeepsRoutingAndCountsTheSaving(t *testing.T) {
	bs := prefixBackends(t, 3)
	sh := newTestShadow(t, bs)
	plain := &RoundRobin{}
	const conversations, turns, chunksPerTurn = 4, 5, 3
	convs := make([]chunkChain, conversations)
	requests := 0
	for turn := range turns {
		for i := range convs {
			convs[i] = convs[i].extend(fmt.Sprintf("conversation %d turn %d", i, turn), chunksPerTurn)
			k := routedKey(convs[i])
			k.Model = []byte("m")
			d := sh.Pick(k, bs)
			if want := plain.Pick(k, bs).Backend; d.Backend != want {
				t.Fatalf("request %d: shadowed round-robin picked %s, plain %s", requests, d.Backend.Name, want.Name)
			}
			if d.Reason != ReasonRoundRobin {
				t.Errorf("request %d: reason %v, want round-robin", requests, d.Reason)
			}
			sh.Learn(k, d.Backend, d.MatchedChunks)
			requests++
		}
	}
	st, _ := sh.ShadowStats()
	if st.Agree+st.Disagree != uint64(requests) || st.Disagree == 0 {
		t.Errorf("decisions agree %d disagree %d, want %d in all, some disagreeing", st.Agree, st.Disagree, requests)
	}
	if !(st.ShadowPrefixTokens > st.ActualPrefixTokens) || !(st.ShadowPredictedTTFTSeconds < st.ActualPredictedTTFTSeconds) {
		t.Errorf("no saving shown: %+v", st)
	}
	// Every turn after the first holds (chunksPerTurn × turn) chunks somewhere: the shadow
	// finds them all, round-robin over 3 backends with 4 conversations never returns a
	// conversation to its previous backend.
	var want uint64
	for turn := 1; turn < turns; turn++ {
		want += uint64(conversations * key.PrefixTokens(chunksPerTurn*turn, key.DefaultChunkTokens))
	}
	if st.ShadowPrefixTokens != want {
		t.Errorf("shadow prefix tokens %d, want %d (every earlier turn found)", st.ShadowPrefixTokens, want)
	}
}

// A key without chunks (unparsed, or shorter than a chunk) is not evaluated.
func TestShadowSkipsKeysWithoutChunks(t *testing.T) {
	bs := prefixBackends(t, 2)
	sh := newTestShadow(t, bs)
	for _, k := range []*key.Key{{Routed: true, OK: false}, {Routed: true, OK: true}} {
		if d := sh.Pick(k, bs); d.Backend == nil {
			t.Fatal("no backend")
		}
	}
	if st, _ := sh.ShadowStats(); st != (ShadowStats{}) {
		t.Errorf("stats %+v after keys without chunks, want none", st)
	}
}

// Round-robin keeps one turn per model: two models alternating on one pool of two backends
// each still alternate between the backends.
func TestRoundRobinTurnsPerModel(t *testing.T) {
	bs := prefixBackends(t, 2)
	rr := &RoundRobin{}
	a, b := &key.Key{Model: []byte("alpha")}, &key.Key{Model: []byte("beta")}
	if rrSlot(a) == rrSlot(b) {
		t.Fatal("test models share a slot; pick others")
	}
	got := map[string]map[string]int{"alpha": {}, "beta": {}}
	for range 4 {
		got["alpha"][rr.Pick(a, bs).Backend.Name]++
		got["beta"][rr.Pick(b, bs).Backend.Name]++
	}
	for m, per := range got {
		if len(per) != 2 {
			t.Errorf("model %s went to %v, want both backends", m, per)
		}
	}
}

// BenchmarkShadowPick is the shadow's cost on the request path against a plain round-robin
// pick: one prefix evaluation (index match over 8 candidates, estimate) per request.
func BenchmarkShadowPick(b *testing.B) {
	bs := prefixBackends(b, 8)
	for _, name := range []string{"round-robin", "shadow"} {
		b.Run(name, func(b *testing.B) {
			var pol Policy = &RoundRobin{}
			var learn func(*key.Key, *backend.Backend, int)
			if name == "shadow" {
				sh := newTestShadow(b, bs)
				pol, learn = sh, func(k *key.Key, be *backend.Backend, held int) { sh.Learn(k, be, held) }
			}
			keys := make([]*key.Key, 128)
			for i := range keys {
				keys[i] = routedKey(chunkChain(nil).extend(fmt.Sprint("conversation ", i), 16)) // 1k tokens
				if learn != nil {
					learn(keys[i], bs[i%len(bs)], 0)
				}
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				pol.Pick(keys[i%len(keys)], bs)
			}
		})
	}
}
