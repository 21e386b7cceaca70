package app

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// At the largest max_request_body_bytes a config takes (4 GiB, with the budget at twice it),
// a chunked body over 1 MiB is read and forwarded whole: the body buffer's growth arithmetic
// holds at the bound.
func TestLargestBodyLimitForwardsChunkedBody(t *testing.T) {
	got := make(chan int, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/completions" {
			got <- int(n)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	t.Cleanup(ts.Close)
	cfg, err := configs.ParseRaw([]byte(fmt.Sprintf("listen: 127.0.0.1:0\nmode: least-load\nmax_request_body_bytes: %d\n"+
		"limits:\n  max_buffered_body_bytes: %d\nhealth:\n  disabled: true\n  scrape_disabled: true\n  models_disabled: true\n"+
		"backends:\n  - url: %s\n", 4<<30, 8<<30, ts.URL)))
	if err != nil {
		t.Fatal(err)
	}
	sv := startConfig(t, cfg)

	const size = 3 << 20
	body := `{"model":"m","prompt":"` + strings.Repeat("x", size) + `"}`
	// A reader of unknown length: the client sends it chunked.
	req, err := http.NewRequest(http.MethodPost, sv.URL()+"/v1/completions", io.MultiReader(strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := testutil.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	if n := testutil.RecvWithin(t, got, testutil.Timeout, "the backend reads the body"); n != len(body) {
		t.Errorf("the backend received %d bytes, want %d", n, len(body))
	}
}
