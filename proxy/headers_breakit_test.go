package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// A body sent without Content-Type reaches the backend without one: fasthttp would add
// application/octet-stream, which FastAPI (vLLM's server) refuses with 422 where it parses
// an untyped body as JSON. A Content-Type the client sent is kept as sent.
func TestNoContentTypeAdded(t *testing.T) {
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	for _, tc := range []struct{ name, fields, want string }{
		{"none", "", ""},
		{"json", "Content-Type: application/json\r\n", "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rqRoundTrip(t, base, rqPost(tc.fields, `{"model":"m","messages":[]}`))
			s := recvWithin(t, be.seen, 10*time.Second, "the backend got no request")
			got := s.values("Content-Type")
			switch {
			case tc.want == "" && len(got) != 0:
				t.Errorf("backend received Content-Type %q; the client sent none", got)
			case tc.want != "" && (len(got) != 1 || got[0] != tc.want):
				t.Errorf("backend received Content-Type %q, want exactly [%q]", got, tc.want)
			}
		})
	}
}

// A chunked request with trailers goes upstream re-framed with a Content-Length: no
// Trailer field announces trailers that will never follow, and the body arrives whole.
func TestChunkedTrailersNotAnnounced(t *testing.T) {
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	body := `{"model":"m","messages":[]}`
	for _, announce := range []string{"Trailer: X-Checksum\r\n", ""} {
		t.Run(fmt.Sprintf("announced=%v", announce != ""), func(t *testing.T) {
			raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
				"Transfer-Encoding: chunked\r\n" + announce + "\r\n" +
				fmt.Sprintf("%x\r\n%s\r\n0\r\nX-Checksum: abc\r\n\r\n", len(body), body)
			resp, _ := rqRoundTrip(t, base, raw)
			s := recvWithin(t, be.seen, 10*time.Second, "the backend got no request")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if v := s.values("Trailer"); len(v) != 0 {
				t.Errorf("backend received Trailer %q for a body re-framed with Content-Length", v)
			}
			if v := s.values("Transfer-Encoding"); len(v) != 0 {
				t.Errorf("backend received Transfer-Encoding %q", v)
			}
			if string(s.body) != body {
				t.Errorf("backend body %q, want %q", s.body, body)
			}
		})
	}
}

// A backend's Connection field may name any number of fields, of any length: none of them
// reaches the client (the first version kept names past the 15th, and one past 256 bytes).
func TestResponseConnectionNamesAnyNumber(t *testing.T) {
	long := "X-" + strings.Repeat("L", 300)
	var names []string
	var extra strings.Builder
	for i := range 40 {
		n := fmt.Sprintf("X-Hop-%d", i)
		names = append(names, n)
		fmt.Fprintf(&extra, "%s: %d\r\n", n, i)
	}
	names = append(names, long)
	fmt.Fprintf(&extra, "%s: long\r\n", long)
	extra.WriteString("Connection: " + strings.Join(names, ", ") + "\r\nX-Kept: yes\r\n")
	be := newRQBackend(t, extra.String())
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	resp, body := rqRoundTrip(t, base, rqPost("", `{"model":"m","messages":[]}`))
	recvWithin(t, be.seen, 10*time.Second, "the backend got no request")
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("response %d %q", resp.StatusCode, body)
	}
	for _, n := range append(names, "Connection") {
		if v := resp.Header.Values(n); len(v) > 0 {
			t.Errorf("client received %.40s: %q", n, v)
		}
	}
	if resp.Header.Get("X-Kept") != "yes" {
		t.Errorf("end-to-end field X-Kept lost: %v", resp.Header)
	}
}

// A backend response without Content-Type reaches the client without one (fasthttp would add
// text/plain; charset=utf-8), the twin of TestNoContentTypeAdded.
func TestResponseContentTypeNotInvented(t *testing.T) {
	ln := testutil.ServeRaw(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := rqReadRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	_, base := startProxy(t, "round-robin", []string{"http://" + ln.Addr().String()}, nil)
	resp, body := rqRoundTrip(t, base, rqPost("", `{"model":"m","messages":[]}`))
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("response %d %q", resp.StatusCode, body)
	}
	if v := resp.Header.Values("Content-Type"); len(v) != 0 {
		t.Errorf("client received Content-Type %q; the backend sent none", v)
	}
}
