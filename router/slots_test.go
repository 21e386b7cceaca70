package router

import (
	"fmt"
	"math"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
)

func TestRecentSum(t *testing.T) {
	type add struct {
		at uint64
		w  float64
	}
	tests := []struct {
		name string
		adds []add
		now  uint64
		want float64
	}{
		{"zero value", nil, 10, 0},
		{"one event now", []add{{5, 1}}, 5, 1},
		{"one half-life ago", []add{{0, 1}}, 128, 0.5},
		{"two half-lives ago", []add{{0, 1}}, 256, 0.25},
		{"two events apart", []add{{0, 1}, {128, 1}}, 128, 1.5},
		{"read before the last add", []add{{0, 1}, {128, 1}}, 64, 1.5},
		{"weighted", []add{{0, 4000}, {128, 10}}, 128, 2010},
		{"a negative weight counts 0", []add{{0, 2}, {128, -5}}, 128, 1},
		{"an add behind the clock is not decayed again", []add{{128, 1}, {0, 1}}, 128, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r recentSum
			for _, a := range tt.adds {
				r.Add(a.at, 128, a.w)
			}
			if got := r.Value(tt.now, 128); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Value(%d) = %v, want %v", tt.now, got, tt.want)
			}
		})
	}
}

// TestRecentShareFollowsBackends: the policy keeps a recent share per backend ID, as its
// index keeps a slot: a backend decided for before SetBackends listed it (the pool is swapped
// first) is counted from that decision, SetBackends keeps the shares of the backends it
// still lists and drops the others', and a backend listed again starts afresh, as a new
// Backend with that URL would.
func TestRecentShareFollowsBackends(t *testing.T) {
	bs, p := aloneAutoPrefix(t, 3)
	late, err := backend.New("http://10.0.0.9:8000", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	late.SetOtherSenders(backend.SendersAlone)
	p.SetBackends(bs[:2])
	for i, b := range []*backend.Backend{bs[0], bs[1], bs[2], late} {
		p.NotePeerRouted(b, 0) // not counted: CountPeerRoutes is off
		p.noteRouted(b, int64(100*(i+1)))
	}
	for i, b := range []*backend.Backend{bs[0], bs[1], bs[2], late} {
		want := float64(100*(i+1)) * math.Exp2(-float64(3-i)/RecentHalfLife)
		if got := p.RecentWork(b); math.Abs(got-want) > 1e-9 {
			t.Fatalf("%s: recent work %v, want %v", b.Name, got, want)
		}
	}
	p.SetBackends([]*backend.Backend{bs[1], late})
	for _, c := range []struct {
		b    *backend.Backend
		kept bool
	}{{bs[0], false}, {bs[1], true}, {bs[2], false}, {late, true}} {
		if got := p.RecentWork(c.b); (got > 0) != c.kept {
			t.Errorf("%s after SetBackends: recent work %v, want it kept: %v", c.b.Name, got, c.kept)
		}
	}
	p.SetBackends(bs)
	if got := p.RecentWork(bs[0]); got != 0 {
		t.Errorf("%s listed again: recent work %v, want 0", bs[0].Name, got)
	}
}

// TestRecentShareConcurrentSetBackends: Picks that count recent shares (a lone replica's
// TieBreakAuto) run while SetBackends drops and lists backends again, as a reload does while
// requests are routed (run under -race): nothing races, every Pick lands on a candidate, and
// once the list settles the shares are those of the backends listed.
func TestRecentShareConcurrentSetBackends(t *testing.T) {
	bs, p := aloneAutoPrefix(t, 4)
	const picks, sets = 2000, 200
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range sets {
			if i%2 == 0 {
				p.SetBackends(bs[:2])
			} else {
				p.SetBackends(bs)
			}
		}
	}()
	for i := range picks {
		k := routedKey(chunkChain(nil).extend(fmt.Sprintf("conc-%d", i), 4))
		d := p.Pick(k, bs)
		if d.Backend == nil {
			t.Fatalf("pick %d: no backend", i)
		}
		p.Learn(k, d.Backend, d.MatchedChunks)
		_ = p.RecentWork(bs[i%len(bs)])
	}
	<-done
	p.SetBackends(bs[:2])
	for _, b := range bs[2:] {
		if got := p.RecentWork(b); got != 0 {
			t.Errorf("%s not listed: recent work %v, want 0", b.Name, got)
		}
	}
}
