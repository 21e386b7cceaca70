package proxy

import "io"

// extension is what a component beside the proxy (peering) adds to the admin listener: a
// condition of /readyz and lines of /metrics. Set before serving; nil fields add nothing.
type extension struct {
	ready   func() error
	metrics func(io.Writer)
}

// SetReadyGate makes /readyz fail (503, the error's text) while ready returns an error, on
// top of its own conditions: peering holds a starting replica back until it has a peer's
// index snapshot. Call it before serving the admin listener.
func (s *Server) SetReadyGate(ready func() error) {
	s.ext.ready = ready
}

// AddMetrics appends write's Prometheus text to /metrics. Call it before serving the admin
// listener.
func (s *Server) AddMetrics(write func(io.Writer)) {
	s.ext.metrics = write
}
