package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestBufferedChunk(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{"5\r\nhello\r\n", true},
		{"5\r\nhello\r\n5\r\nwor", true},
		{"A\r\n0123456789\r\n", true},
		{"5;name=v\r\nhello\r\n", true},
		{"5\r\nhell", false},
		{"5\r\nhello\r", false},
		{"5\r\n", false},
		{"5", false},
		{"0\r\n\r\n", false}, // the terminating chunk is left for the next Read
		{"data: x\r\n", false},
		{"", false},
		{"fffffff\r\n", false},
	} {
		br := bufio.NewReaderSize(strings.NewReader(c.in), 64)
		_, _ = br.Peek(1) // fill the buffer as a socket read would
		if got := bufferedChunk(br); got != c.want {
			t.Errorf("bufferedChunk(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

// A backend that writes many chunks back to back: the proxy may relay several in one write,
// and the client must get every byte, in order.
func TestBackToBackChunksArriveIntact(t *testing.T) {
	var want strings.Builder
	for i := range 300 {
		fmt.Fprintf(&want, "data: {\"i\":%d,\"pad\":%q}\n\n", i, strings.Repeat("x", i%97))
	}
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for ev := range strings.SplitAfterSeq(want.String(), "\n\n") {
			if ev != "" {
				_, _ = io.WriteString(w, ev)
				fl.Flush()
			}
		}
	}))
	defer be.Close()
	_, url := startProxy(t, "round-robin", []string{be.URL}, nil)
	c := testClient()
	for range 5 {
		resp, err := c.Post(url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want.String() {
			t.Fatalf("relayed body differs: got %d bytes, want %d", len(got), want.Len())
		}
	}
}
