package app

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// pinned is a policy that sends every request to the candidate named want and counts picks.
type pinned struct {
	want  string
	picks atomic.Int32
}

func (p *pinned) Pick(k *key.Key, cs []*backend.Backend) router.Decision {
	p.picks.Add(1)
	return p.Preview(k, cs)
}

// Preview is Pick without counting it.
func (p *pinned) Preview(_ *key.Key, cs []*backend.Backend) router.Decision {
	for _, b := range cs {
		if b.Name == p.want {
			return router.Decision{Backend: b, Reason: router.ReasonMatch}
		}
	}
	return router.Decision{Backend: cs[0], Reason: router.ReasonRoundRobin}
}

// TestStartPolicyRoutesWithTheGivenPolicy: StartPolicy's proxy asks the given policy, not
// the config's mode (prefix here, which would place a cold prompt by the ring).
func TestStartPolicyRoutesWithTheGivenPolicy(t *testing.T) {
	a, hitsA := testutil.StatusBackend(t, 200, `{"choices":[]}`)
	b, hitsB := testutil.StatusBackend(t, 200, `{"choices":[]}`)
	cfg := &configs.Config{Listen: "127.0.0.1:0", Mode: "prefix",
		Backends: []configs.Backend{{URL: a.URL}, {URL: b.URL}}}
	cfg.Health.Disabled, cfg.Health.ScrapeDisabled = true, true
	for _, target := range []string{a.URL, b.URL} {
		pol := &pinned{want: target}
		sv, err := StartPolicy(context.Background(), cfg, nil, "pinned", pol)
		if err != nil {
			t.Fatal(err)
		}
		if sv.Policy() != router.Policy(pol) {
			t.Fatalf("the proxy's policy is %T, want the one given", sv.Policy())
		}
		before := map[string]int32{a.URL: hitsA.Load(), b.URL: hitsB.Load()}
		const n = 4
		for i := range n {
			body := `{"model":"m","messages":[{"role":"user","content":"question ` + string(rune('a'+i)) + ` long enough to fill a chunk of the key, and more"}]}`
			if st := testutil.PostJSON(t, sv.URL()+"/v1/chat/completions", body); st != 200 {
				t.Fatalf("status %d", st)
			}
		}
		got := map[string]int32{a.URL: hitsA.Load() - before[a.URL], b.URL: hitsB.Load() - before[b.URL]}
		if got[target] != n || pol.picks.Load() != n {
			t.Fatalf("pinned to %s: backend hits %v, %d picks; want all %d there", target, got, pol.picks.Load(), n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		if err := sv.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
		cancel()
	}
}

func TestStartPolicyNeedsLabelAndPolicy(t *testing.T) {
	a, _ := testutil.StatusBackend(t, 200, "{}")
	cfg := &configs.Config{Listen: "127.0.0.1:0", Backends: []configs.Backend{{URL: a.URL}}}
	if _, err := StartPolicy(context.Background(), cfg, nil, "", &pinned{}); err == nil {
		t.Fatal("an empty label was accepted")
	}
	if _, err := StartPolicy(context.Background(), cfg, nil, "x", nil); err == nil {
		t.Fatal("a nil policy was accepted")
	}
}
