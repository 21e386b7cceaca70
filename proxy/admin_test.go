package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// metricSample is one sample line of a Prometheus text page.
type metricSample struct {
	name   string
	labels map[string]string
	value  string
}

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// parseMetrics reads the sample lines of a Prometheus text page.
func parseMetrics(t *testing.T, page string) []metricSample {
	t.Helper()
	var out []metricSample
	for _, line := range strings.Split(page, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			t.Fatalf("/metrics line without a value: %q", line)
		}
		m := metricSample{name: line[:sp], value: line[sp+1:], labels: map[string]string{}}
		if i := strings.IndexByte(m.name, '{'); i >= 0 {
			for _, kv := range labelRE.FindAllStringSubmatch(m.name[i:], -1) {
				m.labels[kv[1]] = kv[2]
			}
			m.name = m.name[:i]
		}
		out = append(out, m)
	}
	return out
}

// readmeMetrics are families of docs/metrics.md's tables with the labels each sample carries
// (a histogram's le aside). prefixlb_index_chunks counts distinct chunk hashes over all
// backends, so it has no backend label.
var readmeMetrics = []struct {
	name      string
	labels    []string
	histogram bool
	prefix    bool // only in mode prefix (the index families)
}{
	{name: "prefixlb_requests_total", labels: []string{"backend", "mode", "reason", "status"}},
	{name: "prefixlb_ttft_seconds", labels: []string{"backend"}, histogram: true},
	{name: "prefixlb_request_duration_seconds", labels: []string{"backend"}, histogram: true},
	{name: "prefixlb_matched_prefix_ratio", histogram: true},
	{name: "prefixlb_backend_prompt_tokens_total", labels: []string{"backend"}},
	{name: "prefixlb_backend_cached_tokens_total", labels: []string{"backend"}},
	{name: "prefixlb_backend_predicted_cached_tokens_total", labels: []string{"backend"}},
	{name: "prefixlb_ttft_predicted_over_measured", histogram: true},
	{name: "prefixlb_backend_inflight", labels: []string{"backend"}},
	{name: "prefixlb_backend_prefill_tokens", labels: []string{"backend"}},
	{name: "prefixlb_backend_peer_inflight", labels: []string{"backend"}},
	{name: "prefixlb_backend_peer_prefill_tokens", labels: []string{"backend"}},
	{name: "prefixlb_backend_healthy", labels: []string{"backend"}},
	{name: "prefixlb_index_entries", labels: []string{"backend"}, prefix: true},
	{name: "prefixlb_index_capacity_entries", labels: []string{"backend"}, prefix: true},
	{name: "prefixlb_index_evictions_total", labels: []string{"backend"}, prefix: true},
	{name: "prefixlb_index_chunks", prefix: true},
	{name: "prefixlb_retries_total"},
	{name: "prefixlb_parse_fallbacks_total"},
	{name: "prefixlb_request_body_too_large_total"},
	{name: "prefixlb_no_backend_total"},
}

// After traffic (streamed chat completions, one body that does not parse, one over the size
// limit, one with no backend to route to), /metrics has every family of readmeMetrics
// with its labels and sane values, in round-robin and in prefix mode, and the debug
// endpoints answer.
func TestAdminMetricsAfterTraffic(t *testing.T) {
	for _, mode := range []string{"round-robin", "prefix"} {
		t.Run(mode, func(t *testing.T) { adminMetricsAfterTraffic(t, mode) })
	}
}

func adminMetricsAfterTraffic(t *testing.T, mode string) {
	const bodyLimit = 64 << 10
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\n")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer be.Close()
	s, url := startProxy(t, mode, []string{be.URL}, func(o *Options) { o.MaxRequestBodyBytes = bodyLimit })
	c := testClient()
	post := func(body string) int {
		t.Helper()
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Nothing to route to while the only backend is removed: 503, counted.
	s.UpdateBackends(nil)
	if code := post(`{"model":"m","messages":[]}`); code != 503 {
		t.Errorf("with no backend: %d, want 503", code)
	}
	s.UpdateBackends(testBackends(t, be.URL))
	for i := 0; i < 3; i++ {
		post(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}]}`)
	}
	// One request whose body does not parse: still forwarded, counted as a parse fallback.
	post(`{"model":`)
	// One over max_request_body_bytes: 413, counted.
	if code := post(strings.Repeat("x", bodyLimit+1)); code != 413 {
		t.Errorf("over the body limit: %d, want 413", code)
	}
	waitInFlightZero(t, s)

	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	get := func(path string) (int, string) {
		resp, err := c.Get(admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, m := get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	samples := parseMetrics(t, m)
	for _, f := range readmeMetrics {
		n := 0
		for _, sm := range samples {
			base := sm.name
			if f.histogram {
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					base = strings.TrimSuffix(base, suf)
				}
			}
			if base != f.name {
				continue
			}
			n++
			var got []string
			for k := range sm.labels {
				if !(f.histogram && k == "le") {
					got = append(got, k)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, f.labels) {
				t.Errorf("%s%v: labels %v, want %v", sm.name, sm.labels, got, f.labels)
			}
		}
		switch {
		case n == 0 && (!f.prefix || mode == "prefix"):
			t.Errorf("/metrics lacks %s", f.name)
		case n > 0 && f.prefix && mode != "prefix":
			t.Errorf("/metrics has %s in mode %s, which keeps no index", f.name, mode)
		}
	}

	lbl := `backend="` + be.URL + `"`
	reason := "round-robin"
	if mode == "prefix" {
		reason = "cold" // one backend: it holds whatever any holds, so no match is useful
	}
	want := []string{
		fmt.Sprintf(`prefixlb_requests_total{%s,mode=%q,reason=%q,status="200"} 3`, lbl, mode, reason),
		fmt.Sprintf(`prefixlb_requests_total{%s,mode=%q,reason="parse-fallback",status="200"} 1`, lbl, mode),
		`prefixlb_ttft_seconds_count{` + lbl + `} 4`,
		`prefixlb_request_duration_seconds_count{` + lbl + `} 4`,
		`prefixlb_backend_prompt_tokens_total{` + lbl + `} 480`,
		`prefixlb_backend_cached_tokens_total{` + lbl + `} 384`,
		`prefixlb_backend_inflight{` + lbl + `} 0`,
		`prefixlb_backend_prefill_tokens{` + lbl + `} 0`,
		`prefixlb_backend_peer_inflight{` + lbl + `} 0`,
		`prefixlb_backend_peer_prefill_tokens{` + lbl + `} 0`,
		`prefixlb_backend_healthy{` + lbl + `} 1`,
		`prefixlb_parse_fallbacks_total 1`,
		`prefixlb_retries_total 0`,
		`prefixlb_request_body_too_large_total 1`,
		`prefixlb_no_backend_total 1`,
		`prefixlb_matched_prefix_ratio_count 3`,
	}
	if mode == "prefix" {
		want = append(want,
			fmt.Sprintf(`prefixlb_index_capacity_entries{%s} %d`, lbl, index.DefaultKVCacheTokens/key.DefaultChunkTokens),
			`prefixlb_index_evictions_total{`+lbl+`} 0`)
	}
	for _, w := range want {
		if !strings.Contains(m, w+"\n") {
			t.Errorf("/metrics lacks %q", w)
		}
	}
	if mode == "prefix" {
		for _, sm := range samples {
			if (sm.name == "prefixlb_index_entries" || sm.name == "prefixlb_index_chunks") && (sm.value == "0" || sm.value == "") {
				t.Errorf("%s%v = %s after three learned prompts", sm.name, sm.labels, sm.value)
			}
		}
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz: %d", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz: %d", code)
	}
	code, body := get("/debug/backends")
	var db struct {
		Backends []BackendInfo `json:"backends"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &db) != nil || len(db.Backends) != 1 || db.Backends[0].Served != 4 ||
		!db.Backends[0].Health.Tracked || !strings.Contains(body, `"ejections"`) {
		t.Errorf("/debug/backends: %d %s", code, body)
	}
	rr, err := c.Post(admin.URL+"/debug/route", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var ri RouteInfo
	_ = json.NewDecoder(rr.Body).Decode(&ri)
	rr.Body.Close()
	if ri.Backend != be.URL || !ri.Routed || !ri.Parsed || ri.Model != "m" || ri.ShortFirstTurn {
		t.Errorf("/debug/route: %+v", ri)
	}
	// The follow-up of a short first turn says so (its first chunk's match counts).
	rr, err = c.Post(admin.URL+"/debug/route", "application/json", strings.NewReader(
		`{"model":"m","messages":[{"role":"user","content":"hello there"},{"role":"assistant","content":"Hi! How can I help?"},{"role":"user","content":"Tell me more."}]}`))
	if err != nil {
		t.Fatal(err)
	}
	ri = RouteInfo{}
	_ = json.NewDecoder(rr.Body).Decode(&ri)
	rr.Body.Close()
	if !ri.ShortFirstTurn || !ri.Parsed {
		t.Errorf("/debug/route of a short first turn's follow-up: %+v", ri)
	}
}
