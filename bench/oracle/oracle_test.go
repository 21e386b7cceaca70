package oracle

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// words is n pseudo-words, one sim token each, distinct per tag.
func words(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s%d ", tag, i%997)
	}
	return b.String()
}

func chatBody(t *testing.T, user string, maxTokens int) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": sim.DefaultModel, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": user}}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// prepared starts a cluster of n sims and sends each replica the bodies listed for it, to
// completion, so that its KV cache holds their prompts.
func prepared(t *testing.T, n int, warm map[int][]string) *sim.Cluster {
	t.Helper()
	cfg := sim.DefaultConfig()
	c, err := sim.StartCluster(cfg, n, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for i, bodies := range warm {
		for _, b := range bodies {
			if st := testutil.PostJSON(t, c.URLs()[i]+"/v1/chat/completions", b); st != http.StatusOK {
				t.Fatalf("warm replica %d: status %d", i, st)
			}
		}
	}
	return c
}

func backendsOf(t *testing.T, c *sim.Cluster) []*backend.Backend {
	t.Helper()
	var bs []*backend.Backend
	for _, u := range c.URLs() {
		b, err := backend.New(u, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	return bs
}

func keyOf(body string) *key.Key {
	k := &key.Key{}
	key.NewBuilder(0).Build([]byte("/v1/chat/completions"), []byte(body), k)
	return k
}

// measuredTTFT sends body to replica j of a freshly prepared cluster and returns the TTFT the
// sim measured (model time): brute force, one trial per replica.
func measuredTTFT(t *testing.T, n, j int, warm map[int][]string, body string) time.Duration {
	t.Helper()
	c := prepared(t, n, warm)
	rep := c.Replicas()[j]
	before := rep.Stats().TTFT
	if st := testutil.PostJSON(t, c.URLs()[j]+"/v1/chat/completions", body); st != http.StatusOK {
		t.Fatalf("probe on replica %d: status %d", j, st)
	}
	after := rep.Stats().TTFT
	if after.Count != before.Count+1 {
		t.Fatalf("replica %d: %d first tokens, want 1", j, after.Count-before.Count)
	}
	return time.Duration((after.Sum - before.Sum) * float64(time.Second))
}

// wakeSlack bounds how much later than predicted an idle sim's measured TTFT may be: the
// engine goroutine's wake-up and timer latency on a busy 2-core machine (speedup 1).
const wakeSlack = 50 * time.Millisecond

// TestOracleAgreesWithBruteForce: on idle sims whose caches hold different prefixes of the
// probe, the oracle's pick is the replica where sending the probe (on an identically prepared
// cluster) measured the least TTFT, and its reason says whether that replica held a prefix.
func TestOracleAgreesWithBruteForce(t *testing.T) {
	doc := words("d", 6000)
	for _, tc := range []struct {
		name  string
		warm  map[int][]string
		probe string
	}{
		{"longest cached prefix wins", map[int][]string{
			0: {chatBody(t, doc[:len(doc)/4], 2)},
			1: {chatBody(t, doc, 2)},
			2: {chatBody(t, words("x", 3000), 2)},
		}, chatBody(t, doc+" and then?", 4)},
		{"nothing cached: any idle replica, cold", map[int][]string{
			0: {chatBody(t, words("y", 500), 2)},
		}, chatBody(t, words("z", 2000), 4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			c := prepared(t, n, tc.warm)
			o := New(c)
			bs := backendsOf(t, c)
			dec := o.Pick(keyOf(tc.probe), bs)
			if dec.Backend == nil {
				t.Fatal("no pick")
			}
			var ttft [n]time.Duration
			best := 0
			for j := range n {
				ttft[j] = measuredTTFT(t, n, j, tc.warm, tc.probe)
				if ttft[j] < ttft[best] {
					best = j
				}
			}
			picked := -1
			for j, b := range bs {
				if b == dec.Backend {
					picked = j
				}
			}
			// Equal TTFTs (several idle replicas without the prefix) are all correct picks;
			// measurements of equal work differ by the engine's wake-up latency.
			if ttft[picked] > ttft[best]+wakeSlack {
				t.Fatalf("oracle picked replica %d (measured TTFT %v); brute force: %v (best %d)", picked, ttft[picked], ttft, best)
			}
			p := c.Replicas()[picked].Predict(mustTokens(t, c, tc.probe))
			// The sim measures from arrival; its engine goroutine starts the step a wake-up
			// later, which the prediction (from an idle engine) cannot know.
			if p.TTFT > ttft[picked] || ttft[picked] > p.TTFT+wakeSlack {
				t.Errorf("predicted TTFT %v on an idle replica, measured %v (slack %v)", p.TTFT, ttft[picked], wakeSlack)
			}
			wantReason := router.ReasonLeastLoad
			if p.CachedTokens > 0 {
				wantReason = router.ReasonMatch
			}
			if dec.Reason != wantReason {
				t.Errorf("reason %v, want %v (cached %d)", dec.Reason, wantReason, p.CachedTokens)
			}
		})
	}
}

func mustTokens(t *testing.T, c *sim.Cluster, body string) ([]uint32, uint64, int, []sim.Pending) {
	t.Helper()
	toks, seed, mt, err := c.Replicas()[0].ParsePrompt([]byte(body), true)
	if err != nil {
		t.Fatal(err)
	}
	return toks, seed, mt, nil
}

// TestOracleAvoidsABusyReplica: the replica holding the prefix but with a long prefill queue
// loses to an idle one without it, as measured.
func TestOracleAvoidsABusyReplica(t *testing.T) {
	doc := words("d", 4000)
	c := prepared(t, 2, map[int][]string{0: {chatBody(t, doc, 2)}})
	// Queue ~90k tokens of prefill on replica 0 (≈6 s of model time, real time at speedup 1).
	for i := range 3 {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, c.URLs()[0]+"/v1/chat/completions",
				strings.NewReader(chatBody(t, words(fmt.Sprintf("q%d", i), 10000), 1)))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := testutil.Client().Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	testutil.Eventually(t, 10*time.Second, "replica 0 busy", func() bool {
		s := c.Replicas()[0].Stats()
		return s.Running+s.Waiting == 3
	})
	probe := chatBody(t, doc+" next", 4)
	bs := backendsOf(t, c)
	dec := o(c).Pick(keyOf(probe), bs)
	if dec.Backend != bs[1] {
		p0 := c.Replicas()[0].Predict(mustTokens(t, c, probe))
		p1 := c.Replicas()[1].Predict(mustTokens(t, c, probe))
		t.Fatalf("picked the busy replica: predictions busy %+v, idle %+v", p0, p1)
	}
}

func o(c *sim.Cluster) *Oracle { return New(c) }

// TestOraclePendingRequests: requests routed but not yet arrived count: two large cold
// prompts picked back to back (neither sent) go to different idle replicas, and a pick long
// after a request that never arrived forgets it.
func TestOraclePendingRequests(t *testing.T) {
	c := prepared(t, 2, nil)
	orc := New(c)
	now := time.Unix(1000, 0)
	orc.clock = func() time.Time { return now }
	bs := backendsOf(t, c)
	a := orc.Pick(keyOf(chatBody(t, words("a", 20000), 4)), bs)
	b := orc.Pick(keyOf(chatBody(t, words("b", 20000), 4)), bs)
	if a.Backend == b.Backend {
		t.Fatalf("both pending prompts went to %s", a.Backend.Name)
	}
	now = now.Add(2 * pendingTTL)
	for _, tg := range orc.byName {
		tg.mu.Lock()
		tg.trim(now)
		n := len(tg.pending)
		tg.mu.Unlock()
		if n != 0 {
			t.Errorf("after pendingTTL: %d pending, want 0", n)
		}
	}
}

// TestOracleUnreadableBody: a body the sim cannot read is routed least-loaded.
func TestOracleUnreadableBody(t *testing.T) {
	c := prepared(t, 2, nil)
	bs := backendsOf(t, c)
	for _, body := range []string{`{"messages":[]}`, `not json`, ``} {
		dec := New(c).Pick(keyOf(body), bs)
		if dec.Backend == nil || dec.Reason != router.ReasonLeastLoad {
			t.Errorf("%q: %+v, want a least-load pick", body, dec)
		}
	}
	if dec := New(c).Pick(nil, bs); dec.Backend == nil {
		t.Error("nil key: no pick")
	}
}
