package peering_test

// End to end: three peered prefixlb servers started through app in front of simulated vLLM
// replicas, one killed and restarted mid-run.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
)

// The scenario's sizes.
const (
	restartSims        = 4   // simulated vLLM replicas
	restartSimSpeedup  = 100 // model time ÷ this: a 1.5k-token prefill sleeps ≈ 1 ms
	restartOldConvs    = 4   // conversations started before the kill
	restartNewConvs    = 2   // conversations started while the replica is down
	restartTurnsBefore = 3   // turns of the old conversations before the kill, over 3 routers
	restartTurnsDuring = 3   // turns of every conversation while one router is down
	restartWords       = 120 // words of each user message (≈ 250 tokens)
	restartMaxTokens   = 4
	// restartWait bounds each wait: failure detection takes about a second, a join and its
	// snapshot milliseconds.
	restartWait = 20 * time.Second
	// restartSecretEnv holds the routers' shared secret (base64 of 32 bytes).
	restartSecretEnv = "PREFIXLB_TEST_RESTART_SECRET"
)

// prefixRouter is one prefixlb server of the scenario: its data and admin listeners and its
// peering node.
type prefixRouter struct {
	sv    *proxy.Serving
	node  *peering.Node
	aln   net.Listener
	admin string // http://host:port
	stop  sync.Once
}

// startRouter starts a peered prefixlb through app.StartPeered in front of sims, its peer port
// on listen, joining join; its admin listener serves /readyz.
func startRouter(t *testing.T, sims []string, kvTokens int64, listen string, join []string) *prefixRouter {
	t.Helper()
	cfg := &configs.Config{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Mode: "prefix",
		Health:  configs.Health{Disabled: true, ScrapeDisabled: true},
		Peering: &configs.Peering{Listen: listen, Join: join, SecretEnv: restartSecretEnv}}
	for _, u := range sims {
		cfg.Backends = append(cfg.Backends, configs.Backend{URL: u, KVCacheTokens: kvTokens})
	}
	sv, node, err := app.StartPeered(context.Background(), cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = sv.ServeAdmin(aln) }()
	r := &prefixRouter{sv: sv, node: node, aln: aln, admin: "http://" + aln.Addr().String()}
	t.Cleanup(func() { r.shutdown(t, false) })
	return r
}

// shutdown stops the server (draining what is in flight) and the node: with crash, without
// a leave message, as a killed process.
func (r *prefixRouter) shutdown(t *testing.T, crash bool) {
	r.stop.Do(func() {
		if crash {
			r.node.Crash()
		}
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		defer cancel()
		if err := r.sv.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
		_ = r.aln.Close()
		_ = r.node.Close()
	})
}

// ready reports whether /readyz answers 200.
func (r *prefixRouter) ready() bool {
	resp, err := testutil.Client().Get(r.admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// conversation is one multi-turn chat: its messages so far and where its last turn went.
type conversation struct {
	id      int
	msgs    []map[string]string
	sent    []byte // the last turn's request body
	backend string // x-prefixlb-backend of the last turn
}

// next appends the user message of turn n and returns the request body.
func (c *conversation) next(n int) []byte {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Conversation %d, turn %d:", c.id, n)
	for w := range restartWords {
		fmt.Fprintf(&sb, " point %d of %d.%d", w, c.id, n)
	}
	c.msgs = append(c.msgs, map[string]string{"role": "user", "content": sb.String()})
	return c.body()
}

func (c *conversation) body() []byte {
	b, _ := json.Marshal(map[string]any{"model": sim.DefaultModel, "max_tokens": restartMaxTokens, "messages": c.msgs})
	return b
}

// send posts the conversation's pending turn to url and records the reply and the backend;
// it returns the reported cached tokens, or an error for anything but a complete 200.
func (c *conversation) send(url string, body []byte) (cached int, err error) {
	resp, err := testutil.Client().Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode, data)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &out); err != nil || len(out.Choices) == 0 {
		return 0, fmt.Errorf("response %q: %v", data, err)
	}
	c.msgs = append(c.msgs, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content})
	c.sent = body
	c.backend = resp.Header.Get("x-prefixlb-backend")
	return out.Usage.Details.Cached, nil
}

// TestReplicaRestartRejoinsWarm: three peered prefixlb servers in front of simulated vLLM
// replicas take multi-turn conversations spread across them per request. One is killed (no
// leave) while the others keep taking requests, none of which fails, and conversations start
// meanwhile. Restarted on the same peer port, it is ready (/readyz) only with the index the
// others built meanwhile, taken as its join snapshot (no update came): every conversation's
// latest prompt routes on it by a match of every chunk to the backend the others route it
// to, and its next turn served there reports the prompt cached.
func TestReplicaRestartRejoinsWarm(t *testing.T) {
	t.Setenv(restartSecretEnv, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	scfg := sim.DefaultConfig()
	scfg.Speedup = restartSimSpeedup
	cluster, err := sim.StartCluster(scfg, restartSims, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	kv := int64(scfg.KVCacheTokens())
	sims := cluster.URLs()

	r0 := startRouter(t, sims, kv, "127.0.0.1:0", nil)
	r1 := startRouter(t, sims, kv, "127.0.0.1:0", []string{r0.node.Addr()})
	r2 := startRouter(t, sims, kv, "127.0.0.1:0", []string{r0.node.Addr()})
	routers := []*prefixRouter{r0, r1, r2}
	for i, r := range routers {
		testutil.Eventually(t, restartWait, fmt.Sprintf("r%d sees its 2 peers and is ready", i), func() bool {
			return r.node.Alive() == 2 && r.ready()
		})
	}

	convs := make([]*conversation, restartOldConvs+restartNewConvs)
	for i := range convs {
		convs[i] = &conversation{id: i}
	}
	turns := make([]int, len(convs))
	spread := 0 // round-robin per request over the routers in use
	turn := func(c *conversation, over []*prefixRouter) error {
		body := c.next(turns[c.id])
		turns[c.id]++
		r := over[spread%len(over)]
		spread++
		_, err := c.send(r.sv.URL(), body)
		return err
	}
	for range restartTurnsBefore {
		for _, c := range convs[:restartOldConvs] {
			if err := turn(c, routers); err != nil {
				t.Fatalf("before the kill: %v", err)
			}
		}
	}

	// The kill, while the other two take the conversations' next turns (and new ones).
	peerAddr := r2.node.Addr()
	started := make(chan struct{})
	done := make(chan []error, 1)
	go func() {
		var errs []error
		for n := range restartTurnsDuring {
			for _, c := range convs {
				if err := turn(c, routers[:2]); err != nil {
					errs = append(errs, fmt.Errorf("conversation %d: %w", c.id, err))
				}
				if n == 0 && c.id == 0 {
					close(started)
				}
			}
		}
		done <- errs
	}()
	testutil.RecvWithin(t, started, restartWait, "the first request while r2 is killed")
	r2.shutdown(t, true)
	for i, r := range routers[:2] {
		testutil.Eventually(t, restartWait, fmt.Sprintf("r%d declares the killed r2 dead", i), func() bool { return r.node.Alive() == 1 })
	}
	for _, err := range testutil.RecvWithin(t, done, restartWait, "the turns sent while r2 is down") {
		t.Errorf("request lost while r2 was down: %v", err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The restart on the same peer port, joining the survivors.
	r2 = startRouter(t, sims, kv, peerAddr, []string{r0.node.Addr(), r1.node.Addr()})
	routers[2] = r2
	testutil.Eventually(t, restartWait, "the restarted r2 is ready", r2.ready)
	st := r2.node.Stats()
	if st.SnapshotEntries == 0 || st.UpdatesReceived != 0 {
		t.Fatalf("r2 ready with %d snapshot entries and %d updates received: want its index from the join snapshot (no request was routed meanwhile)",
			st.SnapshotEntries, st.UpdatesReceived)
	}
	for _, c := range convs {
		// The latest prompt, learned while r2 was down.
		warm, ref := r2.sv.Explain("/v1/chat/completions", c.sent), r0.sv.Explain("/v1/chat/completions", c.sent)
		if warm.Reason != "match" || warm.MatchedChunks != warm.Chunks || warm.Backend != c.backend ||
			ref.Backend != c.backend || ref.MatchedChunks != ref.Chunks {
			t.Errorf("conversation %d: restarted r2 routes its latest prompt %s on %s (%d of %d chunks), r0 to %s (%d chunks); its last turn went to %s",
				c.id, warm.Reason, warm.Backend, warm.MatchedChunks, warm.Chunks, ref.Backend, ref.MatchedChunks, c.backend)
		}
	}

	// Its next requests: served where the others would serve them, from the KV cache.
	for _, c := range convs {
		want := c.backend
		prev := r0.sv.Explain("/v1/chat/completions", c.sent).PromptTokens
		body := c.next(turns[c.id])
		if d := r2.sv.Explain("/v1/chat/completions", body); d.Reason != "match" || d.Backend != want {
			t.Errorf("conversation %d: r2 would route its next turn %s to %s, want a match on %s", c.id, d.Reason, d.Backend, want)
		}
		cached, err := c.send(r2.sv.URL(), body)
		if err != nil {
			t.Fatalf("conversation %d on the restarted r2: %v", c.id, err)
		}
		if c.backend != want || cached < prev/2 {
			t.Errorf("conversation %d on the restarted r2: served by %s with %d cached tokens; want %s, which holds the previous %d-token prompt",
				c.id, c.backend, cached, want, prev)
		}
	}
}
