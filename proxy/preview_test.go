package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/router"
)

// TestDebugRouteRecordsNothing: /debug/route's decision (Server.Explain) is a preview in every
// mode: in round-robin with the prefix shadow, with one preview before each request, 8
// requests still alternate between 2 backends, and neither previews of routed requests nor
// of passthrough ones move the shadow's decision counters or a turn.
func TestDebugRouteRecordsNothing(t *testing.T) {
	a, hitsA := testutil.StatusBackend(t, 200, `{"choices":[]}`)
	b, hitsB := testutil.StatusBackend(t, 200, `{"choices":[]}`)
	var sh *router.Shadow
	s, url := startProxy(t, "round-robin", []string{a.URL, b.URL}, func(o *Options) {
		var err error
		if sh, err = router.NewShadow(router.ShadowPrefix, "round-robin", o.Policy, router.PolicyOptions{}); err != nil {
			t.Fatal(err)
		}
		o.Policy = sh
	})
	body := func(i int) string {
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"conversation %d: %s"}]}`, i, strings.Repeat("a long enough prompt ", 20))
	}
	for i := range 8 {
		s.Explain("/v1/chat/completions", []byte(body(i)))
		s.Explain("/v1/models", nil)
		if st := testutil.PostJSON(t, url+"/v1/chat/completions", body(i)); st != 200 {
			t.Fatalf("request %d: status %d", i, st)
		}
	}
	if hitsA.Load() != 4 || hitsB.Load() != 4 {
		t.Errorf("8 requests with a preview before each: %d and %d per backend, want 4 and 4", hitsA.Load(), hitsB.Load())
	}
	decisions := func() string {
		var out []string
		for _, l := range strings.Split(adminMetrics(t, s), "\n") {
			if strings.HasPrefix(l, "prefixlb_shadow_decisions_total") {
				out = append(out, l)
			}
		}
		return strings.Join(out, " ")
	}
	before := decisions()
	for range 30 {
		s.Explain("/v1/chat/completions", []byte(body(0)))
	}
	if after := decisions(); after != before || !strings.Contains(before, "decisions_total") {
		t.Errorf("30 previews moved the shadow's decisions from %q to %q", before, after)
	}
}
