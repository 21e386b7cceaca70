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

func TestDiscoveryChanged(t *testing.T) {
	base := configs.DNSDiscovery{Name: "vllm.ns.svc", Port: 8000, Scheme: "http", Interval: configs.Duration(10 * time.Second)}
	mod := func(f func(d *configs.DNSDiscovery)) *configs.DNSDiscovery { d := base; f(&d); return &d }
	cases := []struct {
		name    string
		old, nc *configs.DNSDiscovery
		want    []string
	}{
		{"both off", nil, nil, nil},
		{"unchanged", &base, mod(func(*configs.DNSDiscovery) {}), nil},
		{"turned on", nil, &base, []string{"discovery.dns"}},
		{"turned off", &base, nil, []string{"discovery.dns"}},
		{"one field", &base, mod(func(d *configs.DNSDiscovery) { d.Port = 9000 }), []string{"discovery.dns.port"}},
		{"several, in order", &base, mod(func(d *configs.DNSDiscovery) {
			d.KVCacheTokens, d.Name, d.SRV = 1, "other", true
		}), []string{"discovery.dns.name", "discovery.dns.srv", "discovery.dns.kv_cache_tokens"}},
	}
	for _, c := range cases {
		if got := discoveryChanged(configs.Discovery{DNS: c.old}, configs.Discovery{DNS: c.nc}); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A reload that changes discovery.* warns once, naming the fields, keeps the running
// discovery (its backends stay) and still applies the static backends; one that leaves
// discovery alone warns nothing of it.
func TestDiscoveryReloadNeedsRestart(t *testing.T) {
	const msg = "config reload: discovery changes need a restart; the running discovery settings stay"
	a, _ := testutil.StatusBackend(t, http.StatusOK, "a")
	b, _ := testutil.StatusBackend(t, http.StatusOK, "b")
	const dns = "discovery:\n  dns:\n    name: vllm.test.svc\n    port: 1\n    interval: 100ms\n"
	withDNS := func(dns string, urls ...string) string {
		return strings.Replace(reloadConf(urls...), "backends:\n", dns+"backends:\n", 1)
	}
	f := newReloadFile(t)
	f.write(withDNS(dns, a.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 10 * time.Millisecond, Resolver: &failingResolver{}})
	testutil.Eventually(t, testutil.Timeout, "the discovered backend added", func() bool { return len(h.s.Backends()) == 2 })

	for _, c := range []struct {
		name     string
		conf     string
		backends int // static and discovered
		want     string
	}{
		{"discovery unchanged", withDNS(dns, a.URL, b.URL), 3, ""},
		{"two fields", withDNS(strings.Replace(strings.Replace(dns, "port: 1", "port: 2", 1), "100ms", "1s", 1), a.URL), 2,
			"[discovery.dns.port discovery.dns.interval]"},
		{"section removed", reloadConf(a.URL, b.URL), 3, "[discovery.dns]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(logs.WithMessage(msg))
			f.write(c.conf)
			testutil.Eventually(t, testutil.Timeout, "the static backends applied", func() bool { return len(h.s.Backends()) == c.backends })
			w := logs.WithMessage(msg)[before:]
			if c.want == "" {
				if len(w) != 0 {
					t.Fatalf("%d warnings, want none", len(w))
				}
				return
			}
			if len(w) != 1 {
				t.Fatalf("%d warnings, want 1", len(w))
			}
			if got := fmt.Sprint(w[0].Fields["fields"]); got != c.want {
				t.Errorf("the warning names %v, want %v", got, c.want)
			}
		})
	}
	var discovered bool
	for _, be := range h.s.Backends() {
		discovered = discovered || strings.Contains(be.Name, "127.0.0.1:1")
	}
	if !discovered {
		t.Error("the running discovery's backend is gone")
	}
}

// A reload that changes a setting only a restart applies (outside backends, health,
// discovery and peering, which have warnings of their own) warns once; limits.* and log.*
// among them.
func TestReloadRestartSettingsWarn(t *testing.T) {
	const msg = "config reload: only backends change at runtime; restart to apply listeners, mode, shadow, timeouts, prefix, limits, log and response headers"
	a, _ := testutil.StatusBackend(t, http.StatusOK, "a")
	b, _ := testutil.StatusBackend(t, http.StatusOK, "b")
	with := func(section string, urls ...string) string {
		return strings.Replace(reloadConf(urls...), "backends:\n", section+"backends:\n", 1)
	}
	f := newReloadFile(t)
	f.write(reloadConf(a.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 10 * time.Millisecond})
	for i, c := range []struct {
		name string
		conf string
		warn bool
	}{
		{"backends only", reloadConf(a.URL, b.URL), false},
		{"limits", with("limits:\n  max_buffered_body_bytes: 536870912\n", a.URL), true},
		{"log level", with("log:\n  level: debug\n", a.URL, b.URL), true},
		{"log format", with("log:\n  format: console\n", a.URL), true},
		{"timeouts", with("timeouts:\n  idle: 7s\n", a.URL, b.URL), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(logs.WithMessage(msg))
			f.write(c.conf)
			want := 2 - i%2 // the backends alternate between two and one
			testutil.Eventually(t, testutil.Timeout, "the backends applied", func() bool { return len(h.s.Backends()) == want })
			if n := len(logs.WithMessage(msg)) - before; n != map[bool]int{false: 0, true: 1}[c.warn] {
				t.Errorf("%d warnings, want %v", n, c.warn)
			}
		})
	}
}
