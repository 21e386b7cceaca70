package app

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
)

// TestStartTunedEditsTheValidatedOptions: StartTuned and StartPeeredTuned apply the tuning
// after validation, so a scrape interval under the config's 100 ms minimum (the bench's
// model time) reaches the running health checker; the peering tuning sees the node's options
// built from the config, and a policy set by the tuning routes.
func TestStartTunedEditsTheValidatedOptions(t *testing.T) {
	be, _ := testutil.StatusBackend(t, 200, `{"choices":[]}`)
	stop := func(sv *proxy.Serving) {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		defer cancel()
		if err := sv.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	pol := &pinned{want: be.URL}
	cfg := &configs.Config{Listen: "127.0.0.1:0", Mode: "prefix", Backends: []configs.Backend{{URL: be.URL}}}
	sv, err := StartTuned(context.Background(), cfg, nil, Tuning{Proxy: func(o *proxy.Options) {
		o.Health.ScrapeInterval, o.Health.ScrapeStaleAfter = 40*time.Millisecond, 80*time.Millisecond
		o.Mode, o.Policy = "pinned", pol
	}})
	if err != nil {
		t.Fatal(err)
	}
	if h := sv.Health().Options(); h.ScrapeInterval != 40*time.Millisecond || h.ScrapeStaleAfter != 80*time.Millisecond {
		t.Errorf("scrape every %s, stale after %s; want 40ms, 80ms", h.ScrapeInterval, h.ScrapeStaleAfter)
	}
	if sv.Policy() != router.Policy(pol) {
		t.Errorf("policy %T, want the tuning's", sv.Policy())
	}
	stop(sv)

	var seen peering.Options
	pcfg := peeredConfig(t, be.URL)
	sv, node, err := StartPeeredTuned(context.Background(), pcfg, zap.NewNop(), Tuning{
		Proxy:   func(o *proxy.Options) { o.Health.ScrapeInterval = 30 * time.Millisecond },
		Peering: func(o *peering.Options) { o.FlushInterval = 3 * time.Millisecond; seen = *o },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if h := sv.Health().Options(); h.ScrapeInterval != 30*time.Millisecond {
		t.Errorf("peered: scrape every %s, want 30ms", h.ScrapeInterval)
	}
	if seen.Listen != "127.0.0.1:0" || len(seen.Secret) != 32 || seen.FlushInterval != 3*time.Millisecond {
		t.Errorf("the peering tuning saw %+v", seen)
	}
	stop(sv)
}
