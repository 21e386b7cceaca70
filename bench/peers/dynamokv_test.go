package peers

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// TestDynamoKV: the dynamo-kv peer, subscribed over ZMQ to two simulated replicas, sends a
// prompt to the replica whose cache holds its prefix (as the replica's events reported it),
// and a cold prompt to the replica without active work.
func TestDynamoKV(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Speedup = 1000
	cfg.NumGPUBlocks = 256
	cfg.KVEventsEndpoint = "tcp://127.0.0.1:0"
	c, err := sim.StartCluster(cfg, 2, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tok := c.Replicas()[0]
	eps := map[string]string{}
	for i, u := range c.URLs() {
		eps[u] = c.KVEventEndpoints()[i]
	}
	p, err := NewDynamoKV(DynamoOptions{}, KVEventsOptions{Endpoints: eps, BlockSize: cfg.BlockSize,
		Tokenize: func(body []byte, api key.API) ([]uint32, error) {
			toks, _, _, err := tok.ParsePrompt(body, api == key.APIChat)
			return toks, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	testutil.Eventually(t, testutil.Timeout, "both replicas' KV events subscribed", func() bool {
		return c.Replicas()[0].KVEventsSubscribed() && c.Replicas()[1].KVEventsSubscribed()
	})
	bs := make([]*backend.Backend, 2)
	for i, u := range c.URLs() {
		if bs[i], err = backend.New(u, 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	shared := strings.Repeat("the replica that served this holds its blocks ", 20)
	resp, err := http.Post(c.URLs()[1]+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":4}`, shared)))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	testutil.Eventually(t, testutil.Timeout, "sim-1's stored blocks in the index", func() bool { return p.Index().Blocks(bs[1].Name) >= 8 })
	body := func(s string) *key.Key {
		return &key.Key{API: key.APICompletions, Routed: true, OK: true, Body: []byte(fmt.Sprintf(`{"prompt":%q}`, s))}
	}
	d := p.Pick(body(shared+" and a new question"), bs)
	if d.Backend != bs[1] || d.Reason != router.ReasonMatch {
		t.Fatalf("the warm prompt went to %s (%v), want %s", d.Backend.Name, d.Reason, bs[1].Name)
	}
	l := p.Learn(body(shared+" and a new question"), bs[1], 0) // active on sim-1, in prefill
	d = p.Pick(body("an unrelated cold prompt "+strings.Repeat("x ", 40)), bs)
	if d.Backend != bs[0] || d.Reason != router.ReasonLeastLoad {
		t.Fatalf("the cold prompt went to %s (%v), want %s", d.Backend.Name, d.Reason, bs[0].Name)
	}
	p.Finished(nil, bs[1], l)
	if st := p.Stats(); st.Missed != 0 || st.BadBatches != 0 || st.Batches == 0 {
		t.Fatalf("subscriber stats %+v", st)
	}
}
