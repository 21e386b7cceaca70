package app

// Ways around the model pools, closed: a percent-encoded path (the replica decodes it, so
// prefixlb classifies the decoded path) and a body the key cannot read (its top-level model
// still picks the pool).

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/proxy"
)

// post sends body to base+path and returns the status, the serving backend and the body.
func post(t *testing.T, base, path, body string) (int, string, string) {
	t.Helper()
	resp, err := testutil.Client().Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(proxy.HeaderBackend), string(b)
}

func TestModelPoolsNotBypassed(t *testing.T) {
	a := startPoolSim(t, "127.0.0.1:0", "alpha")
	b := startPoolSim(t, "127.0.0.1:0", "beta")
	sv := startPools(t, poolConfig("round-robin", a, b), nil)
	base := sv.URL()
	waitModels(t, base, "alpha", "beta")

	deep := `{"model":"beta","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"tools":[` +
		strings.Repeat(`{"p":`, 400) + `1` + strings.Repeat(`}`, 400) + `]}`
	cases := []struct{ name, path, body string }{
		{"percent-encoded path", "/v1/%63hat/completions", `{"model":"beta","max_tokens":1,"messages":[{"role":"user","content":"x %d"}]}`},
		{"body nested too deep to key", "/v1/chat/completions", deep},
		{"invalid UTF-8 in the prompt", "/v1/chat/completions", "{\"model\":\"beta\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"\xff %d\"}]}"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i := range 4 { // round-robin over both backends would hit alpha's at least once
				body := c.body
				if strings.Contains(body, "%d") {
					body = fmt.Sprintf(body, i)
				}
				st, be, rb := post(t, base, c.path, body)
				if be != b.url {
					t.Fatalf("request %d for beta served by %q (status %d: %.200s), want beta's %s", i, be, st, rb, b.url)
				}
			}
		})
	}
	st, be, rb := post(t, base, "/v1/%63hat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	if st != http.StatusNotFound || be != "" || !strings.Contains(rb, `"model_not_found"`) {
		t.Errorf("unknown model via an encoded path: status %d backend %q body %.200s; want prefixlb's 404", st, be, rb)
	}
	resp, err := testutil.Client().Get(base + "/v1/%6Dodels")
	if err != nil {
		t.Fatal(err)
	}
	lb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(lb), `"owned_by":"prefixlb"`) {
		t.Errorf("GET /v1/%%6Dodels: %d %.200s; want prefixlb's own list", resp.StatusCode, lb)
	}
}

// /debug/route answers as the data path: it picks within the request's model pool, and a
// model no backend serves gets the 404 with the model_not_found error.
func TestDebugRouteUsesPools(t *testing.T) {
	a := startPoolSim(t, "127.0.0.1:0", "alpha")
	b := startPoolSim(t, "127.0.0.1:0", "beta")
	sv := startPools(t, poolConfig("round-robin", a, b), nil)
	waitModels(t, sv.URL(), "alpha", "beta")
	admin := httptest.NewServer(sv.AdminHandler())
	defer admin.Close()
	explain := func(model string, i int) (int, proxy.RouteInfo) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"debug %d"}]}`, model, i)
		resp, err := testutil.Client().Post(admin.URL+"/debug/route?path=/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ri proxy.RouteInfo
		if err := json.NewDecoder(resp.Body).Decode(&ri); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, ri
	}
	for i := range 4 {
		if st, ri := explain("beta", i); st != http.StatusOK || ri.Backend != b.url || ri.Error != nil {
			t.Fatalf("beta, try %d: status %d backend %q error %+v; want beta's %s", i, st, ri.Backend, ri.Error, b.url)
		}
	}
	st, ri := explain("nope", 0)
	if st != http.StatusNotFound || ri.Backend != "" || ri.Error == nil || ri.Error.Code != "model_not_found" ||
		!strings.Contains(ri.Error.Message, `model "nope" is not served; served models: alpha, beta`) {
		t.Errorf("unknown model: status %d backend %q error %+v; want 404 model_not_found naming the served models", st, ri.Backend, ri.Error)
	}
}
