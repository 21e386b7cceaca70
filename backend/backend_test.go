package backend

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNew(t *testing.T) {
	cases := []struct {
		url, addr, errPart string
	}{
		{"http://vllm-0.vllm:8000", "vllm-0.vllm:8000", ""},
		{"http://vllm-0.vllm:8000/", "vllm-0.vllm:8000", ""},
		{"https://api.example", "api.example:443", ""},
		{"http://10.0.0.1", "10.0.0.1:80", ""},
		{"http://[fd00::1]:8000", "[fd00::1]:8000", ""},
		{"vllm-0:8000", "", "missing scheme"},
		{"ftp://x", "", "unsupported scheme"},
		{"http://", "", "missing host"},
		{"", "", "empty"},
		{"http://127.0.0.1:8001/v1", "", "path or query"},
		{"http://127.0.0.1:8001?x=1", "", "path or query"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			b, err := New(c.url, 0, 0)
			if c.errPart != "" {
				if err == nil || !strings.Contains(err.Error(), c.errPart) {
					t.Fatalf("New(%q) error %v, want %q", c.url, err, c.errPart)
				}
				return
			}
			if err != nil || b.Addr != c.addr || b.Weight() != 1 || b.ID == 0 {
				t.Fatalf("New(%q) = %+v, %v; want addr %s", c.url, b, err, c.addr)
			}
		})
	}
	a, _ := New("http://x:1/", 0, 1)
	b, _ := New("http://x:1", 0, 1)
	if a.ID != b.ID {
		t.Error("a trailing slash changed the backend's identity")
	}
}

// Every path through a lease returns the counters to zero exactly once.
func TestLeaseAccounting(t *testing.T) {
	cases := []struct {
		name  string
		steps func(l *Lease)
	}{
		{"finish", func(l *Lease) { l.FirstByte(); l.Release() }},
		{"fail before first byte", func(l *Lease) { l.Release() }},
		{"double release", func(l *Lease) { l.Release(); l.Release() }},
		{"first byte twice", func(l *Lease) { l.FirstByte(); l.FirstByte(); l.Release() }},
		{"first byte after release", func(l *Lease) { l.Release(); l.FirstByte() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, _ := New("http://x:1", 0, 1)
			var l Lease
			l.Begin(b, 100, 0, false)
			if b.InFlight() != 1 || b.PrefillTokens() != 100 || b.Served() != 1 {
				t.Fatalf("after Begin: in-flight %d prefill %d", b.InFlight(), b.PrefillTokens())
			}
			c.steps(&l)
			if b.InFlight() != 0 || b.PrefillTokens() != 0 {
				t.Errorf("in-flight %d, prefill %d; want 0, 0", b.InFlight(), b.PrefillTokens())
			}
		})
	}
	// Concurrent release and first byte (EOF, error and cancel racing).
	b, _ := New("http://x:1", 0, 1)
	for i := 0; i < 200; i++ {
		var l Lease
		l.Begin(b, 7, 0, false)
		var wg sync.WaitGroup
		for j := 0; j < 3; j++ {
			wg.Add(2)
			go func() { defer wg.Done(); l.FirstByte() }()
			go func() { defer wg.Done(); l.Release() }()
		}
		wg.Wait()
	}
	if b.InFlight() != 0 || b.PrefillTokens() != 0 {
		t.Errorf("after racing releases: in-flight %d, prefill %d", b.InFlight(), b.PrefillTokens())
	}
}

func TestLoadTakesTheLargerSignal(t *testing.T) {
	b, _ := New("http://x:1", 0, 1)
	var l Lease
	l.Begin(b, 0, 0, false)
	defer l.Release()
	if b.Load() != 1 {
		t.Errorf("Load %d, want the in-flight count 1", b.Load())
	}
	b.SetScrapedLoad(9, 0)
	if b.Load() != 9 {
		t.Errorf("Load %d, want the scraped 9", b.Load())
	}
	b.SetScrapedLoad(-3, 0)
	if b.Load() != 1 {
		t.Errorf("Load %d after a failed scrape, want 1", b.Load())
	}
}

// Busy counts this proxy's and its peers' in-flight requests and what the scrape reported
// beyond them around the fetch: requests answered since the scrape, or during its fetch, are
// not another sender's.
func TestBusyCountsOnlyOtherSendersFromTheScrape(t *testing.T) {
	for _, c := range []struct {
		name                       string
		before, during, after      int   // own in flight before the fetch, added during it, answered after the store
		peers, scraped, wantExcess int64 // peers' in flight; the replica's report; ScrapedExcess
		wantBusy, wantLoad         int64 // after the answers
	}{
		{"alone, answered since", 3, 0, 3, 0, 3, 0, 0, 3},
		{"another sender's 2", 3, 0, 3, 0, 5, 2, 2, 5},
		{"a peer's 2, answered since", 3, 0, 0, 2, 5, 0, 3, 5},
		{"3 answered during the fetch, still listed", 3, -3, 0, 0, 3, 0, 0, 3},
		{"2 sent during the fetch, not yet listed", 1, 2, 0, 0, 1, 0, 3, 3},
		{"failed scrape", 2, 0, 0, 0, -1, 0, 2, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, _ := New("http://x:1", 0, 1)
			ls := make([]Lease, c.before+max(c.during, 0))
			for i := range c.before {
				ls[i].Begin(b, 0, 0, false)
			}
			b.SetPeerLoad(c.peers, 0)
			before := b.Counted()
			for i := c.before; i < len(ls); i++ {
				ls[i].Begin(b, 0, 0, false)
			}
			for i := range -c.during {
				ls[i].Release()
			}
			b.SetScrapedLoad(c.scraped, before)
			if got := b.ScrapedExcess(); got != c.wantExcess {
				t.Errorf("excess %d, want %d", got, c.wantExcess)
			}
			for i := max(-c.during, 0); i < max(-c.during, 0)+c.after; i++ {
				ls[i].Release()
			}
			b.SetPeerLoad(0, 0)
			if b.Busy() != c.wantBusy || b.Load() != c.wantLoad {
				t.Errorf("Busy %d, Load %d; want %d and %d", b.Busy(), b.Load(), c.wantBusy, c.wantLoad)
			}
			for i := range ls {
				ls[i].Release()
			}
		})
	}
}

func TestHealthyPanicMode(t *testing.T) {
	mk := func(n int) []*Backend {
		bs := make([]*Backend, n)
		for i := range bs {
			bs[i], _ = New("http://x:"+string(rune('1'+i)), 0, 1)
		}
		return bs
	}
	cases := []struct {
		n, down   int
		want      int
		wantPanic bool
	}{
		{4, 0, 4, false}, {4, 1, 3, false}, {4, 2, 2, false}, {4, 3, 4, true}, {4, 4, 4, true}, {1, 1, 1, true}, {0, 0, 0, false},
	}
	for _, c := range cases {
		bs := mk(c.n)
		for i := 0; i < c.down; i++ {
			bs[i].SetHealthy(false)
		}
		got, p := Healthy(nil, bs)
		if len(got) != c.want || p != c.wantPanic {
			t.Errorf("%d of %d down: %d candidates, panic %v; want %d, %v", c.down, c.n, len(got), p, c.want, c.wantPanic)
		}
	}
}

// TestQueuedPrefillDrains: the queued prefill work falls at the replica's prefill rate from
// when its queue last moved, to 0 at most, and a finished prefill restarts the clock on what
// is left.
func TestQueuedPrefillDrains(t *testing.T) {
	b, _ := New("http://q:1", 0, 1)
	var big, small Lease
	big.Begin(b, 100_000, 0, true)
	t0 := time.Now()
	small.Begin(b, 5_000, 0, true)
	if small.ahead < 95_000 || small.ahead > 100_000 {
		t.Fatalf("the second request's queue ahead %d, want ≈ 100000 (the first's work, barely started)", small.ahead)
	}
	cases := []struct {
		after time.Duration
		lo    int64
		hi    int64
	}{
		{0, 100_000, 105_000},
		{time.Second, 93_000, 95_000}, // DefaultPrefillRate: 10k tokens a second
		{5 * time.Second, 53_000, 55_000},
		{20 * time.Second, 0, 0},
	}
	for _, tc := range cases {
		if q := b.QueuedPrefill(t0.Add(tc.after)); q < tc.lo || q > tc.hi {
			t.Errorf("queued %v later: %d, want %d..%d (raw %d)", tc.after, q, tc.lo, tc.hi, b.PrefillTokens())
		}
	}
	big.FirstByte()
	t1 := time.Now()
	if q := b.QueuedPrefill(t1); q < 4_900 || q > 5_000 {
		t.Errorf("after the first's prefill finished: %d queued, want ≈ 5000 (the second's, from now)", q)
	}
	small.Release()
	big.Release()
	if q := b.QueuedPrefill(t1.Add(-time.Hour)); q != 0 {
		t.Errorf("nothing pending: %d queued, want 0", q)
	}
}

// TestQueuedPrefillCountsPeers: the peers' reported prefill work joins this proxy's in one
// queue that the replica works off at one rate: it drains from the report that started it, a
// report repeating the sum changes nothing, a request begun behind it counts it ahead, both
// together drain at the replica's rate (not twice it, as two queues drained apart did), and
// a sum that falls takes the answered work off the credit.
func TestQueuedPrefillCountsPeers(t *testing.T) {
	b, _ := New("http://q:1", 0, 1)
	b.SetPeerLoad(2, 50_000)
	t0 := time.Now()
	cases := []struct {
		after  time.Duration
		lo, hi int64
	}{
		{0, 49_000, 50_000},
		{2 * time.Second, 29_000, 30_000}, // DefaultPrefillRate: 10k tokens a second
		{6 * time.Second, 0, 0},
	}
	for _, tc := range cases {
		if q := b.QueuedPrefill(t0.Add(tc.after)); q < tc.lo || q > tc.hi {
			t.Errorf("%v after the report: %d, want %d..%d", tc.after, q, tc.lo, tc.hi)
		}
	}
	b.SetPeerLoad(3, 50_000) // a keepalive: the same work
	if q := b.QueuedPrefill(t0.Add(2 * time.Second)); q < 29_000 || q > 30_000 {
		t.Errorf("after a report repeating the work: %d 2 s on, want 29000..30000 (the drain goes on)", q)
	}
	var own Lease
	own.Begin(b, 50_000, 0, true)
	if own.ahead < 49_000 || own.ahead > 50_000 {
		t.Errorf("own request begun behind the peers' 50000: %d ahead, want ≈ 50000", own.ahead)
	}
	if q := b.QueuedPrefill(t0.Add(5 * time.Second)); q < 49_000 || q > 50_000 {
		t.Errorf("own 50000 behind the peers' 50000, 5 s on: %d queued, want ≈ 50000 (one queue at one rate)", q)
	}
	b.SetPeerLoad(0, 0) // the peers' requests answered
	if q := b.QueuedPrefill(time.Now()); q < 49_000 || q > 50_000 {
		t.Errorf("after the peers' requests answered: %d queued, want ≈ 50000 (own, barely started)", q)
	}
	own.Release()
	if b.PeerPrefillTokens() != 0 || b.QueuedPrefill(time.Now()) != 0 {
		t.Errorf("nothing queued: peers %d, queued %d", b.PeerPrefillTokens(), b.QueuedPrefill(time.Now()))
	}
	b.SetPeerLoad(1, 60_000)
	if q := b.QueuedPrefill(time.Now()); q < 59_000 || b.PeerPrefillTokens() != 60_000 {
		t.Errorf("right after a new report of 60000: %d queued, raw %d", q, b.PeerPrefillTokens())
	}
}

// TestQueuedPrefillKeepsCredit: a request that answers takes what it needed off the credit,
// and the rest of what was worked off stays: a big prompt 9 s into its prefill does not jump
// back to its full size when a small request answers first (chunked prefill does that), as
// it would if the drain restarted on the whole queue at every first byte. One that leaves
// unanswered takes none of the credit.
func TestQueuedPrefillKeepsCredit(t *testing.T) {
	b, _ := New("http://q:1", 0, 1)
	var big, small, gone Lease
	big.Begin(b, 100_000, 0, true)
	small.Begin(b, 5_000, 0, true)
	gone.Begin(b, 5_000, 0, true)
	now := time.Now()
	b.drain.mu.Lock()
	b.drain.since = monoNanos(now.Add(-9 * time.Second)) // the queue started 9 s ago
	b.drain.mu.Unlock()
	before := b.QueuedPrefill(now) // 110k less 90k at 10k tokens/s
	if before < 19_000 || before > 20_000 {
		t.Fatalf("9 s in: %d queued, want ≈ 20000", before)
	}
	small.FirstByte()
	if after := b.QueuedPrefill(time.Now()); after > before || after < before-1_000 {
		t.Errorf("after a small request answered: %d queued, want ≈ %d (its 5000 were part of the 90000 done)", after, before)
	}
	gone.Release() // cancelled before answering: its 5000 leave, the credit stays
	if after := b.QueuedPrefill(time.Now()); after > before-4_000 {
		t.Errorf("after a request left unanswered: %d queued, want ≈ %d", after, before-5_000)
	}
	big.FirstByte()
	if q := b.QueuedPrefill(time.Now()); q != 0 {
		t.Errorf("all answered: %d queued, want 0", q)
	}
}

// TestQueuedPrefillBanksNoIdleTime: a replica whose queue the drain has worked through while
// its request has not answered (it prefills slower than the learned rate, as long prompts of
// the Mooncake trace do) still counts a request begun now in full; the excess of the drain
// over what was queued is not credited against new work, or a burst's requests would go to
// such a replica one after another, each seeing the others' work swallowed by that excess.
func TestQueuedPrefillBanksNoIdleTime(t *testing.T) {
	b, _ := New("http://q:1", 0, 1)
	var big, next, third Lease
	big.Begin(b, 100_000, 0, true)
	now := time.Now()
	b.drain.mu.Lock()
	b.drain.since = monoNanos(now.Add(-20 * time.Second)) // 200k worked off at 10k tokens/s
	b.drain.mu.Unlock()
	if q := b.QueuedPrefill(now); q != 0 {
		t.Fatalf("20 s into a 10 s prefill: %d queued, want 0 (drained as far as the model knows)", q)
	}
	next.Begin(b, 30_000, 0, true)
	if q := b.QueuedPrefill(time.Now()); q < 29_000 || q > 30_000 {
		t.Errorf("a request begun on a drained queue: %d queued, want ≈ 30000 (its own work)", q)
	}
	third.Begin(b, 5_000, 0, true)
	if third.ahead < 29_000 || third.ahead > 30_000 {
		t.Errorf("the next request's queue ahead: %d, want ≈ 30000", third.ahead)
	}
	big.FirstByte() // the slow prefill answers at last: its 100k leave with the credit they had
	if q := b.QueuedPrefill(time.Now()); q < 34_000 || q > 35_000 {
		t.Errorf("after the slow prefill answered: %d queued, want ≈ 35000", q)
	}
	next.Release()
	third.Release()
	big.Release()
}

// TestPeerWorkOnDrainedQueue: a peer's report of new work on a queue the drain has worked
// through while this proxy's request has not answered counts in full, as a request begun
// here does (TestQueuedPrefillBanksNoIdleTime).
func TestPeerWorkOnDrainedQueue(t *testing.T) {
	b, _ := New("http://q:1", 0, 1)
	var big Lease
	big.Begin(b, 100_000, 0, true)
	defer big.Release()
	b.drain.mu.Lock()
	b.drain.since = monoNanos(time.Now().Add(-20 * time.Second)) // 200k worked off at 10k tokens/s
	b.drain.mu.Unlock()
	b.SetPeerLoad(1, 20_000)
	if q := b.QueuedPrefill(time.Now()); q < 19_000 || q > 20_000 {
		t.Fatalf("a peer's 20000 behind a drained queue: %d queued, want ≈ 20000", q)
	}
}

// TestFleetPrefill: a backend's observations teach the fleet's model too, and a backend that
// has not learned its own rate drains its queue at the fleet's once that has learned, not at
// DefaultPrefillRate; its own model, once learned, takes over.
func TestFleetPrefill(t *testing.T) {
	var fleet PrefillModel
	a, _ := New("http://a:1", 0, 1)
	b, _ := New("http://b:1", 0, 1)
	a.SetFleetPrefill(&fleet)
	b.SetFleetPrefill(&fleet)
	for range MinPrefillSamples {
		a.ObservePrefill(100_000, 520*time.Millisecond) // 100k tokens in 0.5 s after the 20 ms base
	}
	r, ok := fleet.Rate()
	if !ok || r < 190_000 || r > 210_000 {
		t.Fatalf("fleet rate %.0f (%v), want ≈ 200000 tokens/s", r, ok)
	}
	if _, ok := b.Prefill().Rate(); ok {
		t.Fatal("b learned from a's observations")
	}
	if q := queuedInto(b, 100_000, 250*time.Millisecond); q < 45_000 || q > 55_000 {
		t.Fatalf("b 250 ms into 100k tokens: %d queued, want ≈ 50000 at the fleet's 200k tokens/s (97500 at the default)", q)
	}
	for range MinPrefillSamples {
		b.ObservePrefill(100_000, 1020*time.Millisecond) // b itself runs at 100k tokens/s
	}
	if q := queuedInto(b, 100_000, 250*time.Millisecond); q < 70_000 || q > 80_000 {
		t.Fatalf("b learned: %d queued 250 ms in, want ≈ 75000 at its own 100k tokens/s", q)
	}
}

// queuedInto begins a request of work tokens on idle b, makes its queue d old and returns
// what QueuedPrefill says is left then; the request is released.
func queuedInto(b *Backend, work int64, d time.Duration) int64 {
	var l Lease
	l.Begin(b, work, 0, true)
	defer l.Release()
	now := time.Now()
	b.drain.mu.Lock()
	b.drain.since = monoNanos(now.Add(-d))
	b.drain.mu.Unlock()
	return b.QueuedPrefill(now)
}

// TestPrefillSamplesKept: with sharing on, a streamed request's first byte keeps its
// observation for TakePrefillSamples, once; a refused or unstreamed one, or one with sharing
// off, keeps none.
func TestPrefillSamplesKept(t *testing.T) {
	b, _ := New("http://q:1", 0, 1)
	var l Lease
	l.Begin(b, 1000, 0, true)
	l.FirstByte()
	l.Release()
	if got := b.TakePrefillSamples(nil); len(got) != 0 {
		t.Fatalf("sharing off: %d samples kept", len(got))
	}
	b.SharePrefillSamples(true)
	for _, c := range []struct {
		streamed, refused bool
	}{{true, false}, {false, false}, {true, true}} {
		var l Lease
		l.Begin(b, 1000, 0, c.streamed)
		if c.refused {
			l.Refused()
		}
		l.FirstByte()
		l.Release()
	}
	got := b.TakePrefillSamples(nil)
	if len(got) != 1 || got[0].Work != 1000 || got[0].TTFT <= 0 {
		t.Fatalf("kept %+v, want the one streamed, answered request's (work 1000)", got)
	}
	// A request behind another: its sample's work counts the queue ahead of it.
	var first, second Lease
	first.Begin(b, 50_000, 0, true)
	second.Begin(b, 1000, 0, true)
	second.FirstByte()
	first.FirstByte()
	second.Release()
	first.Release()
	got = b.TakePrefillSamples(nil)
	if len(got) != 2 || got[0].Work < 50_000 || got[0].Work > 51_000 || got[1].Work != 50_000 {
		t.Fatalf("kept %+v, want the second's work with the first's 50000 ahead, then the first's", got)
	}
	if again := b.TakePrefillSamples(nil); len(again) != 0 {
		t.Fatalf("taken twice: %+v", again)
	}
	for range maxPendingSamples + 10 {
		var l Lease
		l.Begin(b, 1, 0, true)
		l.FirstByte()
		l.Release()
	}
	if n := len(b.TakePrefillSamples(nil)); n != maxPendingSamples {
		t.Fatalf("%d samples kept untaken, want the bound %d", n, maxPendingSamples)
	}
}

// TestPeerSumHidesAnswer: a peers' sum that grows although some of its work answered (an
// answer and a new request in one report) does not leave that work credited: what was worked
// off is held to what is queued, so this proxy's next request still counts in full.
func TestPeerSumHidesAnswer(t *testing.T) {
	b, _ := New("http://q:1", 0, 1)
	for range MinPrefillSamples {
		b.Prefill().Observe(200_000, time.Second+DefaultPrefillBase) // 200k tokens/s
	}
	if r, ok := b.Prefill().Rate(); !ok || r < 190_000 || r > 210_000 {
		t.Fatalf("learned rate %v %v, want 200k tokens/s", r, ok)
	}
	b.SetPeerLoad(1, 50_000)
	time.Sleep(500 * time.Millisecond) // 100k tokens' worth of work: the 50k are done
	b.SetPeerLoad(1, 60_000)           // they answered, and 60k arrived in the same report
	var own Lease
	own.Begin(b, 20_000, 0, true)
	defer own.Release()
	// Credited at most the 60k queued when the report came: the own 20k is still ahead
	// (less what a few ms of work at 200k tokens/s took).
	if q := b.QueuedPrefill(time.Now()); q < 10_000 {
		t.Fatalf("queued %d after own 20000 behind the peers' 60000, want ≥ 10000 (the 50k answered stayed credited)", q)
	}
}
