package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRefusedRequestTeachesNoPrefill: a streamed request the backend refuses at once (a 400
// for a prompt over the context) is no observation of the backend's prefill model — its
// first byte came without a prefill — and leaves nothing queued; a streamed 200 is one.
func TestRefusedRequestTeachesNoPrefill(t *testing.T) {
	be := fltNewBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			w.WriteHeader(http.StatusOK)
			return
		}
		body := make([]byte, 64<<10)
		n, _ := r.Body.Read(body)
		if strings.Contains(string(body[:n]), "too long") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"message":"prompt is longer than the model's context","type":"invalid_request_error"}}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		time.Sleep(20 * time.Millisecond) // the point: a prefill's time, so that the request is in prefill a while
		_, _ = w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"))
	}))
	s, base := startProxy(t, "prefix", []string{be.URL()}, func(o *Options) { fltChecks(o); o.Health.Disabled = true })
	b := s.Backends()[0]
	c := fltClient()
	for i := range 5 {
		body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":"too long %d %s"}]}`, i, strings.Repeat("y ", 2000))
		if res, status, _, _, detail := fltDo(c, "POST", base+"/v1/chat/completions", []byte(body), true, 5*time.Second); status != http.StatusBadRequest {
			t.Fatalf("refused request %d: %v status %d (%s), want the backend's 400 relayed", i, res, status, detail)
		}
	}
	waitInFlightZero(t, s)
	if n := b.Prefill().Samples(); n != 0 {
		t.Fatalf("%d prefill observations after 5 refused requests, want 0", n)
	}
	if q := b.PrefillTokens(); q != 0 {
		t.Fatalf("%d prefill tokens still queued after the refusals, want 0", q)
	}
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"fine"}]}`
	if res, status, _, _, detail := fltDo(c, "POST", base+"/v1/chat/completions", []byte(body), true, 5*time.Second); res != fltOK {
		t.Fatalf("good request: %v status %d (%s)", res, status, detail)
	}
	waitInFlightZero(t, s)
	if n := b.Prefill().Samples(); n != 1 {
		t.Fatalf("%d prefill observations after one streamed answer, want 1", n)
	}
}
