package proxy

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

var backendLabelRe = regexp.MustCompile(`backend="((?:[^"\\]|\\.)*)"`)

// adminMetrics is the whole /metrics answer of s's admin handler.
func adminMetrics(t *testing.T, s *Server) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	return rec.Body.String()
}

// backendLabels returns the distinct backend label values in the Prometheus text m.
func backendLabels(m string) map[string]bool {
	seen := map[string]bool{}
	for _, line := range strings.Split(m, "\n") {
		if mm := backendLabelRe.FindStringSubmatch(line); mm != nil {
			seen[mm[1]] = true
		}
	}
	return seen
}

// TestBackendSeriesBounded: 500 reloads (or DNS answers), each adding a backend that takes
// requests and removing the previous one, leave /metrics with the labels of the backends
// configured now and about the size it had after the first: a backend's series go when it
// leaves the configuration.
func TestBackendSeriesBounded(t *testing.T) {
	const stable, cycles = 4, 500
	var stableURLs []string
	for range stable {
		ts, _ := testutil.StatusBackend(t, 200, `{"choices":[]}`)
		stableURLs = append(stableURLs, ts.URL)
	}
	s, url := startProxy(t, "round-robin", stableURLs, nil)
	body := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	var first int
	for i := range cycles {
		var hits atomic.Int32
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			_, _ = w.Write([]byte(`{"choices":[]}`))
		}))
		s.UpdateBackends(testBackends(t, append(stableURLs[:stable:stable], ts.URL)...))
		for n := 0; hits.Load() == 0; n++ {
			if n > stable {
				t.Fatalf("cycle %d: %d requests in turn and none reached the new backend", i, n)
			}
			if st := testutil.PostJSON(t, url+"/v1/chat/completions", body); st != http.StatusOK {
				t.Fatalf("cycle %d: status %d", i, st)
			}
		}
		ts.Close()
		if i%50 != 0 && i != cycles-1 {
			continue
		}
		m := adminMetrics(t, s)
		labels := backendLabels(m)
		if len(labels) != stable+1 || !labels[ts.URL] {
			t.Fatalf("cycle %d: %d backend labels (the new one's %v), want the %d configured", i, len(labels), labels[ts.URL], stable+1)
		}
		if i == 0 {
			first = len(m)
		} else if len(m) > first+first/4 {
			t.Fatalf("cycle %d: /metrics is %d bytes, %d after the first cycle", i, len(m), first)
		}
	}
	s.UpdateBackends(testBackends(t, stableURLs...))
	if labels := backendLabels(adminMetrics(t, s)); len(labels) != stable {
		t.Errorf("after the last removal: %d backend labels, want %d", len(labels), stable)
	}
}

// A backend removed while its request is still in flight counts that request on series that
// are no longer exposed, and registers none again; the same URL configured again starts from
// zero.
func TestBackendSeriesAfterRemoval(t *testing.T) {
	sm := newServerMetrics("round-robin")
	bm := sm.forBackend("http://127.0.0.1:1")
	again := sm.forBackend("http://127.0.0.1:1") // a reload replacing it by a backend of the same URL
	bm.request(0, 200)
	sm.releaseBackend(bm)
	if !strings.Contains(metricsText(&Server{m: sm}), `backend="http://127.0.0.1:1"`) {
		t.Fatal("the series went while another upstream of the URL holds them")
	}
	sm.releaseBackend(again)
	bm.request(0, 500)
	bm.ttft.Update(1)
	if m := metricsText(&Server{m: sm}); strings.Contains(m, "backend=") {
		t.Fatalf("series of a removed backend still exposed:\n%s", m)
	}
	back := sm.forBackend("http://127.0.0.1:1")
	back.request(0, 200)
	if m := metricsText(&Server{m: sm}); !strings.Contains(m, `prefixlb_requests_total{backend="http://127.0.0.1:1",mode="round-robin",reason="round-robin",status="200"} 1`) {
		t.Errorf("the URL configured again: want its request counted from zero:\n%s", m)
	}
}
