package proxy

// Fault injection: backends that die before their first byte, or under load.

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router/key"
)

// A backend dies after sending 200 and the SSE headers, before its first body byte (vLLM
// flushes stream headers at once, then queues and prefills): no byte reached the client, so
// the request must be retried on the other backend, as a connect error would be. The proxy
// does so: it sends the client nothing before the first body byte (fasthttp writes headers
// with the first chunk), so every request succeeds.
func TestFaultBackendDiesAfterHeadersBeforeFirstByte(t *testing.T) {
	ok := &fltLLM{events: 3}
	good := fltNewBackend(t, ok)
	dying := fltNewBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond) // the point: a prefill's time before the backend dies
		c, _, _ := w.(http.Hijacker).Hijack()
		_ = c.Close()
	}))
	s, url := startProxy(t, "round-robin", []string{dying.URL(), good.URL()}, nil)
	c := fltClient()
	var ta fltTally
	for i := 0; i < 6; i++ {
		res, _, be, _, detail := fltDo(c, "POST", url+"/v1/chat/completions", fltChatBody(i, 0), true, 20*time.Second)
		ta.add(res, be, detail)
	}
	waitInFlightZero(t, s)
	t.Logf("backend dies after headers, before the first byte: %s; details %q", &ta, ta.detail)
	fltRow(t, "backend sends stream headers then dies before the first byte (2 backends)", &ta, "-", "-")
	if ta.get(fltLost) != 0 {
		t.Errorf("%d requests lost", ta.get(fltLost))
	}
	if ta.get(fltOK) != ta.sent() {
		t.Errorf("%d of %d requests failed although no byte had reached the client (retry before the first byte); %q", ta.sent()-ta.get(fltOK), ta.sent(), ta.detail)
	}
}

// A backend killed under steady load (listener and connections closed, as a crashed process):
// requests that had not started streaming are retried elsewhere and succeed, streams cut
// mid-way end with a visible error, nothing is lost; the backend is ejected, its index
// entries stop counting (epoch bump), and when it comes back on the same port it passes two
// checks and takes traffic again.
func TestFaultBackendKilledUnderLoad(t *testing.T) {
	for _, v := range []struct {
		name         string
		headersFirst bool
	}{{"headers-after-prefill", false}, {"vllm-headers-first", true}} {
		t.Run(v.name, func(t *testing.T) { fltKillUnderLoad(t, v.headersFirst) })
	}
}

func fltKillUnderLoad(t *testing.T, headersFirst bool) {
	const clients = 6
	var llms [3]*fltLLM
	var bes [3]*fltBackend
	var urls []string
	for i := range bes {
		llms[i] = &fltLLM{prefill: 30 * time.Millisecond, events: 10, gap: 10 * time.Millisecond, headersFirst: headersFirst}
		bes[i] = fltNewBackend(t, llms[i])
		urls = append(urls, bes[i].URL())
	}
	s, url := startProxy(t, "prefix", urls, fltChecks)
	fltWaitAllHealthy(t, s)
	load := fltStartLoad(url, clients, 5000)
	defer load.end()

	// Warm up until every backend served something and holds index entries.
	eventually(t, 15*time.Second, "warm-up: every backend served 3 requests and holds index entries", func() bool {
		for _, u := range urls {
			if load.okOn(u) < 3 || fltIndexEntries(s, fltBackendByURL(t, s, u)) <= 0 {
				return false
			}
		}
		return true
	})
	vi := 0
	for i, u := range urls {
		if fltIndexEntries(s, fltBackendByURL(t, s, u)) > fltIndexEntries(s, fltBackendByURL(t, s, urls[vi])) {
			vi = i
		}
	}
	victim := fltBackendByURL(t, s, urls[vi])
	oldConv := load.convOn(urls[vi])
	if oldConv < 0 {
		t.Fatal("no conversation on the victim")
	}
	oldBody := fltChatBody(oldConv, 0)
	epoch, entries, matched := victim.Epoch(), fltIndexEntries(s, victim), fltMatch(s, oldBody, victim)
	if matched == 0 {
		t.Fatalf("conversation %d served by the victim is not in the index", oldConv)
	}
	before := load.ta.sent()

	// Kill while requests are in flight on the victim, at least one still in prefill (no
	// byte yet) and at least one streaming (its prompt tokens no longer pending).
	var k key.Key
	s.keys.Build([]byte("/v1/chat/completions"), fltChatBody(0, 2), &k)
	perReq := int64(k.PromptTokens) + 8 // the longest turn, with margin
	var inflight, prefill int64
	waitStart := time.Now()
	// The window is often milliseconds wide, so poll fast.
	if !testutil.Poll(10*time.Second, 200*time.Microsecond, func() bool {
		inflight, prefill = victim.InFlight(), victim.PrefillTokens()
		return inflight >= 2 && prefill > 0 && prefill <= (inflight-1)*perReq
	}) {
		t.Fatalf("within 10 s the victim never had a request in prefill and one streaming at once (last: %d in flight, %d prefill tokens)", inflight, prefill)
	}
	t.Logf("kill window reached after %v", time.Since(waitStart).Round(time.Millisecond))
	bes[vi].kill()
	ejectIn, ok := fltWaitHealthy(victim, false, 10*time.Second)
	if !ok {
		t.Fatalf("killed backend still healthy after %v", ejectIn)
	}
	st := s.Health().State(victim)
	how := "active checks"
	if st.Ejections > 0 {
		how = "passive ejection"
	}
	// Stay down until active checks call it unhealthy and any passive ejection (300 ms) has
	// ended: its return is then up to the active checks. (A passive ejection that ends first
	// lets it be tried again, and ejected again: correct, and not what is measured here.)
	eventually(t, 10*time.Second, "active checks call the dead backend unhealthy and its ejection ends", func() bool {
		st := s.Health().State(victim)
		return !st.ActiveHealthy && st.EjectedUntil.IsZero()
	})
	// Attempts dispatched to it before that have failed over. From here on it must get no
	// request while 20 more go to the others.
	eventually(t, 10*time.Second, "the attempts on the dead backend end", func() bool { return victim.InFlight() == 0 })
	servedDown, sentDown := victim.Served(), load.ta.sent()
	eventually(t, 10*time.Second, "20 requests while the backend is down", func() bool { return load.ta.sent() >= sentDown+20 })
	if d := victim.Served() - servedDown; d != 0 {
		t.Errorf("the dead backend got %d requests while unhealthy", d)
	}

	restartedAt := time.Now()
	bes[vi].restart(t)
	recoverIn, ok := fltWaitHealthy(victim, true, 10*time.Second)
	if !ok {
		t.Fatalf("restarted backend not healthy after %v: %+v", recoverIn, s.Health().State(victim))
	}
	if victim.Epoch() <= epoch {
		t.Errorf("epoch %d after the return, was %d: the index still trusts the old cache", victim.Epoch(), epoch)
	}
	// The old conversation's own chunks are gone. Its first chunk alone (4 tokens: a role and
	// a word that other conversations open with too, key.HeadChunks) may be new traffic's,
	// learned on the returned backend since it turned healthy (CI saw a match of 1).
	if m := fltMatch(s, oldBody, victim); m > 1 {
		t.Errorf("after the return the index credits the restarted backend with %d chunks of an old conversation", m)
	}
	staleEntries := fltIndexEntries(s, victim)
	okBefore := load.okOn(urls[vi])
	eventually(t, 15*time.Second, "the returned backend serves a request", func() bool { return load.okOn(urls[vi]) > okBefore })
	trafficIn := time.Since(restartedAt)
	load.end()
	waitInFlightZero(t, s)

	t.Logf("victim %s: index entries %d before the kill (old conversation matched %d chunks), %d (stale, ignored) at the return, %d after new traffic; epoch %d -> %d",
		victim.Name, entries, matched, staleEntries, fltIndexEntries(s, victim), epoch, victim.Epoch())
	t.Logf("at the kill: %d in flight on the victim (%d prefill tokens pending)", inflight, prefill)
	t.Logf("%s; %d sent before the kill; retries %d; per backend %v; details %q", &load.ta, before, s.m.retries.Get(), load.ta.byBE, load.ta.detail)
	fault := "backend killed under load, " + map[bool]string{false: "headers after prefill", true: "headers first (vLLM)"}[headersFirst]
	fltRow(t, fault, &load.ta, fmt.Sprintf("%v (%s)", ejectIn.Round(time.Millisecond), how),
		fmt.Sprintf("healthy %v after restart, first success on it %v", recoverIn.Round(time.Millisecond), trafficIn.Round(time.Millisecond)))

	if n := load.ta.get(fltLost); n != 0 {
		t.Errorf("%d requests lost", n)
	}
	// The proxy itself never failed: every request got a response. Only streams cut mid-way
	// (at most one per client at the kill) may fail, and they fail visibly.
	if n := load.ta.get(fltErrConn); n != 0 {
		t.Errorf("%d requests got no HTTP response at all (bare connection close): requests that had no byte yet must be retried or answered 502", n)
	}
	if n := load.ta.get(fltErrStatus); n != 0 {
		t.Errorf("%d requests got an error status: requests not yet streaming must be retried on another backend", n)
	}
	if n := load.ta.get(fltErrStream); n > clients {
		t.Errorf("%d streams cut, more than the %d that can be mid-stream on the victim at once", n, clients)
	}
}

// fltSilent accepts connections and never answers (a wedged server: the kernel completes the
