package proxy

// Fault injection: passive ejection by status, and clients that leave do not eject.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// fltStatusBackend answers every path, /health included, with the status next returns.
type fltStatusBackend struct {
	hits atomic.Int64
	next func(n int64) int
}

func (b *fltStatusBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	st := b.next(b.hits.Add(1))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st)
	fmt.Fprintf(w, `{"error":{"message":"status %d","code":%d}}`, st, st)
}

// Passive ejection by status: 5 consecutive 500s eject (the 500s reach the client as they
// are, not retried); 4xx never ejects and resets the count; 429 never ejects and is retried.
func TestFaultErrorStatusEjection(t *testing.T) {
	okBody := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	send := func(c *http.Client, url string, n int, ta *fltTally) {
		for i := 0; i < n; i++ {
			res, _, be, _, detail := fltDo(c, "POST", url+"/v1/chat/completions", okBody, false, 20*time.Second)
			ta.add(res, be, detail)
		}
	}
	okHandler := &fltStatusBackend{next: func(int64) int { return 200 }}

	t.Run("500-ejects-after-5", func(t *testing.T) {
		var broken atomic.Bool
		broken.Store(true)
		e500 := fltNewBackend(t, &fltStatusBackend{next: func(int64) int {
			if broken.Load() {
				return 500
			}
			return 200
		}})
		ok1, ok2 := fltNewBackend(t, okHandler), fltNewBackend(t, okHandler)
		s, url := startProxy(t, "round-robin", []string{e500.URL(), ok1.URL(), ok2.URL()}, func(o *Options) {
			o.Health.BaseEjection = time.Second
			o.Health.MaxEjection = 2 * time.Second
		})
		bad := fltBackendByURL(t, s, e500.URL())
		c := fltClient()
		var ta fltTally
		start := time.Now()
		var ejectIn time.Duration
		for i := 0; i < 30 && bad.Healthy(); i++ {
			send(c, url, 1, &ta)
		}
		ejectIn = time.Since(start)
		hitsAtEject := e500.h.(*fltStatusBackend).hits.Load()
		if bad.Healthy() {
			t.Fatalf("backend answering 500 not ejected after %d requests: %+v", ta.sent(), s.Health().State(bad))
		}
		if hitsAtEject != 5 {
			t.Errorf("ejected after %d 500s, want 5", hitsAtEject)
		}
		if ta.get(fltErrStatus) != hitsAtEject {
			t.Errorf("clients saw %d error statuses, want the %d 500s passed through", ta.get(fltErrStatus), hitsAtEject)
		}
		// While ejected the others serve everything: requests are sent only while the
		// ejection has comfortably long to run, so a slow machine sends fewer of them but
		// never one that the returning backend may rightly take.
		const ejectedMargin = 250 * time.Millisecond
		until := s.Health().State(bad).EjectedUntil
		var after fltTally
		for i := 0; i < 20 && time.Until(until) > ejectedMargin; i++ {
			send(c, url, 1, &after)
		}
		if after.sent() == 0 {
			t.Fatalf("the ejection (until %v) ended before a request could be sent", until)
		}
		if after.get(fltOK) != after.sent() || e500.h.(*fltStatusBackend).hits.Load() != hitsAtEject {
			t.Errorf("while ejected: %s, ejected backend hits %d (was %d)", &after, e500.h.(*fltStatusBackend).hits.Load(), hitsAtEject)
		}
		// Repaired: it returns when the ejection (1 s) ends, at the next housekeeping tick.
		broken.Store(false)
		recoverIn, ok := fltWaitHealthy(bad, true, 10*time.Second)
		if !ok {
			t.Fatalf("repaired backend still ejected after %v", recoverIn)
		}
		send(c, url, 9, &after)
		if got := e500.h.(*fltStatusBackend).hits.Load() - hitsAtEject; got == 0 || after.get(fltOK) != after.sent() {
			t.Errorf("after the return: %s, returned backend got %d", &after, got)
		}
		waitInFlightZero(t, s)
		all := fltTally{}
		for i := range all.n {
			all.n[i].Store(ta.n[i].Load() + after.n[i].Load())
		}
		fltRow(t, "backend answers 500 to everything (3 backends)", &all,
			fmt.Sprintf("%v after 5 consecutive 500s (passive)", ejectIn.Round(time.Millisecond)),
			fmt.Sprintf("%v after repair (1s ejection, 1s housekeeping tick)", recoverIn.Round(time.Millisecond)))
	})

	t.Run("4xx-never-ejects", func(t *testing.T) {
		e400 := fltNewBackend(t, &fltStatusBackend{next: func(int64) int { return 400 }})
		ok1 := fltNewBackend(t, okHandler)
		s, url := startProxy(t, "round-robin", []string{e400.URL(), ok1.URL()}, nil)
		b := fltBackendByURL(t, s, e400.URL())
		c := fltClient()
		var ta fltTally
		send(c, url, 200, &ta)
		waitInFlightZero(t, s)
		hits := e400.h.(*fltStatusBackend).hits.Load()
		fltRow(t, "backend answers 400 to everything (x100)", &ta, "never (correct)", "-")
		if hits != 100 || ta.get(fltErrStatus) != 100 || ta.get(fltOK) != 100 {
			t.Errorf("400 backend hits %d; %s: want 100 400s passed through and 100 OK", hits, &ta)
		}
		if !b.Healthy() || s.Health().State(b).PassiveFailures != 0 {
			t.Errorf("4xx counted against the backend: %+v", s.Health().State(b))
		}
	})

	t.Run("429-never-ejects", func(t *testing.T) {
		busy := fltNewBackend(t, &fltStatusBackend{next: func(int64) int { return 429 }})
		ok1 := fltNewBackend(t, okHandler)
		s, url := startProxy(t, "round-robin", []string{busy.URL(), ok1.URL()}, nil)
		b := fltBackendByURL(t, s, busy.URL())
		c := fltClient()
		var ta fltTally
		send(c, url, 200, &ta)
		waitInFlightZero(t, s)
		hits := busy.h.(*fltStatusBackend).hits.Load()
		fltRow(t, "backend answers 429 to everything (x100)", &ta, "never (correct)", "-")
		if ta.get(fltOK) != 200 {
			t.Errorf("%s: every 429 should have been retried on the other backend; %q", &ta, ta.detail)
		}
		// Round-robin's counter also advances on the retry's pick, so with two backends the
		// busy one is tried first every time (not asserted: fairness, not correctness).
		t.Logf("429 backend got %d of 200 first attempts; retries %d", hits, s.m.retries.Get())
		if hits < 100 || uint64(hits) != s.m.retries.Get() {
			t.Errorf("429 backend hits %d, retries %d, want one retry per 429 and at least 100", hits, s.m.retries.Get())
		}
		if !b.Healthy() {
			t.Errorf("429 ejected the backend: %+v", s.Health().State(b))
		}
	})

	// Four 500s, then a 400 (the server answered sanely): the count restarts, no ejection.
	t.Run("4xx-resets-the-count", func(t *testing.T) {
		flaky := fltNewBackend(t, &fltStatusBackend{next: func(n int64) int {
			if n%5 == 0 {
				return 400
			}
			return 500
		}})
		ok1 := fltNewBackend(t, okHandler)
		s, url := startProxy(t, "round-robin", []string{flaky.URL(), ok1.URL()}, nil)
		b := fltBackendByURL(t, s, flaky.URL())
		c := fltClient()
		var ta fltTally
		send(c, url, 100, &ta)
		waitInFlightZero(t, s)
		if !b.Healthy() || flaky.h.(*fltStatusBackend).hits.Load() != 50 {
			t.Errorf("four 500s and a 400, repeated, ejected the backend (hits %d): %+v", flaky.h.(*fltStatusBackend).hits.Load(), s.Health().State(b))
		}
	})
}

// fltEcho answers with the status the request asks for (X-Want-Status, default 200) and
// Clients that leave mid-stream (a user pressing stop) say nothing about the backend: however
// many do so at once, no backend is ejected, and the disconnects are counted as client
// disconnects, not stream errors. The proxy usually notices such a client by a failed write
// to it, before the watchdog's next peek.
func TestFaultClientCancelsDoNotEjectBackend(t *testing.T) {
	llm := &fltLLM{events: 2000, gap: 5 * time.Millisecond, headersFirst: true}
	var urls []string
	for i := 0; i < 3; i++ {
		urls = append(urls, fltNewBackend(t, llm).URL())
	}
	s, url := startProxy(t, "round-robin", urls, nil)
	const perBackend = 6
	n := perBackend * len(urls)
	// Open n streams (6 per backend), all past their first event, then close them all.
	c := fltClient()
	var bodies []io.ReadCloser
	var cancels []context.CancelFunc
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", bytes.NewReader(fltChatBody(i, 0)))
		resp, err := c.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		buf := make([]byte, 8)
		if _, err := io.ReadAtLeast(resp.Body, buf, 1); err != nil {
			t.Fatal(err)
		}
		bodies, cancels = append(bodies, resp.Body), append(cancels, cancel)
	}
	for i := range bodies {
		cancels[i]()
		bodies[i].Close()
	}
	waitInFlightZero(t, s)
	for _, be := range s.Backends() {
		st := s.Health().State(be)
		t.Logf("%s: healthy %v, passive failures %d, ejections %d", be.Name, st.Healthy, st.PassiveFailures, st.Ejections)
		if !st.Healthy || st.Ejections != 0 || st.PassiveFailures != 0 {
			t.Errorf("%s: %d client cancellations counted against the backend: healthy %v, passive failures %d, ejections %d",
				be.Name, perBackend, st.Healthy, st.PassiveFailures, st.Ejections)
		}
	}
	t.Logf("client disconnects %d, stream errors %d", s.m.clientGone.Get(), s.m.streamErrors.Get())
	if s.m.streamErrors.Get() != 0 || s.m.clientGone.Get() != uint64(n) {
		t.Errorf("prefixlb_client_disconnects_total %d, prefixlb_stream_errors_total %d; want %d and 0", s.m.clientGone.Get(), s.m.streamErrors.Get(), n)
	}
}
