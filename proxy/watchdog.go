package proxy

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// watchInterval is how often client sockets are checked: a client that leaves is noticed
// within this interval (plus one syscall), well inside the 1 s the engine needs to abort.
const watchInterval = 200 * time.Millisecond

// watchdog notices clients that disconnect while their request is in flight, including while
// the backend is still silent (queued or prefilling) and nothing is being written. fasthttp
// offers no disconnect signal (fasthttp #874), so one goroutine asks the kernel about every
// watched client socket (peerClosed: poll with POLLRDHUP on Linux, which sees the client's
// FIN even behind bytes it sent after its request). The registry is sharded so that
// registering a request takes no global lock.
type watchdog struct {
	shards [16]watchShard
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

type watchShard struct {
	mu    sync.Mutex
	flows map[*flow]struct{}
}

func newWatchdog() *watchdog {
	w := &watchdog{stop: make(chan struct{}), done: make(chan struct{})}
	for i := range w.shards {
		w.shards[i].flows = make(map[*flow]struct{})
	}
	go w.run()
	return w
}

func (w *watchdog) shard(f *flow) *watchShard { return &w.shards[f.id%uint64(len(w.shards))] }

func (w *watchdog) add(f *flow) {
	s := w.shard(f)
	s.mu.Lock()
	s.flows[f] = struct{}{}
	s.mu.Unlock()
}

// remove unregisters f. After it returns the watchdog no longer touches f.
func (w *watchdog) remove(f *flow) {
	s := w.shard(f)
	s.mu.Lock()
	delete(s.flows, f)
	s.mu.Unlock()
}

func (w *watchdog) close() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

func (w *watchdog) run() {
	defer close(w.done)
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	var ps peekScratch
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		for i := range w.shards {
			s := &w.shards[i]
			s.mu.Lock()
			for f := range s.flows {
				if f.raw == nil && f.conn0 != nil {
					f.raw = rawConn(f.conn0)
				}
				if f.raw != nil && peerClosed(f.raw, &ps) {
					f.abort(errClientGone)
				}
			}
			s.mu.Unlock()
		}
	}
}

// rawConn returns the socket under c when it has one (TCP, Unix; TLS through NetConn).
func rawConn(c net.Conn) syscall.RawConn {
	type netConner interface{ NetConn() net.Conn }
	if nc, ok := c.(netConner); ok {
		c = nc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}
