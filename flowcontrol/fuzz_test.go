package flowcontrol

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

// checkInvariants verifies the queue's internal bookkeeping: counts and bytes add up over
// bands and flows, every heap index points back at its entry, and the queue holds at most
// its bounds.
func checkInvariants(t testing.TB, q *Queue) {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	count, bytes := 0, int64(0)
	for i, b := range q.bands {
		if i > 0 && q.bands[i-1].priority <= b.priority {
			t.Fatal("bands out of priority order")
		}
		if q.byPrio[b.priority] != b {
			t.Fatal("byPrio disagrees with bands")
		}
		bc, bb := 0, int64(0)
		for id, f := range b.flows {
			n, nb := 0, int64(0)
			for it := f.head; it != nil; it = it.next {
				n++
				nb += it.Bytes
				if it.state != stateQueued || it.flow != f {
					t.Fatalf("flow %s links an item in state %d", id, it.state)
				}
				if it.next != nil && it.next.seq < it.seq {
					t.Fatalf("flow %s out of arrival order: %d before %d", id, it.seq, it.next.seq)
				}
			}
			if n != f.count || nb != f.bytes {
				t.Fatalf("flow %s counts %d/%d, links %d/%d", id, f.count, f.bytes, n, nb)
			}
			if (f.count > 0) != (f.heapIdx >= 0) || (f.count > 0) != (f.fatIdx >= 0) {
				t.Fatalf("flow %s with %d queued has heap index %d, fat index %d", id, f.count, f.heapIdx, f.fatIdx)
			}
			if f.heapIdx >= 0 && (b.backlog[f.heapIdx] != f || b.fat[f.fatIdx] != f) {
				t.Fatalf("flow %s heap indexes stale", id)
			}
			if f.idleIdx >= 0 && b.idle[f.idleIdx] != f {
				t.Fatalf("flow %s idle index stale", id)
			}
			bc += n
			bb += nb
		}
		if bc != b.count || bb != b.bytes || len(b.backlog) != len(b.fat) {
			t.Fatalf("band %d counts %d/%d, flows hold %d/%d", b.priority, b.count, b.bytes, bc, bb)
		}
		count += bc
		bytes += bb
	}
	if count != q.count || bytes != q.bytes {
		t.Fatalf("queue counts %d/%d, bands hold %d/%d", q.count, q.bytes, count, bytes)
	}
	if q.active.Load() != (len(q.bands) > 0) {
		t.Fatalf("Active %v with %d bands", q.active.Load(), len(q.bands))
	}
	for i, it := range q.deadlines {
		if it.dlIndex != i || it.state != stateQueued {
			t.Fatal("deadline heap index stale or holds an item not queued")
		}
	}
}

// checkOut verifies the accounting of the items out of the queue, popped (awaiting
// Dispatched or Requeue) and in flight (awaiting Settle or Return): each band's and flow's
// popped and in-flight counts, each band's pendingAbove (the work of the higher bands'
// popped items counted above it), no negative served work, and, unless some placement was
// taken back (a band may have spent the credit a returned item earned it), no negative band
// credit.
func checkOut(t testing.TB, q *Queue, popped, inflight []*Item, returned bool) {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, b := range q.bands {
		np, pending := 0, int64(0)
		for _, it := range popped {
			if it.state != statePopped {
				t.Fatalf("an item awaiting Dispatched or Requeue is in state %d", it.state)
			}
			if it.flow.band == b {
				np++
			}
			for _, hb := range q.bands[:i] {
				if it.flow.band == hb && b.seq <= it.bandSeq {
					pending += it.work
				}
			}
		}
		if np != b.popped {
			t.Fatalf("band %d counts %d popped, %d are", b.priority, b.popped, np)
		}
		if pending != b.pendingAbove {
			t.Fatalf("band %d pendingAbove %d, the higher bands' popped items hold %d", b.priority, b.pendingAbove, pending)
		}
		if c := b.credit(q.share); !returned && c < 0 {
			t.Fatalf("band %d credit %g", b.priority, c)
		}
		for id, f := range b.flows {
			fp, fi := 0, 0
			for _, it := range popped {
				if it.flow == f {
					fp++
				}
			}
			for _, it := range inflight {
				if it.flow == f {
					fi++
				}
			}
			if f.popped != fp || f.inflight != fp+fi {
				t.Fatalf("flow %s counts %d popped, %d out; %d popped, %d in flight are", id, f.popped, f.inflight, fp, fi)
			}
			if f.served < 0 {
				t.Fatalf("flow %s served %d", id, f.served)
			}
		}
	}
	for _, it := range append(popped, inflight...) {
		if q.byPrio[it.Priority] != it.flow.band {
			t.Fatalf("an item out belongs to band %d, which the queue dropped", it.Priority)
		}
		if it.flow.band.flows[it.Flow] != it.flow {
			t.Fatal("an item out belongs to a flow its band forgot")
		}
	}
}

// Nothing is lost: under any sequence of operations every accepted item gets exactly one
// outcome (after a final Drain, with popped items requeued or dispatched), no item is
// popped twice, and the bookkeeping stays consistent.
func FuzzNothingLost(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 0, 3, 1, 1, 2, 4, 5, 6, 7, 0, 9, 1})
	f.Add([]byte("\x00\x10\x00\x21\x00\x32\x01\x03\x01\x02\x08\x00\x06\x07\x07\x07\x06"))
	f.Add([]byte{0, 255, 0, 254, 0, 253, 0, 252, 0, 251, 0, 250, 0, 249, 0, 248, 0, 247, 0, 246, 1, 1, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		q := mustNew(t, Config{MaxItems: 6, MaxBytes: 600, MinBandShare: 0.3})
		now := t0
		outcomes := map[*Item]int{}
		var accepted, popped, inflight []*Item
		returned := false
		read := func() {
			for _, it := range accepted {
				select {
				case <-it.done:
					outcomes[it]++
					if outcomes[it] > 1 {
						t.Fatal("an item got two outcomes")
					}
				default:
				}
			}
		}
		take := func(s *[]*Item, b byte) *Item {
			if len(*s) == 0 {
				return nil
			}
			i := int(b) % len(*s)
			it := (*s)[i]
			*s = append((*s)[:i], (*s)[i+1:]...)
			return it
		}
		for i := 0; i < len(ops); i++ {
			arg := byte(0)
			if i+1 < len(ops) {
				arg = ops[i+1]
			}
			switch ops[i] % 10 {
			case 0:
				i++
				it := &Item{Priority: int(arg%3) - 1, Flow: fmt.Sprint(arg % 4), Bytes: int64(arg%8) * 40,
					Cost: Cost{UncachedPrefillTokens: int(arg), OutputTokens: int(arg >> 4)}, Arrival: now}
				if arg&0x80 != 0 {
					it.Deadline = now.Add(time.Duration(arg%5) * time.Second)
				}
				if q.Push(it, arg&0x40 != 0) == nil {
					accepted = append(accepted, it)
				}
			case 1:
				if it := q.Next(now); it != nil {
					for _, p := range popped {
						if p == it {
							t.Fatal("Next returned an item already popped")
						}
					}
					popped = append(popped, it)
				}
			case 2:
				i++
				if it := take(&popped, arg); it != nil {
					q.Dispatched(it)
					inflight = append(inflight, it)
				}
			case 3:
				i++
				if it := take(&popped, arg); it != nil {
					q.Requeue(it)
				}
			case 4:
				i++
				if it := take(&inflight, arg); it != nil {
					if arg&0x80 != 0 && q.Return(it) {
						outcomes[it]-- // its Dispatched was read; it is queued again
						returned = true
					} else {
						q.Settle(it, Cost{OutputTokens: int(arg) * 100})
					}
				}
				// A request of some flow that went straight through ends.
				q.Charge(int(arg%3)-1, fmt.Sprint(arg%5), Cost{UncachedPrefillTokens: int(arg) * 10})
			case 5:
				i++
				if len(accepted) > 0 {
					q.Remove(accepted[int(arg)%len(accepted)])
				}
			case 6:
				q.Expire(now)
			case 7:
				now = now.Add(time.Second)
			case 8:
				q.Shed()
			case 9:
				i++
				switch arg % 4 {
				case 0:
					q.Drain()
				case 1: // a reload: bounds, share (strict, default or up to 0.45) and cap change
					if err := q.Reconfigure(Config{MaxItems: 2 + int(arg%16), MaxBytes: 200 + int64(arg)*4,
						MinBandShare: float64(arg%10)/20 - 0.05, MaxRequestWork: 50 + int64(arg)}); err != nil {
						t.Fatal(err)
					}
				case 2: // a reload to the other fairness policy
					c := q.Config()
					c.Fairness = map[string]string{FairnessVTC: FairnessRoundRobin, FairnessRoundRobin: FairnessVTC}[c.Fairness]
					if err := q.Reconfigure(c); err != nil {
						t.Fatal(err)
					}
				}
			}
			read()
			checkInvariants(t, q)
			checkOut(t, q, popped, inflight, returned)
		}
		q.Drain()
		for _, it := range popped {
			q.Requeue(it)
		}
		popped = nil
		read()
		checkOut(t, q, popped, inflight, returned)
		for _, it := range accepted {
			if outcomes[it] != 1 {
				t.Fatalf("an accepted item got %d outcomes", outcomes[it])
			}
		}
		if q.Len() != 0 || q.Bytes() != 0 {
			t.Fatalf("drained queue holds %d items, %d bytes", q.Len(), q.Bytes())
		}
	})
}

// Concurrent producers, a dispatcher and cancelling clients (run with -race): every
// accepted item ends exactly once.
func TestConcurrentUseEndsEveryItemOnce(t *testing.T) {
	q := mustNew(t, Config{MaxItems: 64})
	const producers, perProducer = 4, 500
	var wg sync.WaitGroup
	var mu sync.Mutex
	ended := map[*Item]Outcome{}
	accepted := 0
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perProducer {
				it := &Item{Priority: i % 3, Flow: fmt.Sprint(p, i%5), Cost: Cost{UncachedPrefillTokens: 100}}
				if q.Push(it, false) != nil {
					continue
				}
				mu.Lock()
				accepted++
				mu.Unlock()
				if i%7 == 0 {
					q.Remove(it) // a client that leaves; false when already popped
				}
				o := <-it.Done()
				mu.Lock()
				if _, dup := ended[it]; dup {
					t.Error("item ended twice")
				}
				ended[it] = o
				mu.Unlock()
				if o == Dispatched {
					q.Settle(it, it.Cost)
				}
			}
		}()
	}
	stop := make(chan struct{})
	dispatcherDone := make(chan struct{})
	go func() {
		defer close(dispatcherDone)
		for n := 0; ; n++ {
			it := q.Next(t0)
			if it == nil {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched() // nothing queued yet: let the pushers run
					continue
				}
			}
			if n%5 == 0 {
				q.Requeue(it) // placement found no room
				continue
			}
			q.Dispatched(it)
		}
	}()
	wg.Wait()
	close(stop)
	<-dispatcherDone
	if len(ended) != accepted || q.Len() != 0 {
		t.Fatalf("%d accepted, %d ended, %d still queued", accepted, len(ended), q.Len())
	}
}

// Flows and bands that come and go are forgotten: memory follows what is queued, not every
// flow ID ever seen.
func TestOneOffFlowsAreForgotten(t *testing.T) {
	q := mustNew(t, Config{})
	for range 50 {
		push(t, q, item(0, "steady", 100))
	}
	remembered := func() (flows, bands int) {
		q.mu.Lock()
		defer q.mu.Unlock()
		for _, b := range q.bands {
			flows += len(b.flows)
		}
		return flows, len(q.bands)
	}
	most := 0
	for i := range 10000 {
		push(t, q, item(i%7, fmt.Sprint("flow-", i), 100+i%1000))
		push(t, q, item(0, "steady", 100))
		dispatch(t, q, t0)
		dispatch(t, q, t0)
		flows, _ := remembered()
		most = max(most, flows)
	}
	if most > 200 {
		t.Fatalf("the queue remembered up to %d flows with about 50 queued: one-off flows leak", most)
	}
	for q.Len() > 0 {
		dispatch(t, q, t0)
	}
	if flows, bands := remembered(); flows != 0 || bands != 0 {
		t.Fatalf("empty queue remembers %d flows in %d bands after 10,000 one-off flows", flows, bands)
	}
}

// TestDistinctFlowFloodIsBounded: under a backlog that never empties, a flood of one-off
// flows (a client that sends every request with a new API key, which prefixlb does not
// authenticate) each dispatched once, or served straight through and charged, is remembered
// at most MaxItems idle flows per band: the band's virtual time stays at the fresh flows'
// level, so none of them would ever be forgotten by it, and memory would grow with every
// request.
func TestDistinctFlowFloodIsBounded(t *testing.T) {
	const maxItems = 100
	q := mustNew(t, Config{MaxItems: maxItems})
	for i := range 50 {
		push(t, q, item(0, fmt.Sprint("init-", i), 100))
	}
	remembered := func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		n := 0
		for _, b := range q.bands {
			n += len(b.flows)
		}
		return n
	}
	most := 0
	for i := range 5000 {
		push(t, q, item(0, fmt.Sprint("queued-", i), 100+i%1000))
		dispatch(t, q, t0)
		q.Charge(0, fmt.Sprint("direct-", i), Cost{UncachedPrefillTokens: 50 + i%500})
		most = max(most, remembered())
	}
	if limit := maxItems + 50 + 1; most > limit {
		t.Fatalf("the queue remembered up to %d flows with 50 queued (bound %d): a flood of one-off flows leaks", most, limit)
	}
	for q.Len() > 0 {
		dispatch(t, q, t0)
	}
	if n := remembered(); n != 0 {
		t.Fatalf("empty queue remembers %d flows", n)
	}
}
