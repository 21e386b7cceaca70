package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/router/key"
)

// debugChatBody is a chat body of about n bytes, one user message.
func debugChatBody(n int) []byte {
	const head, tail = `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
	return []byte(head + strings.Repeat("a", max(n-len(head)-len(tail), 0)) + tail)
}

// postDebugRoute sends body to /debug/route at addr and returns the status, the Retry-After
// field and the answer.
func postDebugRoute(t *testing.T, addr string, body []byte) (int, string, []byte) {
	t.Helper()
	resp, err := testClient().Post("http://"+addr+"/debug/route", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), b
}

// /debug/route reads its body, and keys it, within the body budget that the data path's
// bodies share (limits.max_buffered_body_bytes): a preview whose body is arriving counts in
// the budget's gauge, one that does not fit beside it is refused with 503 and Retry-After,
// others are answered, and everything is given back afterwards. Before, /debug/route read up
// to 64 MiB per request outside the budget (eight 64 MiB previews took 1.14 GB with the
// gauge at 0).
func TestDebugRouteWithinBodyBudget(t *testing.T) {
	// A preview needs its body's buffer and what keying it may allocate (key.MaxBuildAlloc).
	// A small one fits beside another; a large one, the largest that fits alone, does not.
	const (
		budget = 48 << 20
		small  = 4 << 20
	)
	need := func(n int) int64 { return int64(n) + key.MaxBuildAlloc(n) }
	large := small
	for need(large+1<<20) <= budget {
		large += 1 << 20
	}
	if 2*need(small) > budget || need(large)+small <= budget {
		t.Fatalf("budget %d: a small preview needs %d, a large one %d; want two small ones to fit, a large one alone only", budget, need(small), need(large))
	}
	s, _ := startProxy(t, "prefix", []string{deadURL(t)}, func(o *Options) {
		o.MaxBufferedBodyBytes = budget
		o.MaxRequestBodyBytes = 8 << 20
	})
	addr := startAdmin(t, s, defaultAdminTimeouts)

	// A preview stalls with three quarters of its body sent: the budget holds them.
	stalled := debugChatBody(small)
	conn, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(testTimeout))
	sent := len(stalled) * 3 / 4
	fmt.Fprintf(conn, "POST /debug/route HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(stalled))
	if _, err := conn.Write(stalled[:sent]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the stalled preview's body counts in the budget", func() bool {
		return s.bodies.used.Load() >= int64(sent)
	})

	// Beside it, a small preview is answered; a large one does not fit and is refused.
	if status, _, b := postDebugRoute(t, addr, debugChatBody(small)); status != http.StatusOK || !strings.Contains(string(b), `"parsed": true`) {
		t.Fatalf("a small preview beside the stalled one: %d %.200s", status, b)
	}
	status, retry, b := postDebugRoute(t, addr, debugChatBody(large))
	if status != http.StatusServiceUnavailable || retry == "" || !strings.Contains(string(b), "limits.max_buffered_body_bytes") {
		t.Fatalf("a large preview beside the stalled one: %d, Retry-After %q, %.200s; want 503 naming the budget", status, retry, b)
	}
	if n := s.bodies.rejected.Get(); n != 1 {
		t.Errorf("prefixlb_request_body_budget_exhausted_total = %d, want 1", n)
	}

	// The stalled preview finishes and is answered; then the budget is empty again.
	if _, err := conn.Write(stalled[sent:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	var ri RouteInfo
	err = json.NewDecoder(resp.Body).Decode(&ri)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !ri.Parsed || ri.Model != "m" || ri.PromptTokens < small/key.BytesPerToken-16 {
		t.Fatalf("the stalled preview, finished: %d %+v %v", resp.StatusCode, ri, err)
	}
	eventually(t, 5*time.Second, "the budget is empty after the previews", func() bool { return s.bodies.used.Load() == 0 })

	// A body over 64 MiB is refused before it is read.
	c2, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(testTimeout))
	fmt.Fprintf(c2, "POST /debug/route HTTP/1.1\r\nHost: admin\r\nContent-Length: %d\r\n\r\n{", maxDebugBody+1)
	if resp, err := http.ReadResponse(bufio.NewReader(c2), nil); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a preview declaring %d bytes: %v %v, want 413", maxDebugBody+1, resp, err)
	}
}
