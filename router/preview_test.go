package router

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// previewWorld is one mode's Decider over its own two backends, as the proxy builds it.
type previewWorld struct {
	d  *Decider
	bs []*backend.Backend
}

// newPreviewWorld builds mode ("shadow <mode>" for a shadow beside it) over two fresh backends.
func newPreviewWorld(t *testing.T, mode string) previewWorld {
	t.Helper()
	var p Policy
	var err error
	if m, ok := strings.CutPrefix(mode, "shadow "); ok {
		actual, aerr := NewPolicy(m, PolicyOptions{})
		if aerr != nil {
			t.Fatal(aerr)
		}
		p, err = NewShadow(ShadowPrefix, m, actual, PolicyOptions{})
	} else {
		p, err = NewPolicy(mode, PolicyOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	w := previewWorld{d: NewDecider(p), bs: prefixBackends(t, 2)}
	w.d.SetBackends(w.bs)
	return w
}

// state is what the world's policy counts: its shadow's totals, its prefix policy's mean
// prefill work, and each backend's recent share.
func (w previewWorld) state() string {
	st, _ := w.d.ShadowStats()
	var p *Prefix
	switch pol := w.d.Policy().(type) {
	case *Prefix:
		p = pol
	case *Shadow:
		p = pol.prefix
	}
	var mean float64
	if p != nil {
		mean = p.meanWork.Mean()
	}
	s := fmt.Sprintf("shadow %+v mean work %v", st, mean)
	for _, b := range w.bs {
		var recent float64
		if p != nil {
			recent = p.RecentWork(b)
		}
		s += fmt.Sprintf(" %s recent %v", b.Name, recent)
	}
	return s
}

// run sends requests (8 conversations' first turns and passthrough requests, alternating),
// each learned where it went, with previews previews of it before each pick; it returns the
// decisions picked. Every preview must be the decision picked right after it.
func (w previewWorld) run(t *testing.T, previews int) []Decision {
	t.Helper()
	var out []Decision
	for i := range 8 {
		k := routedKey(chunkChain(nil).extend(fmt.Sprint("conversation ", i), 4))
		k.Model = []byte("m")
		if i%2 == 1 {
			k = &key.Key{Model: []byte("m")} // passthrough: /v1/models, /v1/rerank, …
		}
		var seen []Decision
		for range previews {
			seen = append(seen, w.d.Preview(k, w.bs))
		}
		d := w.d.Pick(k, w.bs)
		for j, p := range seen {
			if p != d {
				t.Errorf("request %d: preview %d said %s (%v), the pick after it %s (%v)", i, j, p.Backend.Name, p, d.Backend.Name, d)
			}
		}
		tk := w.d.Ticket(k)
		tk.Send(d.Backend, d.MatchedChunks)
		out = append(out, d)
	}
	return out
}

// TestPreviewRecordsNothing: in every mode, shadow included, /debug/route's Preview returns
// the decision the next Pick makes and records nothing: with previews between the requests
// they go where they go without any (round-robin and passthrough turns, least-load's rotation,
// the prefix policy's recent share and mean work, the shadow's decision counters unmoved).
func TestPreviewRecordsNothing(t *testing.T) {
	for _, mode := range []string{"prefix", "round-robin", "least-load", "shadow round-robin", "shadow least-load"} {
		t.Run(mode, func(t *testing.T) {
			plain := newPreviewWorld(t, mode)
			want := plain.run(t, 0)
			for _, previews := range []int{1, 3} {
				w := newPreviewWorld(t, mode)
				got := w.run(t, previews)
				for i := range want {
					if got[i].Backend.Name != want[i].Backend.Name || got[i].Reason != want[i].Reason {
						t.Errorf("%d previews each: request %d went to %s (%s), without previews to %s (%s)",
							previews, i, got[i].Backend.Name, got[i].Reason, want[i].Backend.Name, want[i].Reason)
					}
				}
				if g, w := w.state(), plain.state(); g != w {
					t.Errorf("%d previews each: state\n%s\nwithout previews\n%s", previews, g, w)
				}
			}
			if st, ok := plain.d.ShadowStats(); ok && st.Agree+st.Disagree != 4 {
				t.Errorf("shadow decisions %d, want the 4 routed requests", st.Agree+st.Disagree)
			}
		})
	}
}

// TestShadowCorrectsItsIndex: in shadow mode the index that learns where requests went also
// corrects itself from the cached tokens the backends report (Learner.Correct, through a
// ticket as the proxy makes the call): a backend that reports none of a prompt it was listed
// as holding has lost it and what it cached before it, and the index forgets those
// (TestPrefixCorrect).
func TestShadowCorrectsItsIndex(t *testing.T) {
	bs := prefixBackends(t, 2)
	sh := newTestShadow(t, bs)
	d := NewDecider(sh)
	earlier := routedKey(chunkChain(nil).extend("earlier conversation", 8))
	k := routedKey(chunkChain(nil).extend("conversation", 8))
	sh.Learn(earlier, bs[0], 0)
	sh.Learn(k, bs[0], 0)
	tk := d.Ticket(k)
	tk.Send(bs[0], 8)
	if n := tk.Report(k.PromptTokens, 0); n == 0 {
		t.Error("the shadow corrected nothing from a report of no cached tokens")
	}
	out := make([]int, 2)
	if sh.Index().Match(earlier.Chunks, bs, out); out[0] != 0 {
		t.Errorf("after the report of none cached the index still lists %d chunks of the earlier prompt on %s", out[0], bs[0].Name)
	}
}

// TestShadowOverStackCandidates: the shadow evaluates pools larger than the candidates a pick
// holds on the stack (maxStackCandidates), as the prefix policy routes them.
func TestShadowOverStackCandidates(t *testing.T) {
	const n = 40
	bs := prefixBackends(t, n)
	sh := newTestShadow(t, bs)
	for i := range 2 * n {
		k := routedKey(chunkChain(nil).extend(fmt.Sprint("conversation ", i%n), 4))
		d := sh.Pick(k, bs)
		sh.Learn(k, d.Backend, d.MatchedChunks)
	}
	st, _ := sh.ShadowStats()
	if st.Agree+st.Disagree != 2*n || st.ShadowPrefixTokens == 0 {
		t.Errorf("over %d backends: %d decisions evaluated (want %d), shadow tokens %d (want the second turns found)",
			n, st.Agree+st.Disagree, 2*n, st.ShadowPrefixTokens)
	}
}
