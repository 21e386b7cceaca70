package proxy

// The disconnect watchdog: a client that leaves behind bytes it sent after its request is
// noticed like any other.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// A client that sent anything after its request (the CRLF RFC 9112 allows, or a pipelined
// request) and then left is noticed as any other: the backend, still holding the response
// (it never answers), sees its connection closed. Before, the watchdog's peek saw the byte,
// not the EOF behind it, and the backend worked on until response_header.
func TestDisconnectSeenBehindTrailingBytes(t *testing.T) {
	for _, after := range []string{"\r\n", "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"} {
		t.Run(fmt.Sprintf("%q", after[:min(len(after), 8)]), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			got, closed := make(chan struct{}, 1), make(chan struct{}, 1)
			go func() { // silent backend: reads the request, never answers, reports EOF
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := rqReadRequest(br); err != nil {
					return
				}
				got <- struct{}{}
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				if _, err := br.ReadByte(); err == io.EOF {
					closed <- struct{}{}
				}
			}()
			s, base := startProxy(t, "round-robin", []string{"http://" + ln.Addr().String()}, func(o *Options) {
				o.Timeouts.ResponseHeader = 60 * time.Second
			})
			c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, rqPost("", `{"model":"m","messages":[]}`)); err != nil {
				t.Fatal(err)
			}
			recvWithin(t, got, 10*time.Second, "the backend got no request")
			if _, err := io.WriteString(c, after); err != nil { // lands in the socket: fasthttp is in the handler
				t.Fatal(err)
			}
			_ = c.Close()
			recvWithin(t, closed, 10*time.Second, "the backend's connection was not closed after the client left")
			waitInFlightZero(t, s)
		})
	}
}
