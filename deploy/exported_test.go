package deploy

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/app"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/peering"
	"github.com/prefixlb/prefixlb/proxy"
)

// exported is what prefixlb's /metrics pages offered: per sample name (histograms' _bucket,
// _sum and _count apart), the label names its samples carry.
type exported map[string]map[string]bool

var sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? `)
var labelNameRE = regexp.MustCompile(`(\w+)="`)

// add reads the sample lines of one Prometheus text page.
func (e exported) add(t *testing.T, page string) {
	t.Helper()
	for _, line := range strings.Split(page, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		m := sampleRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("/metrics line not a sample: %q", line)
		}
		if e[m[1]] == nil {
			e[m[1]] = map[string]bool{}
		}
		for _, l := range labelNameRE.FindAllStringSubmatch(m[2], -1) {
			e[m[1]][l[1]] = true
		}
	}
}

// fakeReplica is a model server as prefixlb sees one: /health, /v1/models serving model m,
// and streamed chat completions whose usage reports cached tokens (vLLM with
// --enable-prompt-tokens-details).
func fakeReplica(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
			_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":640}}}\n\n")
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// exportedMetrics starts what exports every family prefixlb has: two replicas in mode prefix
// peered over 127.0.0.1 and one in mode round-robin with the prefix shadow, in front of two
// fake model servers; sends each streamed chat completions (so that the per-backend, per-model
// and per-reason series exist and the peers exchange decisions), and reads their /metrics.
func exportedMetrics(t *testing.T) exported {
	t.Helper()
	r1, r2 := fakeReplica(t), fakeReplica(t)
	log := zap.NewNop()
	base := func(mode string) *configs.Config {
		cfg := &configs.Config{Mode: mode, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
			Backends: []configs.Backend{{URL: r1.URL}, {URL: r2.URL}}}
		return cfg
	}
	secret := filepath.Join(t.TempDir(), "peering-secret")
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := os.WriteFile(secret, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	var servings []*proxy.Serving
	stop := func(sv *proxy.Serving) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = sv.Stop(ctx)
	}
	var nodes []*peering.Node
	for i := range 2 {
		cfg := base("prefix")
		cfg.Peering = &configs.Peering{Listen: "127.0.0.1:0", SecretFile: secret}
		if i > 0 {
			cfg.Peering.Join = []string{nodes[0].Addr()}
		}
		sv, node, err := app.StartPeered(context.Background(), cfg, log)
		if err != nil {
			t.Fatalf("peered prefixlb: %v", err)
		}
		t.Cleanup(func() { stop(sv); _ = node.Close() })
		servings, nodes = append(servings, sv), append(nodes, node)
	}
	shadowed := base("round-robin")
	shadowed.Shadow = "prefix"
	sv, err := app.Start(context.Background(), shadowed, log)
	if err != nil {
		t.Fatalf("shadowed prefixlb: %v", err)
	}
	t.Cleanup(func() { stop(sv) })
	servings = append(servings, sv)

	testutil.Eventually(t, 10*time.Second, "the peered replicas see each other", func() bool {
		return nodes[0].Alive() >= 1 && nodes[1].Alive() >= 1
	})
	c := &http.Client{Timeout: 10 * time.Second}
	doc := strings.Repeat("a document the conversation shares ", 120)
	for round := range 4 {
		for i, sv := range servings {
			body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":"%s question %d"}]}`, doc, round*10+i)
			resp, err := c.Post(sv.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("request through %s: status %d", sv.URL(), resp.StatusCode)
			}
		}
	}
	// The peers' decisions reach the other replica (its decision-delay histogram).
	testutil.Eventually(t, 10*time.Second, "a peer update received by each replica", func() bool {
		return nodes[0].Stats().UpdatesReceived > 0 && nodes[1].Stats().UpdatesReceived > 0
	})
	e := exported{}
	for _, sv := range servings {
		for _, b := range sv.Backends() { // counted before the in-flight count drops
			testutil.Poll(5*time.Second, 5*time.Millisecond, func() bool { return b.InFlight() == 0 })
		}
		rec := httptest.NewRecorder()
		sv.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("/metrics: %d", rec.Code)
		}
		e.add(t, rec.Body.String())
	}
	return e
}
