package backend

import "testing"

// TestNextLimit: the learned limit, rule by rule.
func TestNextLimit(t *testing.T) {
	for _, tc := range []struct {
		name                                  string
		limit, running, waiting, queued, want int64
	}{
		{"nothing learned, no queue", 0, 40, 0, 0, 0},
		{"a queue seen once: maybe one engine step's", 0, 12, 3, 1, 0},
		{"a queue seen once keeps the limit", 20, 12, 3, 1, 20},
		{"a persistent queue: what runs is the limit", 0, 12, 3, 2, 12},
		{"a persistent queue lowers the limit", 30, 12, 3, MaxQueuedScrapes, 12},
		{"a persistent queue raises the limit", 8, 12, 3, 2, 12},
		{"a persistent queue behind nothing running", 5, 0, 3, 2, 1},
		{"at the limit with none waiting: grows by a sixteenth", 32, 32, 0, 0, 34},
		{"a sixteenth, rounded up", 12, 12, 0, 0, 13},
		{"above the limit with none waiting: grows", 12, 14, 0, 0, 13},
		{"a small limit grows by at least 1", 2, 2, 0, 0, 3},
		{"below the limit: kept", 12, 7, 0, 0, 12},
		{"at half the limit: kept", 12, 6, 0, 0, 12},
		{"under half the limit: forgotten", 12, 5, 0, 0, 0},
		{"idle: forgotten", 12, 0, 0, 0, 0},
	} {
		if got := nextLimit(tc.limit, tc.running, tc.waiting, tc.queued); got != tc.want {
			t.Errorf("%s: nextLimit(%d, running %d, waiting %d, queued %d) = %d, want %d",
				tc.name, tc.limit, tc.running, tc.waiting, tc.queued, got, tc.want)
		}
	}
}

// TestLearnedLimitThroughScrapes: the limit a replica's scrapes teach, scrape by scrape, as a
// flow-controlled proxy sees them: learned from a queue that persists, kept while the replica
// runs what it is held to (the queue gone because prefixlb holds the rest), grown while it
// runs all of it, learned anew when the queue comes back, and forgotten when the load falls.
func TestLearnedLimitThroughScrapes(t *testing.T) {
	b, err := New("http://127.0.0.1:1", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, sc := range []struct{ running, waiting, want int64 }{
		{16, 2, 0},  // a queue once: no limit
		{16, 0, 0},  // gone
		{16, 3, 0},  // back, once
		{12, 5, 12}, // twice in a row: 12 run at once
		{12, 0, 13}, // held at 12, none waiting: room, grow
		{13, 0, 14}, // ran all 13: grow
		{13, 2, 14}, // a queue once at 14 (13 run, 2 wait): kept
		{12, 3, 12}, // persists: 12 is the limit
		{10, 0, 12}, // runs under it: kept
		{6, 0, 12},  // half of it: kept
		{5, 0, 0},   // the load fell under half: forgotten
		{30, 0, 0},  // no limit while nothing queues
	} {
		b.SetScrapedRequests(sc.running, sc.waiting, 0)
		if got := b.HealthReport().LearnedLimit; got != sc.want {
			t.Errorf("scrape %d (running %d, waiting %d): learned limit %d, want %d", i+1, sc.running, sc.waiting, got, sc.want)
		}
	}
}

// TestLearnedLimitSurvivesFailedScrape: a scrape that fails (the health checker then stores
// SetScrapedLoad(0, 0): nothing known) says nothing of the replica's limit, so the limit
// learned before it is kept. Forgotten, every replica of a saturated pool whose metrics
// endpoint timed out once (as it does under the load that made the queue) would look
// unlimited, and flow control would release every held request into its engine queue.
func TestLearnedLimitSurvivesFailedScrape(t *testing.T) {
	b, err := New("http://127.0.0.1:1", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	b.SetScrapedRequests(12, 4, 0)
	b.SetScrapedRequests(12, 5, 0)
	if got := b.HealthReport().LearnedLimit; got != 12 {
		t.Fatalf("after a persistent queue: learned limit %d, want 12", got)
	}
	b.SetScrapedLoad(0, 0) // health/scrape.go on a failed scrape
	r := b.HealthReport()
	if r.LearnedLimit != 12 {
		t.Errorf("after a failed scrape: learned limit %d, want 12 kept", r.LearnedLimit)
	}
	if r.QueuedScrapes != 0 {
		t.Errorf("after a failed scrape: QueuedScrapes %d, want 0 (a failure breaks the row)", r.QueuedScrapes)
	}
	// The next successful scrape judges the limit as before: the load fell under half.
	b.SetScrapedRequests(5, 0, 0)
	if got := b.HealthReport().LearnedLimit; got != 0 {
		t.Errorf("after a scrape under half the limit: learned limit %d, want 0", got)
	}
}
