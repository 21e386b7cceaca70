package proxy

// The routing key of a request (router/key), built from its path and body with a panic in the
// key builder contained: such a request is routed as one prefixlb cannot parse. recover.go
// says where else a request's serving contains panics.

import (
	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/router/key"
)

// buildKey is s.keys.Build with a panic in it contained: the request is then keyed as one
// whose body prefixlb cannot read (key.Fallback: parse-fallback routing, body forwarded
// unchanged), counted and logged. id names the request in the log (0: /debug/route).
func (s *Server) buildKey(id uint64, path, body []byte, k *key.Key) {
	defer s.containKeyPanic(id, path, body, k)
	s.keys.Build(path, body, k)
	s.testPanicAt(stageKey)
}

// containKeyPanic is buildKey's deferred recover.
func (s *Server) containKeyPanic(id uint64, path, body []byte, k *key.Key) {
	p := recover()
	if p == nil {
		return
	}
	s.m.keyPanics.Inc()
	fields := append(s.panicFields(logKeyPanic, p), zap.Uint64("request_id", id), zap.ByteString("path", path),
		zap.Int("body_bytes", len(body)))
	if fallbackKey(path, body, k) {
		fields = append(fields, zap.Bool("model_scan_panicked", true))
	}
	s.log.Error(logKeyPanic, fields...)
}

// fallbackKey is key.Fallback, with a panic in its model scan contained (k then has no
// model: its pool is every backend's). It reports whether the scan panicked.
func fallbackKey(path, body []byte, k *key.Key) (panicked bool) {
	defer func() {
		if recover() != nil {
			k.Model = k.Model[:0]
			panicked = true
		}
	}()
	key.Fallback(path, body, k)
	return false
}
