package proxy

import (
	"errors"
	"net"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/internal/rawconn"
)

// retryListener keeps accepting through temporary errors. Out of file descriptors (EMFILE,
// ENFILE) and aborted handshakes are retried with a backoff of 5 ms doubling to 1 s, as
// net/http's Server does; fasthttp would otherwise stop serving and the process would exit,
// cutting every in-flight stream. Accepted TCP connections are wrapped by rawconn.
type retryListener struct {
	net.Listener
	log *zap.Logger
}

func (l *retryListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return rawconn.Wrap(c), nil
		}
		if !temporaryAccept(err) {
			return nil, err
		}
		if delay == 0 {
			delay = 5 * time.Millisecond
			l.log.Warn("accept failing; retrying (raise the file-descriptor limit?)", zap.Error(err))
		} else {
			delay = min(2*delay, time.Second)
		}
		time.Sleep(delay)
	}
}

func temporaryAccept(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}
