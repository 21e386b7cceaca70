package configs

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestExampleConfigParses(t *testing.T) {
	c, err := Load("prefixlb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != "prefix" || len(c.Backends) != 2 || c.Backends[0].KVCacheTokens != 500000 {
		t.Errorf("unexpected example config: %+v", c)
	}
	if c.Timeouts.ResponseHeader.D() != 10*time.Minute || c.Prefix.LoadFactor != 1.25 {
		t.Errorf("timeouts/prefix not read: %+v %+v", c.Timeouts, c.Prefix)
	}
}

// The example file documents every field: parsing it with known-fields and re-marshalling the
// zero config must not name a field the file lacks.
func TestExampleConfigNamesEveryField(t *testing.T) {
	data, err := os.ReadFile("prefixlb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"listen:", "admin_listen:", "mode:", "max_request_body_bytes:", "level:", "format:",
		"connect:", "response_header:", "idle:", "shutdown_grace:", "client_read:", "client_body_idle:", "limits:", "max_buffered_body_bytes:", "chunk_tokens:", "load_factor:", "load_margin:",
		"default_kv_cache_tokens:", "max_index_entries:", "url:", "kv_cache_tokens:", "weight:",
		"discovery:", "dns:", "name:", "port:", "srv:", "scheme:", "interval:", "health:", "path:", "timeout:",
		"healthy_threshold:", "unhealthy_threshold:", "consecutive_failures:", "base_ejection:", "max_ejection:",
		"max_ejected_percent:", "scrape_disabled:", "scrape_interval:", "metrics_path:", "scrape_stale_after:", "disabled:"} {
		if !strings.Contains(string(data), f) {
			t.Errorf("configs/prefixlb.yaml does not document %s", f)
		}
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse([]byte("backends:\n  - url: http://a:8000\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Listen: DefaultListen, AdminListen: DefaultAdminListen, Mode: DefaultMode,
		MaxRequestBodyBytes: 64 << 20}
	if c.Listen != want.Listen || c.AdminListen != want.AdminListen || c.Mode != want.Mode || c.MaxRequestBodyBytes != want.MaxRequestBodyBytes {
		t.Errorf("defaults: got %+v", c)
	}
	if c.Timeouts.Connect.D() != 5*time.Second || c.Timeouts.Idle.D() != 5*time.Minute || c.Prefix.ChunkTokens != 64 || c.Backends[0].Weight != 1 {
		t.Errorf("defaults: got %+v %+v", c.Timeouts, c.Prefix)
	}
	if c.Limits.MaxBufferedBodyBytes != 1<<30 || c.Timeouts.ClientBodyIdle.D() != 10*time.Second {
		t.Errorf("defaults: limits %+v, client_body_idle %s", c.Limits, c.Timeouts.ClientBodyIdle.D())
	}
	bs, err := c.NewBackends()
	if err != nil || bs[0].KVCapacity(c.Prefix.DefaultKVCacheTokens) != DefaultKVCacheTokens || bs[0].Addr != "a:8000" {
		t.Errorf("NewBackends: %v %+v", err, bs[0])
	}
}

// Errors name the field as written in YAML.
func TestValidationErrorsNameTheField(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"backends: []", "backends: at least one"},
		{"backends:\n - url: a:8000", "backends[0].url: missing scheme"},
		{"backends:\n - url: http://a:1\n - url: http://b:1\n - url: vllm-2:8000", "backends[2].url: missing scheme"},
		{"backends:\n - url: ftp://a", "backends[0].url: unsupported scheme"},
		{"backends:\n - url: http://a:1\n - url: http://a:1/", "backends[1].url:"},
		{"backends:\n - url: http://a:1\n   kv_cache_tokens: -5", "backends[0].kv_cache_tokens"},
		{"backends:\n - url: http://a:1\n   weight: 5000", "backends[0].weight"},
		{"mode: random\nbackends:\n - url: http://a:1", "mode:"},
		{"listen: nope\nbackends:\n - url: http://a:1", "listen:"},
		{"admin_listen: nope\nbackends:\n - url: http://a:1", "admin_listen:"},
		{"log:\n  level: loud\nbackends:\n - url: http://a:1", "log.level"},
		{"log:\n  format: xml\nbackends:\n - url: http://a:1", "log.format"},
		{"max_request_body_bytes: 10\nbackends:\n - url: http://a:1", "max_request_body_bytes"},
		{"timeouts:\n  connect: soon\nbackends:\n - url: http://a:1", `line 2: "soon" is not a duration`},
		{"timeouts:\n  idle: 300\nbackends:\n - url: http://a:1", `line 2: "300" is not a duration`},
		{"timeouts:\n  client_read: -1s\nbackends:\n - url: http://a:1", "timeouts.client_read"},
		{"timeouts:\n  idle: -1s\nbackends:\n - url: http://a:1", "timeouts.idle"},
		{"timeouts:\n  client_body_idle: -1s\nbackends:\n - url: http://a:1", "timeouts.client_body_idle"},
		{"limits:\n  max_buffered_body_bytes: 1000\nbackends:\n - url: http://a:1", "limits.max_buffered_body_bytes"},
		{"prefix:\n  chunk_tokens: 100000\nbackends:\n - url: http://a:1", "prefix.chunk_tokens"},
		{"prefix:\n  load_factor: 0.5\nbackends:\n - url: http://a:1", "prefix.load_factor"},
		{"prefix:\n  load_margin: -1\nbackends:\n - url: http://a:1", "prefix.load_margin"},
		{"bogus_field: 1\nbackends:\n - url: http://a:1", "field bogus_field not found"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Parse(%q) = %v, want error containing %q", c.yaml, err, c.want)
			}
		})
	}
}
