package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// A request whose picked backend a reload removes before it is dialled, every time it is
// picked again, fails with what happened (503, "backend removed by a config reload or
// discovery"), not as a connect error of a backend nothing was sent to; the backend sees
// nothing.
func TestBackendRemovedBeforeDialSaysSo(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	ts := srv.URL
	_, base := startProxy(t, "least-load", []string{ts}, nil, func(s *Server) {
		s.testPanic = func(at panicStage) {
			if at == stagePick { // a reload between the pick and the dial: new objects, same URL
				s.SetBackends(testBackends(t, ts))
			}
		}
	})
	resp, err := testClient().Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	e := decodeError(t, resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Message != errBackendRemoved.Error() {
		t.Errorf("status %d, message %q; want 503, %q", resp.StatusCode, e.Error.Message, errBackendRemoved.Error())
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the backend received %d requests, want none", n)
	}
}
