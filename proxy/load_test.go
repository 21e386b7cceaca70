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

	"github.com/prefixlb/prefixlb/configs"
)

// A replica whose /metrics reports a long waiting queue gets fewer new requests: the scraped
// running + waiting count is the policies' load when it exceeds the proxy's own in-flight.
func TestScrapedQueueSteersTraffic(t *testing.T) {
	for _, mode := range []string{"least-load", "prefix"} {
		t.Run(mode, func(t *testing.T) {
			var hits [3]atomic.Int32
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
						fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1\n"+
							"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %d\n", waiting)
					case "/health":
					default:
						_, _ = io.Copy(io.Discard, r.Body)
						hits[i].Add(1)
						_, _ = io.WriteString(w, `{"choices":[]}`)
					}
				}))
				defer ts.Close()
				urls = append(urls, ts.URL)
			}
			cfg := &configs.Config{Mode: mode, Listen: "127.0.0.1:0",
				Health: configs.Health{Interval: configs.Duration(100 * time.Millisecond), Timeout: configs.Duration(80 * time.Millisecond),
					ScrapeInterval: configs.Duration(100 * time.Millisecond), ScrapeStaleAfter: configs.Duration(time.Second)}}
			s, base := serveConfig(t, cfg, urls, nil)
			deadline := time.Now().Add(5 * time.Second)
			for s.Backends()[1].Load() < 51 || !s.Backends()[0].Healthy() || !s.Backends()[2].Healthy() {
				if time.Now().After(deadline) {
					t.Fatalf("scrape never fed the load: %d", s.Backends()[1].Load())
				}
				time.Sleep(10 * time.Millisecond)
			}
			for i := 0; i < 30; i++ {
				// Distinct prompts: cold placements, spread by the ring within the load cap.
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat(fmt.Sprintf("topic %d ", i), 100))
				resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			t.Logf("requests per replica with replica 1 reporting 50 waiting: %d %d %d", hits[0].Load(), hits[1].Load(), hits[2].Load())
			if hits[1].Load() >= hits[0].Load() || hits[1].Load() >= hits[2].Load() {
				t.Errorf("the replica with a long queue got %d requests, others %d and %d", hits[1].Load(), hits[0].Load(), hits[2].Load())
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
	cfg := &configs.Config{Mode: "prefix", Listen: "127.0.0.1:0",
		Health: configs.Health{Interval: configs.Duration(100 * time.Millisecond), Timeout: configs.Duration(80 * time.Millisecond),
			ScrapeInterval: configs.Duration(100 * time.Millisecond), ScrapeStaleAfter: configs.Duration(time.Second)}}
	s, _ := serveConfig(t, cfg, []string{ts.URL}, nil)
	want := int64(1000 * 16 / cfg.Prefix.ChunkTokens)
	deadline := time.Now().Add(5 * time.Second)
	for {
		infos := s.BackendInfos()
		if infos[0].IndexCapacity == want && infos[0].KVCacheTokens == 16000 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("index capacity %d, kv %d; want %d from the scraped 16000 tokens", infos[0].IndexCapacity, infos[0].KVCacheTokens, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
