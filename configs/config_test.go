package configs

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/discovery"
	"github.com/prefixlb/prefixlb/health"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// parseFile reads and parses a config file as Parse does.
func parseFile(t *testing.T, path string) *Config {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func TestExampleConfigParses(t *testing.T) {
	c := parseFile(t, exampleFile)
	if c.Mode != "prefix" || len(c.Backends) != 2 || c.Backends[0].KVCacheTokens != 500000 {
		t.Errorf("unexpected example config: %+v", c)
	}
	if c.Timeouts.ResponseHeader.D() != 10*time.Minute || c.Prefix.LoadFactor != 1.25 {
		t.Errorf("timeouts/prefix not read: %+v %+v", c.Timeouts, c.Prefix)
	}
}

// exampleFile documents every field of Config.
const exampleFile = "prefixlb.yaml"

// fieldPath is a Config field as YAML names it: "timeouts.connect", "backends.url" (a field of
// every list element). optional: the path passes through a pointer, a section whose presence
// turns a feature on (discovery.dns), or holds only such sections (discovery), so the example
// may show it commented out.
type fieldPath struct {
	path     string
	optional bool
}

var yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// yamlPaths lists the YAML path of every field of struct type t (below prefix), parents before
// children. Structs are walked through pointers and slices; types that decode themselves
// (Duration), maps and scalars are leaves. Fields follow yaml.v3's naming: the tag's name,
// else the lowercased Go name; ",inline" merges a struct into its parent; "-" skips a field.
func yamlPaths(t reflect.Type, prefix string, optional bool) []fieldPath {
	var out []fieldPath
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, flags, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		ft, opt := f.Type, optional
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			opt = opt || ft.Kind() == reflect.Pointer
			ft = ft.Elem()
		}
		walk := ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(yamlUnmarshaler)
		if strings.Contains(flags, "inline") && walk {
			out = append(out, yamlPaths(ft, prefix, opt)...)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		p := prefix + name
		var sub []fieldPath
		if walk {
			sub = yamlPaths(ft, p+".", opt)
			// A section that holds only optional sections is optional too (discovery).
			opt = opt || len(sub) > 0 && !slices.ContainsFunc(sub, func(f fieldPath) bool { return !f.optional })
		}
		out = append(out, fieldPath{p, opt})
		out = append(out, sub...)
	}
	return out
}

// lookup reports whether the dotted path names a key in the YAML node n (a document or a
// mapping). Below a list the rest of the path must be found in at least one element. Only keys
// count: a comment or a value that reads like a key does not, and "path" is not
// "metrics_path".
func lookup(n *yaml.Node, path string) bool {
	if n.Kind == yaml.DocumentNode {
		return len(n.Content) == 1 && lookup(n.Content[0], path)
	}
	if n.Kind == yaml.SequenceNode {
		for _, e := range n.Content {
			if lookup(e, path) {
				return true
			}
		}
		return false
	}
	if n.Kind != yaml.MappingNode {
		return false
	}
	head, rest, deeper := strings.Cut(path, ".")
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == head {
			return !deeper || lookup(n.Content[i+1], rest)
		}
	}
	return false
}

// commentedSections returns, uncommented, the sections the example shows commented out: a line
// "# key:" where key is a top-level Config field, and the indented comment lines ("#   ...")
// that follow it. Prose comments are not sections and are not returned.
func commentedSections(t *testing.T, data []byte) []byte {
	t.Helper()
	top := map[string]bool{}
	for _, p := range yamlPaths(reflect.TypeFor[Config](), "", false) {
		if !strings.Contains(p.path, ".") {
			top[p.path] = true
		}
	}
	var out []string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		rest, isComment := strings.CutPrefix(line, "# ")
		switch {
		case isComment && top[strings.TrimSuffix(rest, ":")]:
			in = true
		case in && isComment && strings.HasPrefix(rest, "  "):
		default:
			in = false
		}
		if in {
			out = append(out, rest)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

// TestExampleConfigNamesEveryField: configs/prefixlb.yaml sets every field of Config (found by
// reflection, so a new field must be documented there), as a YAML key, not in a comment. Only
// an optional section (behind a pointer: discovery.dns) may be shown commented out, and then
// it must itself be valid configuration.
func TestExampleConfigNamesEveryField(t *testing.T) {
	data, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	var live, commented yaml.Node
	if err := yaml.Unmarshal(data, &live); err != nil {
		t.Fatal(err)
	}
	sections := commentedSections(t, data)
	if err := yaml.Unmarshal(sections, &commented); err != nil {
		t.Fatalf("commented-out sections of %s are not YAML: %v\n%s", exampleFile, err, sections)
	}
	if len(sections) > 0 {
		if _, err := ParseRaw(sections); err != nil {
			t.Fatalf("commented-out sections of %s are not configuration: %v\n%s", exampleFile, err, sections)
		}
	}
	paths := yamlPaths(reflect.TypeFor[Config](), "", false)
	if len(paths) < 40 {
		t.Fatalf("reflection found %d fields, want the whole Config", len(paths))
	}
	for _, p := range paths {
		if lookup(&live, p.path) {
			continue
		}
		if p.optional && lookup(&commented, p.path) {
			continue
		}
		t.Errorf("%s does not set %s", exampleFile, p.path)
	}
}

// The lookup itself: keys only, whole names, through lists.
func TestExampleLookup(t *testing.T) {
	var n yaml.Node
	doc := "health:\n  metrics_path: /m   # path: in a comment\n  scrape_interval: 1s\nbackends:\n  - url: a\n  - weight: 2\nnote: \"interval: 5s\"\n"
	if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		"health": true, "health.metrics_path": true, "health.path": false, "health.interval": false,
		"interval": false, "backends.url": true, "backends.weight": true, "backends.kv_cache_tokens": false,
		"note": true, "note.interval": false,
	} {
		if got := lookup(&n, path); got != want {
			t.Errorf("lookup(%q) = %v, want %v", path, got, want)
		}
	}
}

// defaulted is what Parse makes of a config naming one backend: every default of
// docs/configuration.md, written out here rather than taken from the package's constants.
var defaulted = Config{
	Listen:              "0.0.0.0:8080",
	AdminListen:         "127.0.0.1:9090",
	Mode:                "prefix",
	MaxRequestBodyBytes: 67108864,
	Log:                 Log{Level: "info", Format: "json"},
	ResponseHeaders:     ResponseHeaders{Backend: new(true)},
	Limits:              Limits{MaxBufferedBodyBytes: 1 << 30},
	Timeouts: Timeouts{
		Connect:        Duration(5 * time.Second),
		ResponseHeader: Duration(10 * time.Minute),
		Idle:           Duration(5 * time.Minute),
		ShutdownGrace:  Duration(30 * time.Second),
		ClientRead:     Duration(60 * time.Second),
		ClientWrite:    Duration(60 * time.Second),
		ClientBodyIdle: Duration(10 * time.Second),
	},
	Prefix: Prefix{ChunkTokens: 64, LoadFactor: 1.25, HardLoadFactor: 2.5, LoadMargin: OptionalInt{V: 2, Set: true}, TieMarginPercent: OptionalInt{V: 50, Set: true}, TieBreak: "auto", SpreadNewPrefixes: OptionalBool{V: true, Set: true}, DefaultKVCacheTokens: 400000, MaxIndexEntries: 4194304},
	Health: Health{
		Path: "/health", Interval: Duration(5 * time.Second), Timeout: Duration(2 * time.Second),
		HealthyThreshold: 2, UnhealthyThreshold: 3, ConsecutiveFailures: 5,
		BaseEjection: Duration(30 * time.Second), MaxEjection: Duration(300 * time.Second), MaxEjectedPercent: 50,
		ScrapeInterval: Duration(time.Second), MetricsPath: "/metrics", ScrapeStaleAfter: Duration(5 * time.Second),
		ModelsInterval: Duration(30 * time.Second), ModelsPath: "/v1/models",
	},
	Backends: []Backend{{URL: "http://a:8000", Weight: 1}},
	Tracing:  Tracing{SampleRatio: new(0.01), ServiceName: "prefixlb"},
	FlowControl: FlowControl{MaxQueueWait: Duration(30 * time.Second), MaxQueued: 1024, MaxQueuedBytes: 64 << 20,
		MinBandShare: new(0.05), MaxRequestWork: 262144, LIFOAfter: new(Duration(time.Second)), BurstCredit: new(int64(65536)), PrefillSaturation: new(Duration(2 * time.Second)), ReservePrefill: new(Duration(5 * time.Millisecond))},
}

// TestDefaults compares the whole defaulted Config with the literal above, field by field.
func TestDefaults(t *testing.T) {
	c, err := Parse([]byte("backends:\n  - url: http://a:8000\n"))
	if err != nil {
		t.Fatal(err)
	}
	diffFields(t, "", reflect.ValueOf(*c), reflect.ValueOf(defaulted))

	// A discovery.dns section takes its own defaults.
	c, err = Parse([]byte("discovery:\n  dns:\n    name: vllm.default.svc\n    port: 8000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Discovery.DNS; d == nil || *d != (DNSDiscovery{Name: "vllm.default.svc", Port: 8000, Scheme: "http", Interval: Duration(10 * time.Second)}) {
		t.Errorf("discovery.dns defaults: %+v", d)
	}

	// An unset health.timeout follows an interval shorter than its default; a set one, or
	// a longer interval, leaves it as it is.
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"health:\n  interval: 1s\n", time.Second},
		{"health:\n  interval: 10s\n", health.DefaultOptions().Timeout},
		{"health:\n  interval: 1s\n  timeout: 500ms\n", 500 * time.Millisecond},
	} {
		c, err := Parse([]byte(tc.yaml + "backends:\n  - url: http://a:8000\n"))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if got := c.Health.Timeout.D(); got != tc.want {
			t.Errorf("%q: health.timeout %v, want %v", tc.yaml, got, tc.want)
		}
	}
}

// diffFields reports every leaf where got and want differ, named by its YAML path.
func diffFields(t *testing.T, path string, got, want reflect.Value) {
	t.Helper()
	switch got.Kind() {
	case reflect.Struct:
		for i := range got.NumField() {
			name, _, _ := strings.Cut(got.Type().Field(i).Tag.Get("yaml"), ",")
			if name == "" {
				name = got.Type().Field(i).Name
			}
			diffFields(t, strings.TrimPrefix(path+"."+name, "."), got.Field(i), want.Field(i))
		}
	default:
		g, w := got.Interface(), want.Interface()
		if d, ok := g.(Duration); ok {
			g, w = d.D(), w.(Duration).D()
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("default %s = %v, want %v", path, g, w)
		}
	}
}

// The defaults configs applies are the packages' own: one set of numbers, each kept in the
// package that uses it. Where a package's handling of a zero option can be seen from here
// (health.New, backend.New), the config's default is compared with what the package does;
// elsewhere with the package's exported default, and router and router/index check in their
// own tests that zero options take those defaults.
func TestDefaultsAgreeWithPackages(t *testing.T) {
	c, err := Parse([]byte("backends:\n  - url: http://a:8000\ndiscovery:\n  dns:\n    name: vllm.default.svc\n    port: 8000\n"))
	if err != nil {
		t.Fatal(err)
	}
	h := c.Health
	got := health.Options{
		Path: h.Path, Interval: h.Interval.D(), Timeout: h.Timeout.D(), Rise: h.HealthyThreshold, Fall: h.UnhealthyThreshold,
		ConsecutiveFailures: h.ConsecutiveFailures, BaseEjection: h.BaseEjection.D(), MaxEjection: h.MaxEjection.D(),
		MaxEjectedPercent: h.MaxEjectedPercent, ScrapeInterval: h.ScrapeInterval.D(), MetricsPath: h.MetricsPath,
		ScrapeStaleAfter: h.ScrapeStaleAfter.D(), ModelsInterval: h.ModelsInterval.D(), ModelsPath: h.ModelsPath,
	}
	if want := health.DefaultOptions(); got != want {
		t.Errorf("configs health defaults map to %+v\nhealth.DefaultOptions() is %+v", got, want)
	}
	// A Checker given zero options (but for ScrapeInterval, whose zero turns scraping off)
	// runs with the same numbers.
	hc := health.New(health.Options{ScrapeInterval: h.ScrapeInterval.D()}, nil, nil)
	defer hc.Close()
	if in := hc.Options(); got != in {
		t.Errorf("configs health defaults map to %+v\na Checker of zero options runs with %+v", got, in)
	}
	b, err := backend.New(c.Backends[0].URL, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	dns := c.Discovery.DNS
	for _, f := range []struct {
		path      string
		got, want any
	}{
		{"prefix.chunk_tokens", c.Prefix.ChunkTokens, key.DefaultChunkTokens},
		{"prefix.load_factor", c.Prefix.LoadFactor, router.DefaultLoadFactor},
		{"prefix.hard_load_factor", c.Prefix.HardLoadFactor, router.DefaultHardLoadFactor},
		{"prefix.load_margin", c.Prefix.LoadMargin, OptionalInt{V: router.DefaultLoadMargin, Set: true}},
		{"prefix.tie_margin_percent", c.Prefix.TieMarginPercent, OptionalInt{V: 50, Set: true}},
		{"prefix.default_kv_cache_tokens", c.Prefix.DefaultKVCacheTokens, int64(index.DefaultKVCacheTokens)},
		{"prefix.max_index_entries", c.Prefix.MaxIndexEntries, index.DefaultMaxEntries},
		{"backends[0].weight (backend.New of weight 0)", c.Backends[0].Weight, b.Weight()},
		{"discovery.dns.scheme", dns.Scheme, discovery.DefaultScheme},
		{"discovery.dns.interval", dns.Interval.D(), discovery.DefaultInterval},
	} {
		if f.got != f.want {
			t.Errorf("default %s = %v, the package's is %v", f.path, f.got, f.want)
		}
	}
}

// Errors name the field as written in YAML.
// shadow: prefix is accepted beside the modes that do not route by prefix.
func TestShadowAcceptedBesideRoundRobinAndLeastLoad(t *testing.T) {
	for _, mode := range []string{"round-robin", "least-load"} {
		c, err := Parse([]byte("mode: " + mode + "\nshadow: prefix\nbackends:\n - url: http://a:1\n   models: [m, m-lora]"))
		if err != nil || c.Shadow != "prefix" || len(c.Backends[0].Models) != 2 {
			t.Errorf("mode %s with shadow prefix: %v (%+v)", mode, err, c)
		}
	}
}

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
		{"listen: :8080\nadmin_listen: 127.0.0.1:8080\nbackends:\n - url: http://a:1", "admin_listen: \"127.0.0.1:8080\" has the port of listen"},
		{"log:\n  level: loud\nbackends:\n - url: http://a:1", "log.level"},
		{"log:\n  format: xml\nbackends:\n - url: http://a:1", "log.format"},
		{"max_request_body_bytes: 10\nbackends:\n - url: http://a:1", "max_request_body_bytes"},
		// 2^62 + 2^61: twice it overflowed to a negative number, under every budget.
		{"max_request_body_bytes: 6917529027641081856\nbackends:\n - url: http://a:1", "max_request_body_bytes: 6917529027641081856 is outside 1024..4294967296"},
		{"max_request_body_bytes: 9223372036854775807\nlimits:\n  max_buffered_body_bytes: 9223372036854775807\nbackends:\n - url: http://a:1", "max_request_body_bytes: 9223372036854775807 is outside"},
		{"max_request_body_bytes: 4294967297\nlimits:\n  max_buffered_body_bytes: 9000000000\nbackends:\n - url: http://a:1", "max_request_body_bytes: 4294967297 is outside"},
		{"max_request_body_bytes: 4294967296\nlimits:\n  max_buffered_body_bytes: 8589934591\nbackends:\n - url: http://a:1", "below twice max_request_body_bytes"},
		{"timeouts:\n  connect: soon\nbackends:\n - url: http://a:1", `line 2: "soon" is not a duration`},
		{"timeouts:\n  idle: 300\nbackends:\n - url: http://a:1", `line 2: "300" is not a duration`},
		{"timeouts:\n  client_read: -1s\nbackends:\n - url: http://a:1", "timeouts.client_read"},
		{"timeouts:\n  idle: -1s\nbackends:\n - url: http://a:1", "timeouts.idle"},
		{"timeouts:\n  client_body_idle: -1s\nbackends:\n - url: http://a:1", "timeouts.client_body_idle"},
		{"limits:\n  max_buffered_body_bytes: 1000\nbackends:\n - url: http://a:1", "limits.max_buffered_body_bytes"},
		{"max_request_body_bytes: 1048576\nlimits:\n  max_buffered_body_bytes: 2000000\nbackends:\n - url: http://a:1", "below twice max_request_body_bytes"},
		{"prefix:\n  chunk_tokens: 100000\nbackends:\n - url: http://a:1", "prefix.chunk_tokens"},
		{"prefix:\n  load_factor: 0.5\nbackends:\n - url: http://a:1", "prefix.load_factor"},
		{"prefix:\n  load_factor: 2\n  hard_load_factor: 1.5\nbackends:\n - url: http://a:1", "prefix.hard_load_factor"},
		{"prefix:\n  hard_load_factor: .nan\nbackends:\n - url: http://a:1", "prefix.hard_load_factor"},
		{"prefix:\n  hard_load_factor: .inf\nbackends:\n - url: http://a:1", "prefix.hard_load_factor"},
		{"prefix:\n  hard_load_factor: 1e30\nbackends:\n - url: http://a:1", "prefix.hard_load_factor"},
		{"prefix:\n  load_factor: .nan\nbackends:\n - url: http://a:1", "prefix.load_factor"},
		{"prefix:\n  load_factor: .inf\nbackends:\n - url: http://a:1", "prefix.load_factor"},
		{"prefix:\n  load_factor: 101\nbackends:\n - url: http://a:1", "prefix.load_factor"},
		{"prefix:\n  load_margin: -1\nbackends:\n - url: http://a:1", "prefix.load_margin"},
		{"prefix:\n  tie_margin_percent: -1\nbackends:\n - url: http://a:1", "prefix.tie_margin_percent"},
		{"prefix:\n  tie_margin_percent: 101\nbackends:\n - url: http://a:1", "prefix.tie_margin_percent"},
		{"prefix:\n  tie_break: random\nbackends:\n - url: http://a:1", "prefix.tie_break"},
		{"bogus_field: 1\nbackends:\n - url: http://a:1", "bogus_field: line 1: unknown field"},
		{"shadow: prefix\nbackends:\n - url: http://a:1", `shadow: "prefix" runs only beside mode round-robin or least-load, not mode "prefix"`},
		{"mode: round-robin\nshadow: oracle\nbackends:\n - url: http://a:1", `shadow: "oracle" is not a shadow policy`},
		{"backends:\n - url: http://a:1\n   models: [a, \"\"]", "backends[0].models[1]: empty model name"},
		{"backends:\n - url: http://a:1\n   models: [a, b, a]", `backends[0].models[2]: "a" duplicates models[0]`},
		{"health:\n  models_path: v1/models\nbackends:\n - url: http://a:1", "health.models_path"},
		{"health:\n  models_interval: 1ms\nbackends:\n - url: http://a:1", "health.models_interval"},
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

// max_request_body_bytes is accepted up to its bound (4 GiB) with a budget of twice it.
func TestLargestRequestBodyAccepted(t *testing.T) {
	c, err := Parse([]byte("max_request_body_bytes: 4294967296\nlimits:\n  max_buffered_body_bytes: 8589934592\nbackends:\n - url: http://a:1"))
	if err != nil || c.MaxRequestBodyBytes != 4<<30 {
		t.Fatalf("Parse: %v (%+v)", err, c)
	}
}
