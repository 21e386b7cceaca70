package proxy

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns the two ends of a TCP connection on 127.0.0.1.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(acc)
			return
		}
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, ok := <-acc
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// blockingPoll is a watchdog poll that reports each call on polling and returns gone (true
// for the first call only when goneOnce) once release is closed.
type blockingPoll struct {
	polling  chan struct{}
	release  chan struct{}
	goneOnce bool
	calls    atomic.Int32
	once     sync.Once
}

func newBlockingPoll(goneOnce bool) *blockingPoll {
	return &blockingPoll{polling: make(chan struct{}, 1), release: make(chan struct{}), goneOnce: goneOnce}
}

func (p *blockingPoll) poll(syscall.RawConn, *peekScratch) bool {
	n := p.calls.Add(1)
	select {
	case p.polling <- struct{}{}:
	default:
	}
	<-p.release
	return p.goneOnce && n == 1
}

func (p *blockingPoll) open() { p.once.Do(func() { close(p.release) }) }

// TestWatchdogRegistersWhilePolling: registering a request (on its way to the backend, timed
// as routing) does not wait for the watchdog's poll of the clients of its shard. The watchdog
// used to hold the shard's lock across every poll syscall; on a CPU-starved bench host that
// held a round-robin request for up to 296 ms, read as routing time.
func TestWatchdogRegistersWhilePolling(t *testing.T) {
	p := newBlockingPoll(false)
	w := newWatchdogPolling(p.poll)
	defer w.close()
	defer p.open()
	c1, _ := tcpPair(t)
	c2, _ := tcpPair(t)
	n := uint64(len(w.shards))
	w.add(&flow{id: n, conn0: c1})
	select {
	case <-p.polling:
	case <-time.After(10 * time.Second):
		t.Fatal("the watchdog never polled the flow")
	}
	added := make(chan struct{})
	go func() {
		w.add(&flow{id: 2 * n, conn0: c2}) // the same shard
		close(added)
	}()
	select {
	case <-added:
	case <-time.After(5 * time.Second):
		t.Fatal("registering a flow waited for the watchdog's poll of its shard")
	}
}

// TestWatchdogSparesAFlowThatEndedWhilePolled: a flow that ended while the watchdog polled
// its client, its pooled struct serving the next request, is not aborted for the poll.
func TestWatchdogSparesAFlowThatEndedWhilePolled(t *testing.T) {
	p := newBlockingPoll(true)
	w := newWatchdogPolling(p.poll)
	c1, _ := tcpPair(t)
	f := &flow{id: 1, conn0: c1}
	w.add(f)
	select {
	case <-p.polling:
	case <-time.After(10 * time.Second):
		p.open()
		w.close()
		t.Fatal("the watchdog never polled the flow")
	}
	removed := make(chan struct{})
	go func() {
		w.remove(f) // the request ends; its struct is reused for the next one
		f.id = 1 + uint64(len(w.shards))
		w.add(f)
		close(removed)
	}()
	select {
	case <-removed:
	case <-time.After(5 * time.Second):
		p.open()
		w.close()
		t.Fatal("ending a flow waited for the watchdog's poll")
	}
	p.open() // the poll of the old request reports its client gone
	for deadline := time.Now().Add(10 * time.Second); p.calls.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // the next tick polls the new request
	}
	w.close()
	if f.gone.Load() {
		t.Fatal("the next request on the flow's struct was aborted for the poll of the one before")
	}
}
