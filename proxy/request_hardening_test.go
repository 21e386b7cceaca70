package proxy

// Request-side hardening: hop-by-hop fields in any spelling, X-Forwarded-For and Forwarded
// that a client cannot spoof, CONNECT/TRACE and unknown versions refused, Expect not
// forwarded, bare-LF requests answered at once, and no header value in a log or an error.
// Clients and backends here are raw sockets: net/http would normalise what these tests send.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// rqSeen is one request as a raw backend read it: its request line, its header lines
// exactly as received, and its body.
type rqSeen struct {
	line  string
	lines []string
	body  []byte
}

// has reports whether a header line named name (any case) was received.
func (s rqSeen) has(name string) bool { return len(s.values(name)) > 0 }

// values returns the values of every header line named name (any case), in order.
func (s rqSeen) values(name string) []string {
	var out []string
	for _, l := range s.lines {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), name) {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// rqBackend is a raw HTTP/1.1 backend: it reads each request (Content-Length framing, as
// prefixlb forwards), reports it on seen, and answers 200 with extra response header lines.
type rqBackend struct {
	ln    net.Listener
	seen  chan rqSeen
	extra string // raw header lines added to each response, each ending in CRLF
}

func newRQBackend(t *testing.T, extra string) *rqBackend {
	t.Helper()
	b := &rqBackend{seen: make(chan rqSeen, 64), extra: extra}
	b.ln = testutil.ServeRaw(t, func(c net.Conn) { b.serve(c) })
	return b
}

func (b *rqBackend) URL() string { return "http://" + b.ln.Addr().String() }

func (b *rqBackend) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		s, err := rqReadRequest(br)
		if err != nil {
			return
		}
		b.seen <- s
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: 2\r\n\r\nok", b.extra)
	}
}

// rqReadRequest reads one request head and its Content-Length body.
func rqReadRequest(br *bufio.Reader) (rqSeen, error) {
	var s rqSeen
	line, err := br.ReadString('\n')
	if err != nil {
		return s, err
	}
	s.line = strings.TrimRight(line, "\r\n")
	n := 0
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return s, err
		}
		l = strings.TrimRight(l, "\r\n")
		if l == "" {
			break
		}
		s.lines = append(s.lines, l)
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "Content-Length") {
			n, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	s.body = make([]byte, n)
	_, err = io.ReadFull(br, s.body)
	return s, err
}

// rqRoundTrip writes raw to the proxy on a new connection and reads one response, bounded.
func rqRoundTrip(t *testing.T, base, raw string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no response to %.40q within 10 s: %v", raw, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

func rqPost(extra, body string) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-End-To-End: kept\r\n%sContent-Length: %d\r\n\r\n%s", extra, len(body), body)
}

// RFC 9110 §7.6.1: hop-by-hop fields, in whatever case the client wrote them, and every
// field a Connection field names, do not reach the backend; end-to-end fields do.
func TestHopByHopFieldsStrippedInAnySpelling(t *testing.T) {
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	cases := []struct {
		name    string
		fields  string   // raw header lines sent
		dropped []string // names the backend must not see
	}{
		{"proxy-authorization", "proxy-authorization: Basic c2VjcmV0\r\n", []string{"Proxy-Authorization"}},
		{"PROXY-AUTHORIZATION", "PROXY-AUTHORIZATION: Basic c2VjcmV0\r\n", []string{"Proxy-Authorization"}},
		{"upgrade", "upgrade: websocket\r\nconnection: upgrade\r\n", []string{"Upgrade", "Connection"}},
		{"Upgrade h2c", "Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n", []string{"Upgrade", "Connection", "HTTP2-Settings"}},
		{"keep-alive", "keep-alive: timeout=5\r\n", []string{"Keep-Alive"}},
		{"KEEP-ALIVE", "KEEP-ALIVE: timeout=5\r\n", []string{"Keep-Alive"}},
		{"te", "te: trailers\r\n", []string{"TE"}},
		{"TE", "TE: trailers\r\n", []string{"TE"}},
		{"Te", "Te: trailers, deflate\r\n", []string{"TE"}},
		{"proxy-connection", "proxy-connection: keep-alive\r\n", []string{"Proxy-Connection"}},
		{"PROXY-CONNECTION", "PROXY-CONNECTION: close\r\n", []string{"Proxy-Connection"}},
		{"trailer", "trailer: x-checksum\r\n", []string{"Trailer"}},
		{"lowercase connection names a field", "connection: x-hop\r\nx-hop: secret\r\n", []string{"Connection", "X-Hop"}},
		{"names listed in another case", "Connection: X-HOP, x-other\r\nx-hop: 1\r\nX-Other: 2\r\n", []string{"Connection", "X-Hop", "X-Other"}},
		{"two connection fields", "connection: x-a\r\nCONNECTION: x-b\r\nx-a: 1\r\nX-B: 2\r\n", []string{"Connection", "X-A", "X-B"}},
		{"connection close", "connection: close\r\n", []string{"Connection"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, _ := rqRoundTrip(t, base, rqPost(tc.fields, `{"model":"m","messages":[]}`))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			s := recvWithin(t, be.seen, 10*time.Second, "the backend got no request")
			for _, n := range tc.dropped {
				if s.has(n) {
					t.Errorf("backend received %s: %q", n, s.lines)
				}
			}
			if got := s.values("X-End-To-End"); len(got) != 1 || got[0] != "kept" {
				t.Errorf("end-to-end field X-End-To-End = %q, want [kept]", got)
			}
		})
	}
}

// A backend's hop-by-hop response fields, and those its Connection field names (in any
// case), do not reach the client.
func TestHopByHopResponseFieldsStrippedInAnySpelling(t *testing.T) {
	be := newRQBackend(t, "connection: x-backend-secret\r\nx-backend-secret: 1\r\nkeep-alive: timeout=5\r\nUPGRADE: h2c\r\nproxy-authenticate: Basic\r\nX-Kept: yes\r\n")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	resp, body := rqRoundTrip(t, base, rqPost("", `{"model":"m","messages":[]}`))
	recvWithin(t, be.seen, 10*time.Second, "the backend got no request")
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("response %d %q", resp.StatusCode, body)
	}
	for _, n := range []string{"X-Backend-Secret", "Keep-Alive", "Upgrade", "Proxy-Authenticate"} {
		if v := resp.Header.Values(n); len(v) > 0 {
			t.Errorf("client received %s: %q", n, v)
		}
	}
	if resp.Header.Get("X-Kept") != "yes" {
		t.Errorf("end-to-end response field X-Kept lost: %v", resp.Header)
	}
}

// Every X-Forwarded-For field the client sent, in any case, is joined into one and the
// client's address appended, so the last entry is always the address prefixlb saw; the
// same for Forwarded when the client sent one.
func TestForwardedForCannotBeSpoofed(t *testing.T) {
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	cases := []struct {
		name, fields     string
		wantXFF, wantFwd string // "" for wantFwd: no Forwarded field at all
	}{
		{"none", "", "127.0.0.1", ""},
		{"one", "X-Forwarded-For: 10.0.0.1\r\n", "10.0.0.1, 127.0.0.1", ""},
		{"two fields, two spellings", "X-Forwarded-For: 10.0.0.1\r\nx-forwarded-for: 6.6.6.6\r\n", "10.0.0.1, 6.6.6.6, 127.0.0.1", ""},
		{"three fields", "x-forwarded-for: 1.1.1.1, 2.2.2.2\r\nX-FORWARDED-FOR: 3.3.3.3\r\nX-Forwarded-For: 4.4.4.4\r\n", "1.1.1.1, 2.2.2.2, 3.3.3.3, 4.4.4.4, 127.0.0.1", ""},
		{"forwarded", "Forwarded: for=10.0.0.1\r\nforwarded: for=6.6.6.6;proto=https\r\n", "127.0.0.1", "for=10.0.0.1, for=6.6.6.6;proto=https, for=127.0.0.1"},
		{"named in connection", "Connection: X-Forwarded-For\r\nX-Forwarded-For: 6.6.6.6\r\n", "127.0.0.1", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rqRoundTrip(t, base, rqPost(tc.fields, `{}`))
			s := recvWithin(t, be.seen, 10*time.Second, "the backend got no request")
			if got := s.values("X-Forwarded-For"); len(got) != 1 || got[0] != tc.wantXFF {
				t.Errorf("backend X-Forwarded-For fields %q, want exactly [%q]", got, tc.wantXFF)
			}
			got := s.values("Forwarded")
			switch {
			case tc.wantFwd == "" && len(got) != 0:
				t.Errorf("backend Forwarded fields %q, want none", got)
			case tc.wantFwd != "" && (len(got) != 1 || got[0] != tc.wantFwd):
				t.Errorf("backend Forwarded fields %q, want exactly [%q]", got, tc.wantFwd)
			}
		})
	}
}

// RFC 7239 §6: an IPv6 node is quoted and bracketed.
func TestAppendForwardedFor(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"192.0.2.43", "for=192.0.2.43"},
		{"2001:db8:cafe::17", `for="[2001:db8:cafe::17]"`},
		{"::1", `for="[::1]"`},
	} {
		if got := string(appendForwardedFor(nil, netip.MustParseAddr(tc.ip))); got != tc.want {
			t.Errorf("appendForwardedFor(%s) = %q, want %q", tc.ip, got, tc.want)
		}
	}
}

// CONNECT and TRACE are answered 405 with Allow and an OpenAI-shaped error; nothing reaches
// the backend.
func TestConnectAndTraceRefused(t *testing.T) {
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	for _, raw := range []string{
		"CONNECT internal.example:443 HTTP/1.1\r\nHost: internal.example:443\r\n\r\n",
		"TRACE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
		"trace / HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		resp, body := rqRoundTrip(t, base, raw)
		if resp.StatusCode != 405 || resp.Header.Get("Allow") == "" || !bytes.Contains(body, []byte(`"code":"prefixlb_405"`)) {
			t.Errorf("%.20q: %d Allow=%q %s, want 405 with Allow and an OpenAI error", raw, resp.StatusCode, resp.Header.Get("Allow"), body)
		}
	}
	select {
	case s := <-be.seen:
		t.Errorf("backend received %q", s.line)
	default:
	}
}

// A request line naming another HTTP version than 1.0 or 1.1 is answered 505 and not
// forwarded as sent.
func TestUnknownHTTPVersionRefused(t *testing.T) {
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	for _, v := range []string{"HTTP/2.0", "HTTP/9.9", "HTTP/1.2", "HTTP/0.9"} {
		resp, body := rqRoundTrip(t, base, "GET /v1/models "+v+"\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
		if resp.StatusCode != 505 || !bytes.Contains(body, []byte(`"code":"prefixlb_505"`)) {
			t.Errorf("%s: %d %s, want 505 with an OpenAI error", v, resp.StatusCode, body)
		}
	}
	select {
	case s := <-be.seen:
		t.Errorf("backend received %q", s.line)
	default:
	}
	// 1.0 and 1.1 are forwarded.
	for _, v := range []string{"HTTP/1.0", "HTTP/1.1"} {
		if resp, _ := rqRoundTrip(t, base, "GET /v1/models "+v+"\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
			t.Errorf("%s: %d, want 200", v, resp.StatusCode)
		}
		recvWithin(t, be.seen, 10*time.Second, v+" request not forwarded")
	}
}

// Expect: 100-continue is answered by prefixlb (it reads the body before forwarding), so it
// is not forwarded: the backend gets the body at once.
func TestExpectNotForwarded(t *testing.T) {
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, nil)
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	body := `{"model":"m","messages":[]}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("first response line %q, %v; want 100 Continue", line, err)
	}
	if _, err := br.ReadString('\n'); err != nil { // the blank line after 100 Continue
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, body)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s := recvWithin(t, be.seen, 10*time.Second, "the backend got no request")
	if s.has("Expect") || string(s.body) != body {
		t.Errorf("backend received Expect %q, body %q", s.values("Expect"), s.body)
	}
}

// A request in bare-LF line endings is answered at once (400), not left waiting for a CRLF
// CRLF until timeouts.client_read. CRLF requests with blank lines in their bodies, and the
// CRLF a client may send between requests, are unaffected.
func TestBareLFRequestAnsweredAtOnce(t *testing.T) {
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, func(o *Options) {
		o.Timeouts.ClientRead = 30 * time.Second // a hang shows as no answer within 10 s
	})
	for _, raw := range []string{
		"GET /v1/models HTTP/1.1\nHost: x\n\n",
		"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\n\n",
		"GET /v1/models HTTP/1.1\nHost: x\n\r\n",
	} {
		resp, body := rqRoundTrip(t, base, raw)
		if resp.StatusCode != 400 || !bytes.Contains(body, []byte("CRLF")) {
			t.Errorf("%q: %d %s, want 400 naming CRLF", raw, resp.StatusCode, body)
		}
	}
	// One connection: a body with blank lines, then CRLF, then another request.
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	pretty := "{\n\n  \"model\": \"m\",\n\n  \"messages\": []\n}\n\n"
	for i, raw := range []string{rqPost("", pretty), "\r\n" + rqPost("", `{}`), rqPost("", pretty[:3])} {
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the kept-alive connection: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("request %d: status %d", i, resp.StatusCode)
		}
		recvWithin(t, be.seen, 10*time.Second, "request not forwarded")
	}
}

// The lfScan state machine on its own, fed in every split.
func TestLFScan(t *testing.T) {
	for _, tc := range []struct {
		in   string
		bare bool
	}{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n{\n\n}", false},
		{"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n", false},
		{"\n\nGET / HTTP/1.1\r\nHost: x\r\n", false},
		{"GET / HTTP/1.1\nHost: x\r\n\r\n", false},
		{"GET / HTTP/1.1\nHost: x\n\n", true},
		{"GET / HTTP/1.1\r\nHost: x\r\n\n", true},
		{"GET / HTTP/1.1\nHost: x\n\r\n", true},
		{"GET / HTTP/1.1\nHost: x\n\nbody\r\n\r\n", false},
	} {
		for split := 0; split <= len(tc.in); split++ {
			var s lfScan
			s.scan([]byte(tc.in[:split]))
			s.scan([]byte(tc.in[split:]))
			if s.bare != tc.bare {
				t.Errorf("%q split at %d: bare %v, want %v", tc.in, split, s.bare, tc.bare)
			}
		}
	}
}

// fasthttp's parse errors quote the offending bytes. None of them reaches a log line (any
// level, fasthttp's own messages included) or the client: a marker secret in an
// Authorization value, a header name or the request line never shows up.
func TestParseErrorsNeverShowHeaderValues(t *testing.T) {
	const secret = "sk-MARKER-7f3a9c"
	log, logs := recordingLogger()
	be := newRQBackend(t, "")
	_, base := startProxy(t, "round-robin", []string{be.URL()}, logTo(log))
	for _, raw := range []string{
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\rX\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\x00\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-" + secret + "\x01: v\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer " + secret + "\r\n\r\n",
		"GET /" + secret + "\x7f HTTP/1.1\r\nHost: x\r\n\r\n",
		"GETX/v1\r\nAuthorization: Bearer " + secret + "\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nHost: y\r\nAuthorization: Bearer " + secret + "\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\nTransfer-Encoding: gzip, " + secret + "\r\n\r\n",
		"GET /v1/models HTTP/1.1\nAuthorization: Bearer " + secret + "\nHost: x\n\n",
	} {
		resp, body := rqRoundTrip(t, base, raw)
		if resp.StatusCode < 400 || resp.StatusCode >= 600 {
			t.Errorf("%.40q: status %d, want an error", raw, resp.StatusCode)
		}
		if bytes.Contains(body, []byte(secret)) || strings.Contains(fmt.Sprint(resp.Header), secret) {
			t.Errorf("%.40q: the response echoes the secret: %s", raw, body)
		}
	}
	eventually(t, 5*time.Second, "a rejected-request log line per request", func() bool {
		return len(logs.WithMessage("rejected request")) >= 9
	})
	for _, e := range logs.Entries() {
		if line := e.Text(); strings.Contains(line, secret) {
			t.Errorf("log line at %s shows the secret: %s", e.Level, line)
		}
	}
}

// The header rewrites run on every request: they allocate nothing for ordinary headers
// (fields on the stack, names and values pointing into the parsed header).
func TestHeaderRewritesDoNotAllocate(t *testing.T) {
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: keep-alive, x-hop\r\n" +
		"x-hop: 1\r\nX-Forwarded-For: 10.0.0.1\r\nforwarded: for=10.0.0.1\r\nTE: trailers\r\nExpect: 100-continue\r\nAuthorization: Bearer x\r\nContent-Length: 2\r\n\r\n{}"
	var req fasthttp.Request
	var br bufio.Reader
	var sr strings.Reader
	read := func() {
		req.Reset()
		req.Header.DisableNormalizing()
		sr.Reset(raw)
		br.Reset(&sr)
		if err := req.Read(&br); err != nil {
			t.Fatal(err)
		}
	}
	peer := netip.MustParseAddr("127.0.0.1")
	base := testing.AllocsPerRun(200, read)
	with := testing.AllocsPerRun(200, func() { read(); prepareRequestHeader(&req.Header, peer) })
	if with != base {
		t.Errorf("prepareRequestHeader allocates %v times per request", with-base)
	}
	if got := string(req.Header.Peek("X-Forwarded-For")); got != "10.0.0.1, 127.0.0.1" || req.Header.Peek("x-hop") != nil {
		t.Errorf("rewritten header:\n%s", req.Header.Header())
	}

	var tmpl, resp fasthttp.ResponseHeader
	tmpl.Set("Content-Type", "application/json")
	tmpl.Set("Connection", "x-backend")
	tmpl.Set("X-Backend", "1")
	tmpl.Set("Keep-Alive", "timeout=5")
	tmpl.Set("X-Kept", "1")
	resp.DisableNormalizing()
	base = testing.AllocsPerRun(200, func() { tmpl.CopyTo(&resp) })
	with = testing.AllocsPerRun(200, func() { tmpl.CopyTo(&resp); stripHopResponse(&resp) })
	if with != base {
		t.Errorf("stripHopResponse allocates %v times per response", with-base)
	}
	if resp.Peek("X-Backend") != nil || resp.Peek("Keep-Alive") != nil || resp.Peek("X-Kept") == nil {
		t.Errorf("stripped response header:\n%s", resp.Header())
	}
}
