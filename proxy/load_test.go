package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/router/key"
)

// A replica whose /metrics reports a long waiting queue gets fewer new requests: what the
// scrape reports beyond the proxy's own in-flight requests is load (backend.Busy).
func TestScrapedQueueSteersTraffic(t *testing.T) {
	for _, mode := range []string{"least-load", "prefix"} {
		t.Run(mode, func(t *testing.T) {
			var hits, running [3]atomic.Int32
			var urls []string
			for i := 0; i < 3; i++ {
				i := i
				waiting := 0
				if i == 1 {
					waiting = 50 // a long queue on replica 1
				}
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					switch r.URL.Path {
					case "/metrics":
						// Its real running count (the proxy's requests it is answering), so that
						// nothing but replica 1's queue is another sender's work.
						fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} %d\n"+
							"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %d\n", running[i].Load(), waiting)
					case "/health":
					default:
						running[i].Add(1)
						defer running[i].Add(-1)
						_, _ = io.Copy(io.Discard, r.Body)
						hits[i].Add(1)
						_, _ = io.WriteString(w, `{"choices":[]}`)
					}
				}))
				defer ts.Close()
				urls = append(urls, ts.URL)
			}
			// A scrape stays fresh for 5 s: a few slow scrapes on a loaded machine must not
			// drop replica 1's reported queue from its load mid-test.
			s, base := startProxy(t, mode, urls, fastChecks(5*time.Second))
			eventually(t, 5*time.Second, "the scrape feeds replica 1's queue into its load, the others healthy", func() bool {
				return s.Backends()[1].Load() >= 50 && s.Backends()[0].Healthy() && s.Backends()[2].Healthy()
			})
			c := testClient()
			for i := 0; i < 30; i++ {
				// Distinct prompts: cold placements, spread within the load cap (by load: the
				// fake replicas report running requests and no finished count, so they count as alone).
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat(fmt.Sprintf("topic %d ", i), 100))
				resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			t.Logf("requests per replica with replica 1 reporting 50 waiting: %d %d %d", hits[0].Load(), hits[1].Load(), hits[2].Load())
			// Least-load never picks a load of 50 over loads of 0 or 1. In prefix mode, 50 is
			// over the cap (ceil(1.25 × 51 / 3) + 2 = 24) for every request, so it is passed over.
			if hits[1].Load() != 0 || hits[0].Load() == 0 || hits[2].Load() == 0 {
				t.Errorf("the replica with a long queue got %d requests, others %d and %d: want 0 and both others used", hits[1].Load(), hits[0].Load(), hits[2].Load())
			}
		})
	}
}

// A backend without kv_cache_tokens gets the capacity its /metrics reports
// (vllm:cache_config_info num_gpu_blocks × block_size), and the index is sized by it.
func TestScrapedKVCapacitySizesIndex(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_running{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"+
				"vllm:cache_config_info{block_size=\"16\",model_name=\"m\",num_gpu_blocks=\"1000\"} 1.0\n")
		}
	}))
	defer ts.Close()
	s, _ := startProxy(t, "prefix", []string{ts.URL}, fastChecks(time.Second))
	want := int64(1000 * 16 / key.DefaultChunkTokens)
	eventually(t, 5*time.Second, fmt.Sprintf("index capacity %d from the scraped 16000 KV tokens", want), func() bool {
		infos := s.BackendInfos()
		return infos[0].IndexCapacity == want && infos[0].KVCacheTokens == 16000
	})
}

// fastChecks turns checks and scrapes on, every 100 ms (checks time out after 80 ms); a
// scrape counts for staleAfter.
func fastChecks(staleAfter time.Duration) func(*Options) {
	return func(o *Options) {
		checksOn(o)
		h := &o.Health
		h.Interval, h.Timeout = 100*time.Millisecond, 80*time.Millisecond
		h.ScrapeInterval, h.ScrapeStaleAfter = 100*time.Millisecond, staleAfter
	}
}

// TestPeerLoadShown: what the peered replicas reported on a backend (package peering sets it)
// is in /debug/backends and in the per-backend gauges, so that an operator can see the fleet's
// load view agree.
func TestPeerLoadShown(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer ts.Close()
	s, _ := startProxy(t, "prefix", []string{ts.URL}, checksOn)
	b := s.pool.Snapshot()[0]
	b.SetPeerLoad(2, 300)
	if in := s.BackendInfos()[0]; in.PeerInFlight != 2 || in.PeerPrefillTokens != 300 {
		t.Fatalf("BackendInfos peer load %d, %d; want 2, 300", in.PeerInFlight, in.PeerPrefillTokens)
	}
	var m strings.Builder
	s.writeGauges(&m)
	lbl := `{backend=` + labelValue(b.Name) + `}`
	for _, want := range []string{"prefixlb_backend_peer_inflight" + lbl + " 2", "prefixlb_backend_peer_prefill_tokens" + lbl + " 300"} {
		if !strings.Contains(m.String(), want+"\n") {
			t.Errorf("gauges lack %q:\n%s", want, m.String())
		}
	}
}
