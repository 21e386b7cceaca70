package app

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

func TestHealthChanged(t *testing.T) {
	base := configs.Health{Path: "/health", Interval: configs.Duration(time.Second), HealthyThreshold: 2}
	mod := func(f func(h *configs.Health)) configs.Health { h := base; f(&h); return h }
	cases := []struct {
		name string
		nc   configs.Health
		want []string
	}{
		{"unchanged", base, nil},
		{"one field", mod(func(h *configs.Health) { h.Interval = configs.Duration(2 * time.Second) }), []string{"health.interval"}},
		{"several, in order", mod(func(h *configs.Health) {
			h.ModelsPath, h.Disabled, h.ConsecutiveFailures = "/m", true, -1
		}), []string{"health.disabled", "health.consecutive_failures", "health.models_path"}},
	}
	for _, c := range cases {
		if got := healthChanged(base, c.nc); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A reload that changes health.* warns once, naming the fields, and still applies the
// backends; one that leaves health alone warns nothing of it.
func TestHealthReloadNeedsRestart(t *testing.T) {
	a, _ := testutil.StatusBackend(t, http.StatusOK, "a")
	b, _ := testutil.StatusBackend(t, http.StatusOK, "b")
	f := newReloadFile(t)
	f.write(reloadConf(a.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 10 * time.Millisecond})
	warnings := func() []testutil.LogEntry {
		return logs.WithMessage("config reload: health changes need a restart; the running health settings stay")
	}
	f.write(reloadConf(a.URL, b.URL))
	testutil.Eventually(t, testutil.Timeout, "a backend added", func() bool { return len(h.s.Backends()) == 2 })
	if n := len(warnings()); n != 0 {
		t.Fatalf("health unchanged: %d warnings", n)
	}
	conf := strings.Replace(reloadConf(a.URL), "  disabled: true\n", "  disabled: true\n  interval: 7s\n  models_path: /m\n", 1)
	f.write(conf)
	testutil.Eventually(t, testutil.Timeout, "a backend removed", func() bool { return len(h.s.Backends()) == 1 })
	w := warnings()
	if len(w) != 1 {
		t.Fatalf("%d warnings, want 1", len(w))
	}
	if got := fmt.Sprint(w[0].Fields["fields"]); got != "[health.interval health.models_path]" {
		t.Errorf("the warning names %v, want health.interval and health.models_path", got)
	}
}
