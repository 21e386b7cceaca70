package proxy

import (
	"context"
	"net"
)

// Serving is a Server that Start set serving on a listener.
type Serving struct {
	*Server
	ln   net.Listener
	done chan struct{}
	err  error // Serve's, once done is closed
}

// Start is the one way a Server starts serving, in prefixlb serve, the bench and the
// tests: it checks every backend once (unless active checks are disabled; bounded by one
// check's timeout and by ctx), then serves ln in the background until Stop. A backend that
// never passed a check takes no traffic, so without the first checks the requests that
// arrive right after a start would be refused; requests that arrive meanwhile wait in ln's
// backlog.
func (s *Server) Start(ctx context.Context, ln net.Listener) *Serving {
	if o := s.hc.Options(); !o.Disabled {
		checkCtx, cancel := context.WithTimeout(ctx, o.Timeout)
		s.hc.CheckOnce(checkCtx)
		cancel()
	}
	s.hcOnce.Do(s.hc.Start) // here, not in Serve's goroutine: a Stop right after must find it started
	sv := &Serving{Server: s, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(sv.done)
		sv.err = s.Serve(ln)
	}()
	return sv
}

// Addr is the address the Server listens on.
func (sv *Serving) Addr() net.Addr { return sv.ln.Addr() }

// URL is the base URL of the data listener: http://host:port.
func (sv *Serving) URL() string { return "http://" + sv.ln.Addr().String() }

// Done is closed when Serve has returned, with Err.
func (sv *Serving) Done() <-chan struct{} { return sv.done }

// Err is what Serve returned; call it once Done is closed.
func (sv *Serving) Err() error { return sv.err }

// Stop shuts the Server down (see Shutdown: in-flight requests finish until ctx is done)
// and waits for Serve to return. It returns Shutdown's error.
func (sv *Serving) Stop(ctx context.Context) error {
	err := sv.Shutdown(ctx)
	// Shutdown closes the listeners Serve has registered; a Stop right after Start can come
	// before Serve registered its own, which would then accept forever.
	_ = sv.ln.Close()
	<-sv.done
	return err
}
