package proxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/router"
)

// Zero Options take the proxy's defaults; a set field is kept; no policy is an error.
func TestOptionsDefaults(t *testing.T) {
	s, err := New(Options{Policy: &router.RoundRobin{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"connect", s.connTimeout, DefaultConnectTimeout},
		{"response header", s.headerTimeout, DefaultResponseHeaderTimeout},
		{"idle", s.idleTimeout, DefaultIdleTimeout},
		{"client read", s.clientRead, DefaultClientReadTimeout},
		{"client write", s.clientWrite, DefaultClientWriteTimeout},
		{"client body idle", s.bodyIdle, DefaultClientBodyIdleTimeout},
		{"client read (fasthttp)", s.srv.ReadTimeout, DefaultClientReadTimeout},
	} {
		if c.got != c.want {
			t.Errorf("%s timeout %v, want the default %v", c.name, c.got, c.want)
		}
	}
	if s.maxBody != DefaultMaxRequestBodyBytes || s.srv.MaxRequestBodySize != DefaultMaxRequestBodyBytes || s.bodies.limit != DefaultMaxBufferedBodyBytes {
		t.Errorf("body limits %d / %d, buffered %d; want the defaults %d, %d", s.maxBody, s.srv.MaxRequestBodySize, s.bodies.limit,
			DefaultMaxRequestBodyBytes, DefaultMaxBufferedBodyBytes)
	}
	if !s.backendHeader || s.log == nil {
		t.Errorf("backend header %v, logger %v; want on and a no-op logger", s.backendHeader, s.log)
	}

	set, err := New(Options{Policy: &router.RoundRobin{}, Timeouts: Timeouts{Idle: time.Second}, OmitBackendHeader: true})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Shutdown(context.Background())
	if set.idleTimeout != time.Second || set.backendHeader {
		t.Errorf("idle %v, backend header %v; want the options' 1s and off", set.idleTimeout, set.backendHeader)
	}

	if _, err := New(Options{}); !errors.Is(err, errNoPolicy) {
		t.Errorf("New without a policy: %v, want %v", err, errNoPolicy)
	}
}
