package oracle

import (
	"net/http"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// pendingOn is how many requests the oracle counts as on their way to the replica at url.
func pendingOn(o *Oracle, url string, now time.Time) int {
	tg := o.byName[url]
	tg.mu.Lock()
	defer tg.mu.Unlock()
	tg.trim(now)
	return len(tg.pending)
}

// TestOracleTwoRoutersPendingAccounting: with --router-replicas N --modes oracle several
// routers route to the same replicas. A request routed by oracle A and not yet arrived must
// still count as pending on its replica after a request A did not route (another router's,
// here sent straight to the replica) arrives there; when A's own request arrives it is no
// longer pending.
func TestOracleTwoRoutersPendingAccounting(t *testing.T) {
	c := prepared(t, 1, nil)
	a := New(c)
	now := time.Now()
	a.clock = func() time.Time { return now }
	bs := backendsOf(t, c)
	own := chatBody(t, words("a", 20000), 4)
	dec := a.Pick(keyOf(own), bs) // A routed it; it is on its way
	url := dec.Backend.Name
	if st := testutil.PostJSON(t, c.URLs()[0]+"/v1/chat/completions", chatBody(t, words("b", 50), 4)); st != http.StatusOK {
		t.Fatalf("status %d", st)
	}
	if n := pendingOn(a, url, now); n != 1 {
		t.Fatalf("oracle A's own request (routed, not arrived) after another router's request arrived: %d pending, want 1", n)
	}
	if st := testutil.PostJSON(t, url+"/v1/chat/completions", own); st != http.StatusOK {
		t.Fatalf("status %d", st)
	}
	if n := pendingOn(a, url, now); n != 0 {
		t.Fatalf("after A's own request arrived: %d pending, want 0", n)
	}
}

// TestOracleSharedByRoutersMatchesArrivals: one oracle shared by two routers (as bench
// compare runs --router-replicas N --modes oracle) routes two different requests to one
// replica; when the second routed arrives first, the first is the one still pending (arrivals
// are matched by fingerprint, not taken in routing order).
func TestOracleSharedByRoutersMatchesArrivals(t *testing.T) {
	c := prepared(t, 1, nil)
	o := New(c)
	now := time.Now()
	o.clock = func() time.Time { return now }
	bs := backendsOf(t, c)
	first, second := chatBody(t, words("f", 3000), 4), chatBody(t, words("s", 2000), 4)
	o.Pick(keyOf(first), bs)
	url := o.Pick(keyOf(second), bs).Backend.Name
	if st := testutil.PostJSON(t, url+"/v1/chat/completions", second); st != http.StatusOK {
		t.Fatalf("status %d", st)
	}
	tg := o.byName[url]
	if n := pendingOn(o, url, now); n != 1 {
		t.Fatalf("%d pending, want 1", n)
	}
	tg.mu.Lock()
	left := tg.pending[0].p.Fingerprint()
	tg.mu.Unlock()
	tokens, seed, mt, err := c.Replicas()[0].ParsePrompt([]byte(first), true)
	if err != nil {
		t.Fatal(err)
	}
	if want := sim.Fingerprint(tokens, seed, mt); left != want {
		t.Errorf("the pending request left is not the first routed (fingerprint %x, want %x)", left, want)
	}
}
