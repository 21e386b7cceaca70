package sim

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/prefixlb/prefixlb/bench/kvevents"
)

// eventLog collects one engine step's KV events, as vLLM's block pool does for its
// publisher: a BlockStored per request and step for the run of full blocks it cached (each
// block's parent the one before it), a BlockRemoved per cached block evicted to make room.
// The engine's goroutine fills it under the replica's lock and, still under it, hands each
// step's events to the replica's Publisher, whose goroutine encodes and sends them.
type eventLog struct {
	events []kvevents.Event
}

// stored records that r's block k, hash h, of bs tokens is now cached.
func (l *eventLog) stored(r *Request, k int, h uint64, bs int) {
	toks := r.tokens[k*bs : (k+1)*bs]
	if n := len(l.events); k > 0 && n > 0 {
		last := &l.events[n-1]
		if last.Kind == kvevents.KindBlockStored && last.BlockHashes[len(last.BlockHashes)-1] == r.hashes[k-1] {
			last.BlockHashes = append(last.BlockHashes, h)
			last.TokenIDs = append(last.TokenIDs, toks...)
			return
		}
	}
	e := kvevents.Event{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{h},
		TokenIDs: append(make([]uint32, 0, bs), toks...), BlockSize: bs, Medium: kvevents.MediumGPU}
	if k > 0 {
		e.Parent, e.HasParent = r.hashes[k-1], true
	}
	l.events = append(l.events, e)
}

// removed records that the cached block with hash h was evicted.
func (l *eventLog) removed(h uint64) {
	l.events = append(l.events, kvevents.Event{Kind: kvevents.KindBlockRemoved,
		BlockHashes: []uint64{h}, Medium: kvevents.MediumGPU})
}

// enableKVEvents makes the engine record KV events (takeKVEvents hands them out).
func (e *Engine) enableKVEvents() { e.kv.ev = &eventLog{} }

// takeKVEvents returns the events recorded since the last call (nil when none or off).
func (e *Engine) takeKVEvents() []kvevents.Event {
	if e.kv.ev == nil || len(e.kv.ev.events) == 0 {
		return nil
	}
	evs := e.kv.ev.events
	e.kv.ev.events = nil
	return evs
}

// replicaEndpoint is replica i's KV-event endpoint for a cluster configured with ep: the same
// ephemeral port 0, or the base port + i (as vLLM offsets its endpoint by data-parallel rank).
func replicaEndpoint(ep string, i int) (string, error) {
	if err := kvevents.CheckEndpoint(ep); err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+i > 65535 {
		return "", fmt.Errorf("--kv-events-endpoint %q: bad port", ep)
	}
	if p > 0 {
		p += i
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// openKVEvents binds the replica's KV-event publisher on ep and makes the engine record
// events. It is called before Serve starts the engine.
func (r *Replica) openKVEvents(ep string) error {
	if r.eng == nil || r.pub != nil {
		return nil
	}
	pub, err := kvevents.NewPublisher(ep, "", 0)
	if err != nil {
		return fmt.Errorf("%s: kv events: %w", r.name, err)
	}
	r.pub = pub
	r.mu.Lock()
	r.eng.enableKVEvents()
	r.mu.Unlock()
	return nil
}

// publishKVEvents hands one step's events to the publisher (never blocking the engine).
func (r *Replica) publishKVEvents(evs []kvevents.Event) {
	if r.pub == nil || len(evs) == 0 {
		return
	}
	r.pub.Publish(kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs})
}

// KVEvents describes the replica's KV-event publisher: its endpoint ("" when events are
// off), the batches sent and those dropped because the publisher's queue was full.
func (r *Replica) KVEvents() (endpoint string, sent, dropped uint64) {
	if r.pub == nil {
		return "", 0, 0
	}
	return r.pub.Endpoint(), r.pub.Sent(), r.pub.Dropped()
}

// KVEventsSubscribed reports whether a subscriber's subscription has reached the replica's
// publisher (false when events are off).
func (r *Replica) KVEventsSubscribed() bool { return r.pub != nil && r.pub.Subscribed() }

// KVEventEndpoints returns each replica's KV-event endpoint, in the order of URLs (nil
// when events are off).
func (c *Cluster) KVEventEndpoints() []string {
	var out []string
	for _, r := range c.replicas {
		if ep, _, _ := r.KVEvents(); ep != "" {
			out = append(out, ep)
		}
	}
	return out
}
