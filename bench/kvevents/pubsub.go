package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// DefaultQueue is the batches a Publisher holds for its sending goroutine before it drops
// (and counts) new ones: at one batch per engine step, seconds of steps.
const DefaultQueue = 4096

// CheckEndpoint reports whether ep is a ZMQ endpoint the bench may bind or dial:
// tcp://127.0.0.1:PORT (PORT 0 for an ephemeral port when binding).
func CheckEndpoint(ep string) error {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	host, _, err := net.SplitHostPort(rest)
	if !ok || err != nil || host != "127.0.0.1" {
		return fmt.Errorf("kv events endpoint %q: want tcp://127.0.0.1:PORT", ep)
	}
	return nil
}

// Publisher publishes batches on a ZMQ PUB socket bound to one endpoint, as vLLM's
// ZmqEventPublisher does (no replay socket). Publish never blocks: the batch is queued for a
// goroutine that encodes and sends it, or dropped and counted when the queue is full, so that
// the engine's step never waits on the network. Safe for concurrent use.
type Publisher struct {
	sock     zmq4.Socket
	endpoint string
	topic    []byte
	ch       chan Batch
	done     chan struct{}
	closing  sync.Once
	mu       sync.RWMutex // guards closed against Publish racing Close
	closed   bool

	published, sent, dropped atomic.Uint64
}

// NewPublisher binds a PUB socket on endpoint (CheckEndpoint) with topic (vLLM's default is
// "") and a queue of queue batches (0: DefaultQueue).
func NewPublisher(endpoint, topic string, queue int) (*Publisher, error) {
	if err := CheckEndpoint(endpoint); err != nil {
		return nil, err
	}
	if queue <= 0 {
		queue = DefaultQueue
	}
	sock := zmq4.NewPub(context.Background())
	if err := sock.Listen(endpoint); err != nil {
		sock.Close()
		return nil, err
	}
	p := &Publisher{sock: sock, endpoint: "tcp://" + sock.Addr().String(), topic: []byte(topic),
		ch: make(chan Batch, queue), done: make(chan struct{})}
	go p.run()
	return p, nil
}

// Endpoint is the bound endpoint, tcp://127.0.0.1:PORT (the port chosen when it was 0).
func (p *Publisher) Endpoint() string { return p.endpoint }

// Subscribed reports whether a subscriber's subscription has reached the socket: batches
// published before that are lost to it (ZMQ PUB/SUB's slow joiner).
func (p *Publisher) Subscribed() bool {
	t, ok := p.sock.(interface{ Topics() []string })
	return ok && len(t.Topics()) > 0
}

// Publish queues b; false when the queue was full (or the publisher closed) and b was
// dropped. b's slices must not change afterwards.
func (p *Publisher) Publish(b Batch) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		p.dropped.Add(1)
		return false
	}
	select {
	case p.ch <- b:
		p.published.Add(1)
		return true
	default:
		p.dropped.Add(1)
		return false
	}
}

// Published counts the batches Publish queued, Sent those of them handed to the socket and
// Dropped those dropped (at Publish, or by a failed send). With nothing dropped, the queue is
// drained when Sent equals Published.
func (p *Publisher) Published() uint64 { return p.published.Load() }
func (p *Publisher) Sent() uint64      { return p.sent.Load() }
func (p *Publisher) Dropped() uint64   { return p.dropped.Load() }

func (p *Publisher) run() {
	defer close(p.done)
	var seq uint64
	for b := range p.ch {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		seq++
		// A fresh payload each time: the socket may still hold the previous one queued.
		payload := AppendBatch(make([]byte, 0, 64+len(b.Events)*32), &b)
		if err := p.sock.SendMulti(zmq4.NewMsgFrom(p.topic, s[:], payload)); err != nil {
			p.dropped.Add(1)
			continue
		}
		p.sent.Add(1)
	}
}

// Close sends what is queued and closes the socket; a second Close does nothing and
// returns nil.
func (p *Publisher) Close() error {
	var err error
	p.closing.Do(func() {
		p.mu.Lock()
		p.closed = true
		close(p.ch)
		p.mu.Unlock()
		<-p.done
		err = closeSocket(p.sock)
	})
	return err
}

// closeSocket closes sock, not counting as an error a connection already closed. zmq4's
// reader closes a connection its peer has closed (a subscriber that left) and the socket
// drops it from its list later, on another goroutine, so the socket's Close may close it
// again and get net.ErrClosed ("use of closed network connection").
func closeSocket(sock zmq4.Socket) error {
	if err := sock.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// SubscriberStats counts what a Subscriber received.
type SubscriberStats struct {
	// Batches decoded and applied.
	Batches uint64
	// Missed is the batches the sequence numbers skipped (ZMQ dropped them, or they were
	// published before the subscription arrived).
	Missed uint64
	// BadBatches failed to decode (or were not 3-frame messages).
	BadBatches uint64
	// Index is what the index refused of the events (IndexStats).
	Index IndexStats
}

// Subscriber reads one replica's event stream into an Index under that replica's name.
type Subscriber struct {
	sock   zmq4.Socket
	idx    *Index
	worker string
	done   chan struct{}
	cancel context.CancelFunc

	stopping             atomic.Bool
	batches, missed, bad atomic.Uint64
}

// Subscribe dials endpoint (CheckEndpoint), subscribes to every topic and applies each
// batch to idx as worker's. It returns once connected; Close stops it.
func Subscribe(idx *Index, worker, endpoint string) (*Subscriber, error) {
	if err := CheckEndpoint(endpoint); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewSub(ctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(40))
	if err := sock.Dial(endpoint); err != nil {
		cancel()
		sock.Close()
		return nil, fmt.Errorf("kv events %s: %w", endpoint, err)
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		cancel()
		sock.Close()
		return nil, err
	}
	s := &Subscriber{sock: sock, idx: idx, worker: worker, done: make(chan struct{}), cancel: cancel}
	go s.run()
	return s, nil
}

func (s *Subscriber) run() {
	defer close(s.done)
	var next uint64
	started := false
	for {
		msg, err := s.sock.Recv()
		if err != nil {
			if s.stopping.Load() || errors.Is(err, context.Canceled) {
				return
			}
			s.bad.Add(1)
			time.Sleep(10 * time.Millisecond) // a lost connection: the dialer retries
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			s.bad.Add(1)
			continue
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if started && seq > next {
			s.missed.Add(seq - next)
		} else if !started && seq > 0 {
			s.missed.Add(seq) // batches before the subscription took effect
		}
		started, next = true, seq+1
		b, err := DecodeBatch(msg.Frames[2])
		if err != nil {
			s.bad.Add(1)
			continue
		}
		s.idx.Apply(s.worker, &b)
		s.batches.Add(1)
	}
}

// Stats returns what the subscriber has counted so far.
func (s *Subscriber) Stats() SubscriberStats {
	return SubscriberStats{Batches: s.batches.Load(), Missed: s.missed.Load(), BadBatches: s.bad.Load(),
		Index: s.idx.Stats(s.worker)}
}

// Close stops the subscriber and waits for its goroutine.
func (s *Subscriber) Close() error {
	s.stopping.Store(true)
	s.cancel()
	err := closeSocket(s.sock)
	<-s.done
	return err
}
