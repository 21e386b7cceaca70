package health

import (
	"fmt"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// TestSendersJudge walks scrape sequences (the replica's finished count, this proxy's) and
// checks the verdict after each.
func TestSendersJudge(t *testing.T) {
	type scrape struct {
		theirs float64
		has    bool
		ours   uint64
		want   backend.Senders
	}
	alone, shared, unknown := backend.SendersAlone, backend.SendersShared, backend.SendersUnknown
	cases := []struct {
		name    string
		scrapes []scrape
		dialect bool    // the replica reports its running requests (a missing count is 0 so far)
		busy    float64 // its running + waiting requests (this proxy has none in flight)
	}{
		{"fresh replica, only us", []scrape{
			{0, true, 0, alone}, {40, true, 40, alone}, {90, true, 88, alone}, {130, true, 131, alone}}, true, 0},
		{"fresh replica, a second sender half the traffic", []scrape{
			{0, true, 0, alone}, {80, true, 40, shared}, {160, true, 80, shared}}, true, 0},
		{"used before: alone only after settling", []scrape{
			{5000, true, 0, unknown}, {5040, true, 40, unknown}, {5080, true, 80, unknown},
			{5120, true, 120, alone}}, true, 0},
		{"a few requests of slack are not a sender", []scrape{
			{0, true, 0, alone}, {103, true, 100, alone}, {200, true, 200, alone}}, true, 0},
		{"excess beyond slack and share", []scrape{
			{0, true, 0, alone}, {100, true, 100, alone}, {222, true, 200, alone}, {340, true, 300, shared}}, true, 0},
		{"fresh and idle: nobody else uses it", []scrape{
			{0, true, 0, alone}, {0, true, 0, alone}, {0, true, 0, alone}, {1, true, 1, alone}, {3, true, 3, alone}}, true, 0},
		{"used before and idle: no evidence", []scrape{
			{70, true, 0, unknown}, {70, true, 0, unknown}, {70, true, 0, unknown}, {70, true, 0, unknown},
			{71, true, 1, unknown}, {73, true, 3, alone}}, true, 0},
		{"restarted at zero: fresh again", []scrape{
			{500, true, 0, unknown}, {0, true, 0, alone}, {10, true, 10, alone}}, true, 0},
		{"no counter reported", []scrape{
			{0, false, 0, unknown}, {0, false, 10, unknown}}, false, 0},
		{"no counter, known dialect: fresh until ours finish without one", []scrape{
			{0, false, 0, alone}, {0, false, 1, alone}, {0, false, 2, unknown}, {0, false, 40, unknown}}, true, 0},
		{"count created on first use: judged from zero", []scrape{
			{0, false, 5, alone}, {0, false, 5, alone}, {3, true, 8, alone}, {43, true, 48, alone}}, true, 0},
		{"count created on first use by another sender", []scrape{
			{0, false, 0, alone}, {30, true, 2, shared}, {60, true, 4, shared}}, true, 0},
		{"count gone (restart, lazy series): fresh again", []scrape{
			{0, true, 0, alone}, {50, true, 50, alone}, {0, false, 50, alone}, {4, true, 54, alone}}, true, 0},
		{"count blinks out: carried on where it was", []scrape{
			{0, true, 0, alone}, {50, true, 50, alone}, {0, false, 55, alone}, {60, true, 60, alone},
			{100, true, 100, alone}}, true, 0},
		{"count appears after ours finished without it: not fresh", []scrape{
			{0, false, 0, alone}, {0, false, 3, unknown}, {5, true, 5, unknown}}, true, 0},
		{"no count, another sender's requests running there", []scrape{
			{0, false, 0, shared}, {0, false, 0, shared}}, true, 8},
		{"restart keeps a shared verdict for the hold", []scrape{
			{0, true, 0, alone}, {100, true, 50, shared}, {3, true, 52, shared}, {6, true, 55, shared}}, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var j sendersJudge
			now := time.Unix(1000, 0)
			for i, s := range tc.scrapes {
				if got := j.observe(now, senderSample{finished: s.theirs, has: s.has, dialect: tc.dialect, busy: tc.busy, ours: s.ours}); got != s.want {
					t.Fatalf("scrape %d (%v / %d): %v, want %v", i, s.theirs, s.ours, got, s.want)
				}
				now = now.Add(time.Second)
			}
		})
	}
}

// TestSendersHoldAndDecay: a burst from another sender is shared at once; once it stops, its
// excess decays below the threshold within sendersTau scrapes, and the verdict stays shared
// for sendersHold after the last scrape that found an excess.
func TestSendersHoldAndDecay(t *testing.T) {
	var j sendersJudge
	now := time.Unix(1000, 0)
	var theirs float64
	var ours uint64
	step := func(t2, o uint64) backend.Senders {
		theirs += float64(t2)
		ours += o
		now = now.Add(time.Second)
		return j.observe(now, senderSample{finished: theirs, has: true, dialect: true, ours: ours})
	}
	j.observe(now, senderSample{has: true, dialect: true})
	if v := step(60, 30); v != backend.SendersShared {
		t.Fatalf("after a burst from another sender: %v, want shared", v)
	}
	burst := now
	for range 4 * sendersTau {
		v := step(20, 20)
		last := j.sharedAt
		if last.Sub(burst) > sendersTau*time.Second {
			t.Fatalf("an excess still found %v after the burst stopped", last.Sub(burst))
		}
		want := backend.SendersAlone
		if now.Sub(last) < sendersHold {
			want = backend.SendersShared
		}
		if v != want {
			t.Fatalf("%v after the burst (last excess %v before): %v, want %v", now.Sub(burst), now.Sub(last), v, want)
		}
	}
	if v := step(20, 20); v != backend.SendersAlone {
		t.Fatalf("long after the burst: %v, want alone", v)
	}
}

// TestSendersSmallSecondSender: another sender of a quarter of this proxy's rate is found
// within about a minute (a window of plain sums would miss it for good).
func TestSendersSmallSecondSender(t *testing.T) {
	var j sendersJudge
	now := time.Unix(1000, 0)
	j.observe(now, senderSample{has: true, dialect: true})
	var theirs float64
	var ours uint64
	for i := 1; i <= 90; i++ {
		ours++
		theirs++
		if i%4 == 0 {
			theirs++ // the other sender: a request every 4 s
		}
		now = now.Add(time.Second)
		if j.observe(now, senderSample{finished: theirs, has: true, dialect: true, ours: ours}) == backend.SendersShared {
			if i > 75 {
				t.Errorf("found after %d s, want within 75", i)
			}
			return
		}
	}
	t.Fatal("a second sender of a quarter of our rate never found in 90 s")
}

// TestScrapeJudgesSenders: the scrape reads the replica's finished count (vLLM's and SGLang's
// e2e latency histogram counts, summed over label sets) and stores the verdict on the backend,
// logging each change.
func TestScrapeJudgesSenders(t *testing.T) {
	for name, running := range map[string]string{"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"} {
		t.Run(name, func(t *testing.T) {
			srv := newFakeServer(t)
			b := srv.backend(t)
			c, clk, logs := newTestChecker(t, Options{})
			c.SetBackends([]*backend.Backend{b})
			expose := func(finished int) {
				half := finished / 2
				srv.setMetrics(fmt.Sprintf("%[4]s{engine=\"0\"} 0\n%[1]s:e2e_request_latency_seconds_count{engine=\"0\"} %[2]d\n%[1]s:e2e_request_latency_seconds_count{engine=\"1\"} %[3]d\n",
					name, half, finished-half, running))
			}
			serve := func(n int) { finishRequests(b, n) }
			steps := []struct {
				ours, others int
				want         backend.Senders
			}{
				{0, 0, backend.SendersAlone}, // a fresh replica: nobody has used it
				{50, 0, backend.SendersAlone},
				{50, 50, backend.SendersShared},
			}
			finished := 0
			for i, s := range steps {
				serve(s.ours)
				finished += s.ours + s.others
				expose(finished)
				c.scrapeAll(bg)
				if got := b.OtherSenders(); got != s.want {
					t.Fatalf("scrape %d: %v, want %v", i, got, s.want)
				}
				clk.Add(time.Second)
			}
			if n := countLogs(logs, "backend's other senders judged"); n != 2 {
				t.Errorf("%d change lines logged, want 2 (alone, then shared)", n)
			}
			srv.setMetrics("garbage\n")
			c.scrapeAll(bg)
			if got := b.OtherSenders(); got != backend.SendersShared {
				t.Errorf("after one failed scrape: %v, want shared as before", got)
			}
			clk.Add(c.o.ScrapeStaleAfter + time.Second)
			c.scrapeAll(bg)
			if got := b.OtherSenders(); got != backend.SendersUnknown {
				t.Errorf("after failing for longer than scrape_stale_after: %v, want unknown", got)
			}
		})
	}
}

// TestScrapeJudgesLazySeries: a replica whose finished-requests histogram appears only after
// its first request (llm-d-inference-sim, Prometheus client_golang vectors) counts as fresh
// while it reports its running requests and no count, is judged from zero once the count
// appears, and one that never reports a count goes unknown once this proxy has finished
// requests there.
func TestScrapeJudgesLazySeries(t *testing.T) {
	srv := newFakeServer(t)
	b := srv.backend(t)
	c, clk, _ := newTestChecker(t, Options{})
	c.SetBackends([]*backend.Backend{b})
	serve := func(n int) { finishRequests(b, n) }
	steps := []struct {
		metrics string
		ours    int
		want    backend.Senders
	}{
		{"vllm:num_requests_running 0\n", 0, backend.SendersAlone},
		{"vllm:num_requests_running 1\n", 0, backend.SendersAlone},
		{"vllm:num_requests_running 0\nvllm:e2e_request_latency_seconds_count{model_name=\"m\"} 4\n", 4, backend.SendersAlone},
		{"vllm:num_requests_running 0\nvllm:e2e_request_latency_seconds_count{model_name=\"m\"} 60\n", 6, backend.SendersShared},
	}
	for i, s := range steps {
		serve(s.ours)
		srv.setMetrics(s.metrics)
		c.scrapeAll(bg)
		if got := b.OtherSenders(); got != s.want {
			t.Fatalf("scrape %d: %v, want %v", i, got, s.want)
		}
		clk.Add(time.Second)
	}

	// Never a count: unknown once this proxy has finished sendersMinOurs requests there.
	srv2 := newFakeServer(t)
	b2 := srv2.backend(t)
	c2, clk2, _ := newTestChecker(t, Options{})
	c2.SetBackends([]*backend.Backend{b2})
	srv2.setMetrics("vllm:num_requests_running 0\n")
	c2.scrapeAll(bg)
	if got := b2.OtherSenders(); got != backend.SendersAlone {
		t.Fatalf("fresh, no count: %v, want alone", got)
	}
	finishRequests(b2, sendersMinOurs)
	clk2.Add(time.Second)
	c2.scrapeAll(bg)
	if got := b2.OtherSenders(); got != backend.SendersUnknown {
		t.Fatalf("no count after %d of ours finished: %v, want unknown", sendersMinOurs, got)
	}
	// Still no count, and more requests running and waiting there than this proxy has in flight.
	srv2.setMetrics("vllm:num_requests_running 5\nvllm:num_requests_waiting 2\n")
	clk2.Add(time.Second)
	c2.scrapeAll(bg)
	if got := b2.OtherSenders(); got != backend.SendersShared {
		t.Fatalf("no count, 7 requests there and none of ours: %v, want shared", got)
	}
}

// finishRequests completes n streamed requests through b, as the proxy would (backend.Completed).
func finishRequests(b *backend.Backend, n int) {
	for range n {
		var l backend.Lease
		l.Begin(b, 1, 0, true)
		l.Complete()
		l.Release()
	}
}
