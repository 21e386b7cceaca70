package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// After traffic, /metrics has each family with sane values, and the debug endpoints answer.
func TestAdminMetricsAfterTraffic(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\n")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer be.Close()
	s, url := startProxy(t, "round-robin", []string{be.URL}, nil)
	for i := 0; i < 3; i++ {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"`+strings.Repeat("word ", 200)+`"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// One request whose body does not parse: still forwarded, counted as a parse fallback.
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitInFlightZero(t, s)

	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(admin.URL + path)
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
	lbl := `backend="` + be.URL + `"`
	for _, want := range []string{
		`prefixlb_requests_total{` + lbl + `,mode="round-robin",reason="round-robin",status="200"} 3`,
		`prefixlb_requests_total{` + lbl + `,mode="round-robin",reason="parse-fallback",status="200"} 1`,
		`prefixlb_ttft_seconds_count{` + lbl + `} 4`,
		`prefixlb_request_duration_seconds_count{` + lbl + `} 4`,
		`prefixlb_backend_prompt_tokens_total{` + lbl + `} 480`,
		`prefixlb_backend_cached_tokens_total{` + lbl + `} 384`,
		`prefixlb_backend_inflight{` + lbl + `} 0`,
		`prefixlb_backend_healthy{` + lbl + `} 1`,
		`prefixlb_parse_fallbacks_total 1`,
		`prefixlb_retries_total 0`,
		`prefixlb_matched_prefix_ratio_count 3`,
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
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
	rr, err := http.Post(admin.URL+"/debug/route", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var ri RouteInfo
	_ = json.NewDecoder(rr.Body).Decode(&ri)
	rr.Body.Close()
	if ri.Backend != be.URL || !ri.Routed || !ri.Parsed || ri.Model != "m" {
		t.Errorf("/debug/route: %+v", ri)
	}
}
