package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/key"
)

// settlingPolicy is a router.Settler as a peered prefix policy is one, scripted: its n-th
// Pick takes picks[n] (a backend name), it asks every first decision to wait, and the n-th
// Release says again = contended[n] (false past the end). It records the calls, and at each
// Release how many requests its backend had received.
type settlingPolicy struct {
	picks     []string
	contended []bool
	wait      time.Duration
	received  map[string]*atomic.Int64 // backend name → requests its server got
	// beforeRelease, when set, runs at the n-th Release (from 0) before it answers, outside
	// the policy's lock: what a peer did during the hold.
	beforeRelease func(n int)

	mu       sync.Mutex
	nPick    int
	nCont    int
	events   []string // "pick B", "learn B", "hold B", "unlearn B", "abandon B", "release B after D, N sent: again V"
	learnAt  map[router.Learned]time.Time
	nextStmp router.Learned
}

func (p *settlingPolicy) Pick(_ *key.Key, cands []*backend.Backend) router.Decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	name := p.picks[min(p.nPick, len(p.picks)-1)]
	p.nPick++
	p.events = append(p.events, "pick "+name)
	for _, b := range cands {
		if b.Name == name {
			return router.Decision{Backend: b, Reason: router.ReasonCold, PrefillWork: 1000}
		}
	}
	return router.Decision{Backend: cands[0], Reason: router.ReasonCold}
}

// Preview is the decision the next Pick would make, recorded nowhere.
func (p *settlingPolicy) Preview(_ *key.Key, cands []*backend.Backend) router.Decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	name := p.picks[min(p.nPick, len(p.picks)-1)]
	for _, b := range cands {
		if b.Name == name {
			return router.Decision{Backend: b, Reason: router.ReasonCold, PrefillWork: 1000}
		}
	}
	return router.Decision{Backend: cands[0], Reason: router.ReasonCold}
}

func (p *settlingPolicy) Learn(_ *key.Key, b *backend.Backend, _ int) router.Learned {
	return p.stamp("learn " + b.Name)
}

// Hold records "hold B" for the decision Pick made on B, and "hold B, not the decision
// picked" for any other (the settler ranks a decision by its reason, peering.classOf).
func (p *settlingPolicy) Hold(_ *key.Key, d router.Decision) router.Learned {
	if d.Reason != router.ReasonCold || d.PrefillWork != 1000 {
		return p.stamp("hold " + d.Backend.Name + ", not the decision picked")
	}
	return p.stamp("hold " + d.Backend.Name)
}

// stamp records event and returns a new Learned, remembering when it was made.
func (p *settlingPolicy) stamp(event string) router.Learned {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextStmp++
	p.learnAt[p.nextStmp] = time.Now()
	p.events = append(p.events, event)
	return p.nextStmp
}

func (p *settlingPolicy) Unlearn(_ *key.Key, b *backend.Backend, _ router.Learned) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, "unlearn "+b.Name)
}

func (p *settlingPolicy) Abandon(_ *key.Key, b *backend.Backend, _ router.Learned) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, "abandon "+b.Name)
}

func (p *settlingPolicy) SettleWait(_ *key.Key, d router.Decision) time.Duration {
	return p.wait
}

func (p *settlingPolicy) Release(_ *key.Key, d router.Decision, l router.Learned, _ time.Time) bool {
	if p.beforeRelease != nil {
		p.mu.Lock()
		n := p.nCont
		p.mu.Unlock()
		p.beforeRelease(n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b := d.Backend
	c := p.nCont < len(p.contended) && p.contended[p.nCont]
	p.nCont++
	held := time.Since(p.learnAt[l])
	if held >= p.wait {
		held = p.wait // held at least the wait: the event names the wait, not the noise
	}
	sent := int64(0)
	if r := p.received[b.Name]; r != nil {
		sent = r.Load()
	}
	p.events = append(p.events, fmt.Sprintf("release %s after %s, %d sent: again %v", b.Name, held, sent, c))
	return c
}

// Correct: the scripted policy keeps no index to correct.
func (p *settlingPolicy) Correct(*key.Key, *backend.Backend, router.Learned, router.CacheReport) int {
	return 0
}

var _ router.Settler = (*settlingPolicy)(nil)

func (p *settlingPolicy) log() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.events...)
}

// TestSettle: a request the policy holds (router.Settler) is held (Hold) before any byte of
// it reaches a backend, for the wait, and Released; when Release says again it is decided
// again with nothing sent (no retry spent, and no Unlearn: Release withdrew the Hold); the
// third decision goes at once, learned once written.
func TestSettle(t *testing.T) {
	const wait = 20 * time.Millisecond
	names := []string{"A", "B", "C"}
	cases := []struct {
		name      string
		contended []bool
		refuse    string // a backend that answers 503
		want      []string
		servedBy  string
		route     string // the x-prefixlb-route the client gets
	}{
		{"kept", []bool{false}, "", []string{
			"pick A", "hold A", "release A after 20ms, 0 sent: again false",
		}, "A", "cold;chunks=0;settled=1"},
		{"kept, refused, retried unheld", []bool{false}, "A", []string{
			"pick A", "hold A", "release A after 20ms, 0 sent: again false", "unlearn A",
			"pick B", "learn B", // a retry is not held
		}, "B", "cold;chunks=0;settled=1"},
		{"decided again once", []bool{true, false}, "", []string{
			"pick A", "hold A", "release A after 20ms, 0 sent: again true",
			"pick B", "hold B", "release B after 20ms, 0 sent: again false",
		}, "B", "cold;chunks=0;settled=2"},
		{"third decision sent at once", []bool{true, true, true}, "", []string{
			"pick A", "hold A", "release A after 20ms, 0 sent: again true",
			"pick B", "hold B", "release B after 20ms, 0 sent: again true",
			"pick C", "learn C", // once written, as without settling
		}, "C", "cold;chunks=0;settled=2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			received := map[string]*atomic.Int64{}
			urls := map[string]string{}
			byURL := map[string]string{}
			for _, n := range names {
				c := &atomic.Int64{}
				received[n] = c
				refuse := n == tc.refuse
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					c.Add(1)
					if refuse {
						w.WriteHeader(http.StatusServiceUnavailable)
						return
					}
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprint(w, `{"ok":true}`)
				}))
				t.Cleanup(ts.Close)
				urls[n], byURL[ts.URL] = ts.URL, n
			}
			// The policy names backends as the proxy does (their URL); the script says A, B, C.
			pol := &settlingPolicy{contended: tc.contended, wait: wait, learnAt: map[router.Learned]time.Time{},
				received: map[string]*atomic.Int64{}}
			for _, n := range []string{"A", "B", "C"} {
				pol.picks = append(pol.picks, urls[n])
				pol.received[urls[n]] = received[n]
			}
			s, url := startProxy(t, "prefix", []string{urls["A"], urls["B"], urls["C"]}, func(o *Options) { o.Policy = pol })
			body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a long prompt ", 200) + `"}]}`
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := byURL[resp.Header.Get(HeaderBackend)]; got != tc.servedBy {
				t.Errorf("served by %q, want %s", got, tc.servedBy)
			}
			if got := resp.Header.Get(HeaderRoute); got != tc.route {
				t.Errorf("%s %q, want %q", HeaderRoute, got, tc.route)
			}
			waitInFlightZero(t, s)
			var got []string
			for _, e := range pol.log() {
				for n, u := range urls {
					e = strings.ReplaceAll(e, u, n)
				}
				got = append(got, e)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			for _, n := range names {
				want := int64(0)
				if n == tc.servedBy || n == tc.refuse {
					want = 1
				}
				if c := received[n].Load(); c != want {
					t.Errorf("%s received %d requests, want %d: a held request that was decided again is never sent", n, c, want)
				}
			}
			wantRetries := uint64(0)
			if tc.refuse != "" {
				wantRetries = 1
			}
			if r := s.m.retries.Get(); r != wantRetries {
				t.Errorf("%d retries counted, want %d; deciding again is no retry", r, wantRetries)
			}
		})
	}
}

// TestSettleClientLeaves: a client that leaves while its request is held is not decided
// again nor sent: the Hold is withdrawn (Abandon, not Unlearn, which would tell peers to
// forget chunks never sent) without a Release, and nothing reaches a backend.
func TestSettleClientLeaves(t *testing.T) {
	var got atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer ts.Close()
	// A hold long enough for the watchdog (watchInterval) to see the client leave.
	pol := &settlingPolicy{picks: []string{ts.URL}, contended: []bool{true}, wait: 5 * watchInterval,
		learnAt: map[router.Learned]time.Time{}, received: map[string]*atomic.Int64{ts.URL: &got}}
	s, url := startProxy(t, "prefix", []string{ts.URL}, func(o *Options) { o.Policy = pol })
	ctx, cancel := context.WithTimeout(context.Background(), watchInterval/2)
	defer cancel()
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a long prompt ", 200) + `"}]}`
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the client was answered %d while its request was held", resp.StatusCode)
	}
	waitInFlightZero(t, s)
	var events []string
	for _, e := range pol.log() {
		events = append(events, strings.ReplaceAll(e, ts.URL, "A"))
	}
	if want := "pick A\nhold A\nabandon A"; strings.Join(events, "\n") != want {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(events, "\n"), want)
	}
	if n := got.Load(); n != 0 {
		t.Errorf("the backend received %d requests of a client that left during the hold", n)
	}
}
