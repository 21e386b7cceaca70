package proxy

// Shared test scaffolding: every wait in a proxy test is bounded and fails with a message.

import (
	"net"
	"net/http"
	"testing"
	"time"
)

// testTimeout bounds one request of a test client: a proxy that stops answering fails the test
// with a message instead of hanging the package until go test's own timeout.
const testTimeout = 30 * time.Second

// testClient is an HTTP client with its own connection pool and a total timeout per request.
func testClient() *http.Client {
	return &http.Client{
		Timeout:   testTimeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
	}
}

// eventually polls cond every 2 ms until it holds, and fails the test with what if it does not
// within limit.
func eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", limit, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// recvWithin receives one value from ch, failing the test with what after limit.
func recvWithin[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatalf("not within %v: %s", limit, what)
	}
	var zero T
	return zero
}

// deadURL is the URL of a 127.0.0.1 port that was just listened on and closed: connecting to
// it is refused.
func deadURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	_ = ln.Close()
	return "http://" + a
}
