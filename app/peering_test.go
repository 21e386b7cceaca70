package app

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// peeredConfig is a prefix-mode config with one backend (checks off) and peering on
// 127.0.0.1 with the secret in an environment variable.
func peeredConfig(t *testing.T, backendURL string, join ...string) *configs.Config {
	t.Setenv("PREFIXLB_TEST_PEER_SECRET", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=") // base64 of 32 bytes
	cfg := &configs.Config{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Mode: "prefix",
		Backends: []configs.Backend{{URL: backendURL}},
		Health:   configs.Health{Disabled: true},
		Peering:  &configs.Peering{Listen: "127.0.0.1:0", Join: join, SecretEnv: "PREFIXLB_TEST_PEER_SECRET"}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := testutil.Client().Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPeeringReadyzWaitsForSnapshot: with a configured peer that takes the connection and
// never answers, /readyz says 503 and why, then ready once the join gives up (bounded);
// /metrics shows the peering gauges.
func TestPeeringReadyzWaitsForSnapshot(t *testing.T) {
	be, _ := testutil.StatusBackend(t, http.StatusOK, "{}")
	stalled := testutil.ServeRaw(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	h := startRun(t, peeredConfig(t, be.URL, stalled.Addr().String()), nil, RunOptions{})
	status, body := get(t, h.admin+"/readyz")
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "peer's index snapshot") {
		t.Fatalf("/readyz while joining: %d %q", status, body)
	}
	testutil.Eventually(t, 20*time.Second, "ready once the join gives up", func() bool {
		s, _ := get(t, h.admin+"/readyz")
		return s == http.StatusOK
	})
	_, m := get(t, h.admin+"/metrics")
	if !strings.Contains(m, "prefixlb_peers_alive 0") || !strings.Contains(m, "prefixlb_peer_bytes_sent_total") {
		t.Fatal("/metrics lacks the peering metrics")
	}
}

// TestPeeringConfigErrors: the section's mistakes are named.
func TestPeeringConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(c *configs.Config)
		want string
	}{
		{"no secret", func(c *configs.Config) { c.Peering.SecretEnv = "" }, "exactly one of secret_file and secret_env"},
		{"two secrets", func(c *configs.Config) { c.Peering.SecretFile = "/x" }, "exactly one of secret_file and secret_env"},
		{"data port", func(c *configs.Config) { c.Listen, c.Peering.Listen = "127.0.0.1:8080", ":8080" }, "peers need a port of their own"},
		{"mode", func(c *configs.Config) { c.Mode = "round-robin" }, "needs mode prefix"},
		{"join", func(c *configs.Config) { c.Peering.Join = []string{"nohostport"} }, "peering.join[0]"},
		{"join port name", func(c *configs.Config) { c.Peering.Join = []string{"10.0.0.1:7946", "10.0.0.2:abc"} }, `peering.join[1]: "10.0.0.2:abc": the port "abc" is not a number`},
		{"join port 0", func(c *configs.Config) { c.Peering.Join = []string{"10.0.0.1:0"} }, "peering.join[0]: \"10.0.0.1:0\": port 0 cannot be dialled"},
		{"advertise port 0", func(c *configs.Config) { c.Peering.Advertise = "127.0.0.1:0" }, "peering.advertise: \"127.0.0.1:0\": port 0 cannot be dialled"},
		{"advertise no host", func(c *configs.Config) { c.Peering.Advertise = ":7946" }, "peering.advertise: \":7946\" names no host peers can reach"},
		{"advertise 0.0.0.0", func(c *configs.Config) { c.Peering.Advertise = "0.0.0.0:7946" }, "names no host peers can reach"},
		{"advertise ::", func(c *configs.Config) { c.Peering.Advertise = "[::]:7946" }, "names no host peers can reach"},
		{"listen port out of range", func(c *configs.Config) { c.Peering.Listen = "127.0.0.1:70000" }, "peering.listen: \"127.0.0.1:70000\": the port \"70000\" is not a number in 1..65535"},
		{"negative settle wait", func(c *configs.Config) { d := configs.Duration(-time.Millisecond); c.Peering.SettleWait = &d }, "peering.settle_wait: -1ms; want 0 (off) or 2ms to 100ms"},
		{"short settle wait", func(c *configs.Config) { d := configs.Duration(time.Microsecond); c.Peering.SettleWait = &d }, "peering.settle_wait: 1µs"},
		{"settle wait of one flush", func(c *configs.Config) { d := configs.Duration(time.Millisecond); c.Peering.SettleWait = &d }, "peering.settle_wait: 1ms; want 0 (off) or 2ms to 100ms"},
		{"long settle wait", func(c *configs.Config) { d := configs.Duration(time.Second); c.Peering.SettleWait = &d }, "peering.settle_wait: 1s; want 0 (off) or 2ms to 100ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := peeredConfig(t, "http://127.0.0.1:1")
			tc.edit(c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// peeredConf is reloadConf in mode prefix with a peering section (extra: more of its YAML).
func peeredConf(extra string, urls ...string) string {
	s := strings.Replace(reloadConf(urls...), "mode: round-robin", "mode: prefix", 1)
	if extra != "-" {
		s += "peering:\n  listen: 127.0.0.1:0\n  secret_env: PREFIXLB_TEST_PEER_SECRET\n" + extra
	}
	return s
}

// TestPeeringReloadNeedsRestart: a reload that changes the peering section (a field, or
// the section removed) logs one warning naming the field and keeps the running peering, while
// the backends it changes are applied; a reload that leaves peering alone logs nothing of it.
func TestPeeringReloadNeedsRestart(t *testing.T) {
	t.Setenv("PREFIXLB_TEST_PEER_SECRET", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	a, _ := testutil.StatusBackend(t, http.StatusOK, "a")
	b, _ := testutil.StatusBackend(t, http.StatusOK, "b")
	c, _ := testutil.StatusBackend(t, http.StatusOK, "c")
	f := newReloadFile(t)
	f.write(peeredConf("", a.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testutil.RecordingLogger()
	h := startRun(t, cfg, log, RunOptions{Load: f.load, Path: f.path, PollInterval: 10 * time.Millisecond})
	warnings := func() int {
		return logs.Count(func(e testutil.LogEntry) bool {
			return strings.Contains(e.Message, "peering changes need a restart") && e.Fields["field"] == "peering"
		})
	}
	for _, step := range []struct {
		what, conf string
		backends   int
		warnings   int
	}{
		{"peering unchanged, a backend added", peeredConf("", a.URL, b.URL), 2, 0},
		{"peering.join changed", peeredConf("  join: [\"127.0.0.1:1\"]\n", a.URL, b.URL, c.URL), 3, 1},
		{"peering removed", peeredConf("-", a.URL), 1, 2},
	} {
		f.write(step.conf)
		testutil.Eventually(t, testutil.Timeout, step.what+": backends applied", func() bool {
			return len(h.s.Backends()) == step.backends
		})
		if got := warnings(); got != step.warnings {
			t.Fatalf("%s: %d warnings that peering needs a restart, want %d", step.what, got, step.warnings)
		}
	}
	if _, m := get(t, h.admin+"/metrics"); !strings.Contains(m, "prefixlb_peers_alive") {
		t.Error("the running peering is gone after a reload that removed the section")
	}
}
