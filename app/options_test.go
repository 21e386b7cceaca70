package app

import (
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
)

// Every setting of the config reaches the proxy's option that it names, each with a value of
// its own so that a swap shows.
func TestProxyOptionsFromConfig(t *testing.T) {
	cfg, err := configs.Parse([]byte(`mode: least-load
max_request_body_bytes: 2048
limits:
  max_buffered_body_bytes: 4096
response_headers:
  backend: false
timeouts:
  connect: 1s
  response_header: 2s
  idle: 3s
  client_read: 4s
  client_write: 5s
  client_body_idle: 6s
prefix:
  chunk_tokens: 32
  default_kv_cache_tokens: 7000
backends:
  - url: http://127.0.0.1:8001
    kv_cache_tokens: 9000
    weight: 3
  - url: http://127.0.0.1:8002
`))
	if err != nil {
		t.Fatal(err)
	}
	o, err := ProxyOptions(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := proxy.Timeouts{Connect: time.Second, ResponseHeader: 2 * time.Second, Idle: 3 * time.Second,
		ClientRead: 4 * time.Second, ClientWrite: 5 * time.Second, ClientBodyIdle: 6 * time.Second}
	if o.Timeouts != want {
		t.Errorf("timeouts %+v, want %+v", o.Timeouts, want)
	}
	if o.Mode != "least-load" || o.MaxRequestBodyBytes != 2048 || o.MaxBufferedBodyBytes != 4096 || !o.OmitBackendHeader ||
		o.ChunkTokens != 32 || o.DefaultKVCacheTokens != 7000 {
		t.Errorf("mode %q, body %d, buffered %d, omit backend header %v, chunk %d, default KV %d; want the file's",
			o.Mode, o.MaxRequestBodyBytes, o.MaxBufferedBodyBytes, o.OmitBackendHeader, o.ChunkTokens, o.DefaultKVCacheTokens)
	}
	if _, ok := o.Policy.(*router.LeastLoad); !ok {
		t.Errorf("policy %T, want *router.LeastLoad", o.Policy)
	}
	if len(o.Backends) != 2 {
		t.Fatalf("%d backends, want 2", len(o.Backends))
	}
	if b := o.Backends[0]; b.Name != "http://127.0.0.1:8001" || b.Addr != "127.0.0.1:8001" || b.KVCacheTokens() != 9000 || b.Weight() != 3 {
		t.Errorf("backends[0]: %s at %s, KV %d, weight %d", b.Name, b.Addr, b.KVCacheTokens(), b.Weight())
	}
	if b := o.Backends[1]; b.Name != "http://127.0.0.1:8002" || b.KVCacheTokens() != 0 || b.Weight() != 1 {
		t.Errorf("backends[1]: %s, KV %d, weight %d", b.Name, b.KVCacheTokens(), b.Weight())
	}
}
