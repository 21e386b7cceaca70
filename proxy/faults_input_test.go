package proxy

// Fault injection: hostile request bodies.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// reports the exact body it received: its length and SHA-256.
func fltEcho() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(599)
			return
		}
		sum := sha256.Sum256(b)
		w.Header().Set("X-Body-Sha256", hex.EncodeToString(sum[:]))
		w.Header().Set("X-Body-Len", strconv.Itoa(len(b)))
		st := 200
		if v, err := strconv.Atoi(r.Header.Get("X-Want-Status")); err == nil {
			st = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st)
		fmt.Fprintf(w, `{"status":%d}`, st)
	})
}

// Hostile bodies through the real proxy in prefix mode: none crashes it, each is forwarded
// byte for byte, bodies that do not parse are routed parse-fallback (and counted), and the
// client gets the backend's status.
func TestFaultHostileInput(t *testing.T) {
	var urls []string
	for i := 0; i < 3; i++ {
		urls = append(urls, fltNewBackend(t, fltEcho()).URL())
	}
	s, base := startProxy(t, "prefix", urls, nil)

	big := strings.Repeat("lorem ipsum dolor sit amet ", 4<<20/27) // ≈ 4 MB
	deep := strings.Repeat("[", 100000)
	garbage := make([]byte, 64<<10)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range garbage {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		garbage[i] = byte(x)
	}
	var many strings.Builder
	many.WriteString(`{"model":"m","messages":[`)
	for i := 0; i < 100000; i++ {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`{"role":"user","content":"a"}`)
	}
	many.WriteString(`]}`)
	const fallback = "parse-fallback"
	const routed = "routed" // a prompt that parses: match, cold, overload or least-load
	cases := []struct {
		name, path string
		body       []byte
		status     int
		reason     string
		chunked    bool // no Content-Length: sent with Transfer-Encoding: chunked
	}{
		{"malformed-json", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}`), 400, fallback, false},
		{"trailing-garbage", "/v1/chat/completions", []byte(`{"model":"m","messages":[]} xyz`), 400, fallback, false},
		{"huge-unterminated-string", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"` + big), 400, fallback, false},
		{"huge-valid-prompt", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"` + big + `"}]}`), 200, routed, false},
		{"100k-messages", "/v1/chat/completions", []byte(many.String()), 200, routed, false},
		{"deep-nesting-open", "/v1/chat/completions", []byte(deep), 400, fallback, false},
		{"deep-nesting-balanced", "/v1/chat/completions", []byte(deep + strings.Repeat("]", 100000)), 400, fallback, false},
		{"deep-nesting-in-messages", "/v1/chat/completions", []byte(`{"model":"m","messages":` + deep + strings.Repeat("]", 100000) + `}`), 400, fallback, false},
		{"deep-nesting-in-content", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":` + strings.Repeat(`{"a":`, 50000) + `1` + strings.Repeat("}", 50000) + `}]}`), 400, fallback, false},
		{"model-not-a-string", "/v1/chat/completions", []byte(`{"model":42,"messages":[{"role":"user","content":"hi"}]}`), 400, fallback, false},
		{"messages-a-string", "/v1/chat/completions", []byte(`{"model":"m","messages":"hello"}`), 400, fallback, false},
		{"messages-null-entries", "/v1/chat/completions", []byte(`{"model":"m","messages":[null,1,"x"]}`), 400, fallback, false},
		{"content-a-number", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":42}]}`), 400, fallback, false},
		{"top-level-array", "/v1/chat/completions", []byte(`[{"model":"m"}]`), 400, fallback, false},
		{"top-level-null", "/v1/chat/completions", []byte(`null`), 400, fallback, false},
		{"cache-salt-object", "/v1/chat/completions", []byte(`{"model":"m","cache_salt":{},"messages":[{"role":"user","content":"hi"}]}`), 400, fallback, false},
		{"invalid-utf8-in-string", "/v1/chat/completions", []byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xc3\x28\"}]}"), 400, fallback, false},
		{"invalid-utf8-chunked", "/v1/chat/completions", []byte("{\"model\":\"\xed\xa0\x80\",\"messages\":[]}"), 400, fallback, true},
		{"binary-garbage", "/v1/chat/completions", garbage, 400, fallback, false},
		{"binary-garbage-chunked", "/v1/completions", garbage, 400, fallback, true},
		{"empty-body", "/v1/chat/completions", nil, 400, fallback, false},
		{"whitespace-body", "/v1/chat/completions", []byte(" \r\n\t "), 400, fallback, false},
		{"nul-bytes", "/v1/chat/completions", []byte("{\"model\":\"m\x00\",\"messages\":[\x00]}"), 400, fallback, false},
		{"completions-prompt-object", "/v1/completions", []byte(`{"model":"m","prompt":{"a":1}}`), 400, fallback, false},
		{"completions-mixed-token-ids", "/v1/completions", []byte(`{"model":"m","prompt":[1,2,"x",-5,1e99]}`), 400, fallback, false},
		{"responses-input-number", "/v1/responses", []byte(`{"model":"m","input":123}`), 400, fallback, false},
		{"huge-number", "/v1/chat/completions", []byte(`{"model":"m","max_tokens":1` + strings.Repeat("0", 100000) + `,"messages":[{"role":"user","content":"hi"}]}`), 400, routed, false},
		// model is optional (vLLM then serves its only model): routed on the prompt, not a fallback.
		{"missing-model", "/v1/chat/completions", []byte(`{"messages":[{"role":"user","content":"hi"}]}`), 200, routed, false},
		{"lone-surrogate-escape", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"\ud800\udfff\ud800"}]}`), 200, routed, false},
	}
	c := fltClient()
	var ta fltTally
	fallbacks := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rd io.Reader = bytes.NewReader(tc.body)
			if tc.chunked {
				rd = io.MultiReader(rd) // hides the length: Transfer-Encoding: chunked
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", base+tc.path, rd)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Want-Status", strconv.Itoa(tc.status))
			resp, err := c.Do(req)
			if err != nil {
				ta.add(fltErrConn, "", err.Error())
				t.Fatalf("no response: %v", err)
			}
			rb, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				ta.add(fltErrStream, "", err.Error())
				t.Fatalf("reading the response: %v", err)
			}
			if resp.StatusCode == 200 {
				ta.add(fltOK, resp.Header.Get(HeaderBackend), "")
			} else {
				ta.add(fltErrStatus, resp.Header.Get(HeaderBackend), tc.name)
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d (%.200s), want the backend's %d", resp.StatusCode, rb, tc.status)
			}
			sum := sha256.Sum256(tc.body)
			if got := resp.Header.Get("X-Body-Sha256"); got != hex.EncodeToString(sum[:]) {
				t.Errorf("backend received %s bytes (sha256 %.12s), sent %d (sha256 %.12s): body altered", resp.Header.Get("X-Body-Len"), got, len(tc.body), hex.EncodeToString(sum[:]))
			}
			route := resp.Header.Get(HeaderRoute)
			reason, _, _ := strings.Cut(route, ";")
			switch tc.reason {
			case fallback:
				fallbacks++
				if reason != fallback {
					t.Errorf("route %q, want %s", route, fallback)
				}
			case routed:
				if reason == fallback || reason == "passthrough" || reason == "" {
					t.Errorf("route %q, want a prefix decision", route)
				}
			}
			t.Logf("%d bytes -> %d, route %s", len(tc.body), resp.StatusCode, route)
		})
	}
	// Malformed HTTP itself: answered 400 (or closed), never a crash.
	for _, raw := range []string{
		"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("a", 200<<10) + "\r\n\r\n",
	} {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(conn, raw)
		resp, _ := io.ReadAll(io.LimitReader(conn, 4096))
		_ = conn.Close()
		line, _, _ := strings.Cut(string(resp), "\r\n")
		t.Logf("raw %.30q -> %q", raw, line)
		if len(resp) > 0 && !strings.HasPrefix(line, "HTTP/1.1 4") {
			t.Errorf("raw %.30q answered %q, want a 4xx", raw, line)
		}
	}
	// Still serving.
	res, status, _, _, detail := fltDo(c, "POST", base+"/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), false, 10*time.Second)
	if res != fltOK {
		t.Errorf("after the hostile input a normal request got %s %d %s", res, status, detail)
	}
	waitInFlightZero(t, s)
	if got := s.m.parseFallbacks.Get(); got != uint64(fallbacks) {
		t.Errorf("prefixlb_parse_fallbacks_total = %d, want %d", got, fallbacks)
	}
	fltRow(t, fmt.Sprintf("hostile bodies (%d kinds) + 4 malformed HTTP", len(cases)), &ta, "-", "-")
	if ta.get(fltErrConn)+ta.get(fltErrStream)+ta.get(fltLost) != 0 {
		t.Errorf("hostile input lost or broke requests: %s", &ta)
	}
}
