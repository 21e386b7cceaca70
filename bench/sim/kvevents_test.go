package sim

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench/kvevents"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// TestKVEventsIndexMatchesCache: a replica publishing KV events over ZMQ on 127.0.0.1, read
// by a kvevents.Subscriber, leaves the subscriber's index holding exactly the blocks the
// replica's cache holds, after requests that fill the cache several times over (so blocks
// are evicted), and the index's overlap for each prompt is the cache's prefix hit.
func TestKVEventsIndexMatchesCache(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Speedup = 1000
	cfg.NumGPUBlocks = 48 // 768 tokens: a few prompts fill it
	cfg.KVEventsEndpoint = "tcp://127.0.0.1:0"
	c, err := StartCluster(cfg, 1, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	rep := c.Replicas()[0]
	eps := c.KVEventEndpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "tcp://127.0.0.1:") {
		t.Fatalf("endpoints %v", eps)
	}
	idx := kvevents.NewIndex()
	sub, err := kvevents.Subscribe(idx, "sim-0", eps[0])
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitFor(t, "the subscription to reach the publisher", rep.KVEventsSubscribed)

	// Three families of prompts sharing prefixes, revisited, of 30–150 words.
	var prompts []string
	for i := range 18 {
		fam := i % 3
		words := make([]string, 0, 300)
		for j := range 30 + 20*(i%7) {
			words = append(words, fmt.Sprintf("w%d_%d", fam, j))
		}
		prompts = append(prompts, strings.Join(words, " "))
	}
	for _, p := range prompts {
		resp := post(t, context.Background(), c.URLs()[0]+"/v1/completions",
			fmt.Sprintf(`{"prompt":%q,"max_tokens":20}`, p))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	}
	type parsed struct {
		toks []uint32
		seed uint64
	}
	var parsedPrompts []parsed
	for _, p := range prompts {
		toks, seed, _, err := rep.ParsePrompt([]byte(fmt.Sprintf(`{"prompt":%q}`, p)), false)
		if err != nil {
			t.Fatal(err)
		}
		parsedPrompts = append(parsedPrompts, parsed{toks, seed})
	}

	// The cache and the batches queued for it, read together under the replica's lock (the
	// engine queues a step's events under it), are compared once the subscriber has applied
	// exactly those batches: a response may reach the client before its step's batch is
	// sent, so the publisher's sent count alone can lag the cache. Waiting stops early on a
	// loss, which the checks below report.
	var want []uint64
	var hits []int
	waitFor(t, "the subscriber to apply every batch queued for the cache", func() bool {
		rep.mu.Lock()
		published := rep.pub.Published()
		want = want[:0]
		for h := range rep.eng.kv.byHash {
			want = append(want, h)
		}
		hits = hits[:0]
		for _, p := range parsedPrompts {
			n := 0
			for parent := p.seed; (n+1)*cfg.BlockSize <= len(p.toks); n++ {
				parent = blockHash(parent, p.toks[n*cfg.BlockSize:(n+1)*cfg.BlockSize])
				if _, ok := rep.eng.kv.lookup(parent); !ok {
					break
				}
			}
			hits = append(hits, n)
		}
		rep.mu.Unlock()
		st := sub.Stats()
		return (published > 0 && st.Batches == published) || rep.pub.Dropped() != 0 || st.Missed != 0 || st.BadBatches != 0
	})
	st := sub.Stats()
	_, _, dropped := rep.KVEvents()
	if st.Missed != 0 || st.BadBatches != 0 || dropped != 0 || st.Index.UnknownParent != 0 || st.Index.UnknownRemoved != 0 {
		t.Fatalf("stats %+v, dropped %d", st, dropped)
	}
	if st.Index.Removed == 0 {
		t.Fatalf("no block was evicted (%+v): the test does not exercise eviction", st.Index)
	}

	slices.Sort(want)
	if got := idx.EngineHashes("sim-0"); !slices.Equal(got, want) {
		t.Fatalf("index holds %d blocks, the cache %d:\n%v\n%v", len(got), len(want), got, want)
	}
	for i, p := range parsedPrompts {
		if got := idx.Overlap("sim-0", kvevents.SequenceHashes(nil, p.toks, cfg.BlockSize)); got != hits[i] {
			t.Errorf("prompt %d: index overlap %d blocks, the cache holds %d", i, got, hits[i])
		}
	}
}

// waitFor waits (bounded: testutil.Timeout) until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, testutil.Timeout, what, cond)
}

func TestReplicaEndpoint(t *testing.T) {
	tests := []struct {
		ep   string
		i    int
		want string
		err  bool
	}{
		{"tcp://127.0.0.1:0", 3, "tcp://127.0.0.1:0", false},
		{"tcp://127.0.0.1:5557", 2, "tcp://127.0.0.1:5559", false},
		{"tcp://0.0.0.0:5557", 0, "", true},
		{"ipc:///tmp/x", 0, "", true},
		{"tcp://127.0.0.1:65535", 1, "", true},
	}
	for _, tc := range tests {
		got, err := replicaEndpoint(tc.ep, tc.i)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("replicaEndpoint(%q, %d) = %q, %v", tc.ep, tc.i, got, err)
		}
	}
}
