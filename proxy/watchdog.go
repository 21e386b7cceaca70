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
// registering a request takes no global lock, and a shard's lock is held only to list its
// flows and to abort one, never across the poll syscalls: a request registering (on its path
// to the backend, timed in prefixlb_routing_seconds_total{stage="pick"}) waits for a map
// operation, not for a poll of every client in the shard, which a CPU-starved host stretches
// to tens of milliseconds.
type watchdog struct {
	shards [16]watchShard
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
	poll   func(syscall.RawConn, *peekScratch) bool // peerClosed; a test's stand-in
}

type watchShard struct {
	mu    sync.Mutex
	flows map[*flow]struct{}
}

func newWatchdog() *watchdog { return newWatchdogPolling(peerClosed) }

func newWatchdogPolling(poll func(syscall.RawConn, *peekScratch) bool) *watchdog {
	w := &watchdog{stop: make(chan struct{}), done: make(chan struct{}), poll: poll}
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
	var batch []watched
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		for i := range w.shards {
			s := &w.shards[i]
			batch = batch[:0]
			s.mu.Lock()
			for f := range s.flows {
				if f.raw == nil && f.conn0 != nil {
					f.raw = rawConn(f.conn0)
				}
				if f.raw != nil {
					batch = append(batch, watched{f: f, id: f.id, raw: f.raw})
				}
			}
			s.mu.Unlock()
			for _, c := range batch {
				if !w.poll(c.raw, &ps) {
					continue
				}
				// The flow may have ended meanwhile (and its pooled struct serve another
				// request): abort it only if it is still the one polled.
				s.mu.Lock()
				if _, ok := s.flows[c.f]; ok && c.f.id == c.id {
					c.f.abort(errClientGone)
				}
				s.mu.Unlock()
			}
			clear(batch)
		}
	}
}

// watched is a flow listed for one poll: the flow, its request's id and its client socket
// (a socket closed since then polls as gone, and the flow is checked again before an abort).
type watched struct {
	f   *flow
	id  uint64
	raw syscall.RawConn
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
