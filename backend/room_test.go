package backend

import "testing"

// TestScrapedRequestsSplit: the scrape's running and waiting requests are kept apart, their
// sum is Requests, and QueuedScrapes counts the scrapes in a row with a queue, up to
// MaxQueuedScrapes, back to 0 at one without.
func TestScrapedRequestsSplit(t *testing.T) {
	b, _ := New("http://127.0.0.1:1", 0, 1)
	var l Lease
	l.Begin(b, 10, 10, false)
	defer l.Release()
	for _, tc := range []struct {
		running, waiting int64
		want             HealthReport
	}{
		{3, 0, HealthReport{Healthy: true, Requests: 3, Running: 3, Excess: 2, CountedAtScrape: 1}},
		{8, 2, HealthReport{Healthy: true, Requests: 10, Running: 8, Waiting: 2, QueuedScrapes: 1, Excess: 9, CountedAtScrape: 1}},
		{6, 1, HealthReport{Healthy: true, Requests: 7, Running: 6, Waiting: 1, QueuedScrapes: 2, LearnedLimit: 6, Excess: 6, CountedAtScrape: 1}},
		{2, 0, HealthReport{Healthy: true, Requests: 2, Running: 2, Excess: 1, CountedAtScrape: 1}},
		{5, 1, HealthReport{Healthy: true, Requests: 6, Running: 5, Waiting: 1, QueuedScrapes: 1, Excess: 5, CountedAtScrape: 1}},
	} {
		b.SetScrapedRequests(tc.running, tc.waiting, 0)
		if got := b.HealthReport(); got != tc.want {
			t.Errorf("running %d waiting %d: report %+v, want %+v", tc.running, tc.waiting, got, tc.want)
		}
	}
	for range 2 * MaxQueuedScrapes {
		b.SetScrapedRequests(5, 1, 0)
	}
	if got := b.HealthReport().QueuedScrapes; got != MaxQueuedScrapes {
		t.Errorf("a queue in every scrape: QueuedScrapes %d, want the cap %d", got, MaxQueuedScrapes)
	}
	b.SetScrapedLoad(6, 0) // no split: no queue known
	if got := b.HealthReport().QueuedScrapes; got != 0 {
		t.Errorf("a scrape without the split: QueuedScrapes %d, want 0", got)
	}
}

// TestNotifyRoom: a lease's end, a fall of the peers' in-flight count and a changed scrape
// signal the room channel; a lease's begin, a rise of the peers' count and a scrape that
// repeats the last do not.
func TestNotifyRoom(t *testing.T) {
	b, _ := New("http://127.0.0.1:1", 0, 1)
	c := make(chan struct{}, 1)
	b.NotifyRoom(c)
	signalled := func() bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	var l Lease
	l.Begin(b, 10, 10, true)
	if signalled() {
		t.Error("Begin signalled room")
	}
	l.Release()
	if !signalled() {
		t.Error("Release did not signal room")
	}
	b.SetPeerLoad(3, 0)
	if signalled() {
		t.Error("a rise of the peers' count signalled room")
	}
	b.SetPeerLoad(2, 0)
	if !signalled() {
		t.Error("a fall of the peers' count did not signal room")
	}
	b.SetScrapedRequests(4, 1, 0)
	if !signalled() {
		t.Error("a changed scrape did not signal room")
	}
	b.SetScrapedRequests(4, 1, 0)
	if signalled() {
		t.Error("a repeated scrape signalled room")
	}
	b.NotifyRoom(nil)
	l.Begin(b, 1, 1, false)
	l.Release()
	if signalled() {
		t.Error("signalled after NotifyRoom(nil)")
	}
}
