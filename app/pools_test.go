package app

// Model-aware pools and shadow mode end to end: prefixlb started from a config in this
// process, in front of simulated vLLM replicas (bench/sim) on 127.0.0.1 serving different
// models and a LoRA-style adapter.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/bench/sim"
	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/proxy"
)

// poolSim is one simulated replica serving on a real socket until the test ends (or stop).
type poolSim struct {
	rep  *sim.Replica
	addr string
	url  string
	done chan error
}

// startPoolSim serves a sim replica of model (and adapters) on addr ("127.0.0.1:0": any port).
func startPoolSim(t *testing.T, addr, model string, adapters ...string) *poolSim {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.Adapters, cfg.Speedup = model, adapters, 100
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ps := &poolSim{rep: sim.NewReplica(model, cfg), addr: ln.Addr().String(), url: "http://" + ln.Addr().String(), done: make(chan error, 1)}
	go func() { ps.done <- ps.rep.Serve(ln) }()
	t.Cleanup(ps.stop)
	return ps
}

// stop closes the replica and waits (bounded) for Serve to return; safe to call twice.
func (ps *poolSim) stop() {
	if ps.done == nil {
		return
	}
	_ = ps.rep.Close()
	select {
	case <-ps.done:
	case <-time.After(testutil.Timeout):
	}
	ps.done = nil
}

// poolConfig is a config over sims: no active checks (healthy at once), a fast scrape (it
// detects restarts), and a model-list interval far beyond the test, so that a list is read at
// start and after a restart only.
func poolConfig(mode string, sims ...*poolSim) *configs.Config {
	cfg := &configs.Config{Listen: "127.0.0.1:0", Mode: mode}
	cfg.Health.Disabled = true
	cfg.Health.ScrapeInterval = configs.Duration(100 * time.Millisecond)
	cfg.Health.ModelsInterval = configs.Duration(time.Hour)
	for _, s := range sims {
		cfg.Backends = append(cfg.Backends, configs.Backend{URL: s.url})
	}
	return cfg
}

// startPools starts cfg's prefixlb with log (nil: none) until the test ends.
func startPools(t *testing.T, cfg *configs.Config, log *zap.Logger) *proxy.Serving {
	t.Helper()
	sv, err := Start(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
		defer cancel()
		_ = sv.Stop(ctx)
	})
	return sv
}

// modelList is GET /v1/models on base: the ids in order and the parent of each.
func modelList(t *testing.T, base string) (ids []string, parents map[string]string) {
	t.Helper()
	resp, err := testutil.Client().Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string  `json:"id"`
			Object string  `json:"object"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != http.StatusOK || l.Object != "list" {
		t.Fatalf("GET /v1/models: status %d, object %q, err %v", resp.StatusCode, l.Object, err)
	}
	parents = map[string]string{}
	for _, d := range l.Data {
		ids = append(ids, d.ID)
		if d.Parent != nil {
			parents[d.ID] = *d.Parent
		}
	}
	return ids, parents
}

// waitModels waits (bounded) until prefixlb's /v1/models lists want.
func waitModels(t *testing.T, base string, want ...string) {
	t.Helper()
	var got []string
	testutil.Eventually(t, testutil.Timeout, fmt.Sprintf("prefixlb lists models %v", want), func() bool {
		got, _ = modelList(t, base)
		return slices.Equal(got, want)
	})
}

// chat posts a one-token chat completion for model ("" : no model field) with prompt and
// returns the status, the backend that served it and the body.
func chat(t *testing.T, base, model, prompt string) (int, string, []byte) {
	t.Helper()
	m := ""
	if model != "" {
		m = fmt.Sprintf(`"model":%q,`, model)
	}
	body := fmt.Sprintf(`{%s"max_tokens":1,"messages":[{"role":"user","content":%q}]}`, m, prompt)
	resp, err := testutil.Client().Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(proxy.HeaderBackend), b
}

// chatSeen sums the chat requests the sims received.
func chatSeen(sims ...*poolSim) (n uint64) {
	for _, s := range sims {
		n += s.rep.Seen("/v1/chat/completions")
	}
	return n
}

// Two sims serving different models and a third serving the first model plus a LoRA-style
// adapter: each model's requests go to its pool only (round-robin within it, per model),
// prefixlb answers the union of the models itself, and a model nobody serves gets the
// OpenAI-shaped 404 and one log line, and reaches no replica.
func TestModelPoolsRouteByModel(t *testing.T) {
	a := startPoolSim(t, "127.0.0.1:0", "alpha")
	b := startPoolSim(t, "127.0.0.1:0", "beta")
	c := startPoolSim(t, "127.0.0.1:0", "alpha", "alpha-lora")
	log, rec := testutil.RecordingLogger()
	sv := startPools(t, poolConfig("round-robin", a, b, c), log)
	base := sv.URL()
	waitModels(t, base, "alpha", "alpha-lora", "beta")
	// The union can be complete before the health checker's first read of a (c serves alpha
	// too): the baseline below waits for every replica's first read (ModelsInterval is an hour).
	testutil.Eventually(t, testutil.Timeout, "every replica's model list read once", func() bool {
		return a.rep.Seen("/v1/models") > 0 && b.rep.Seen("/v1/models") > 0 && c.rep.Seen("/v1/models") > 0
	})

	// The union is prefixlb's own answer: sorted, alpha once though two replicas serve it,
	// the adapter with its parent; no replica is asked.
	listReads := []uint64{a.rep.Seen("/v1/models"), b.rep.Seen("/v1/models"), c.rep.Seen("/v1/models")}
	ids, parents := modelList(t, base)
	if !slices.Equal(ids, []string{"alpha", "alpha-lora", "beta"}) || parents["alpha-lora"] != "alpha" || parents["alpha"] != "" {
		t.Errorf("GET /v1/models = %v, parents %v; want alpha, alpha-lora (parent alpha), beta", ids, parents)
	}
	if now := []uint64{a.rep.Seen("/v1/models"), b.rep.Seen("/v1/models"), c.rep.Seen("/v1/models")}; !slices.Equal(now, listReads) {
		t.Errorf("GET /v1/models on prefixlb reached the replicas: their list reads went %v -> %v", listReads, now)
	}

	// Requests never cross pools.
	const perModel = 6
	served := map[string]map[string]int{}
	for i := range perModel {
		for _, m := range []string{"alpha", "beta", "alpha-lora"} {
			st, be, body := chat(t, base, m, fmt.Sprintf("request %d for %s", i, m))
			if st != http.StatusOK {
				t.Fatalf("model %s: status %d: %s", m, st, body)
			}
			if served[m] == nil {
				served[m] = map[string]int{}
			}
			served[m][be]++
		}
	}
	want := map[string]map[string]int{
		"alpha":      {a.url: perModel / 2, c.url: perModel / 2}, // round-robin within the pool of alpha
		"beta":       {b.url: perModel},
		"alpha-lora": {c.url: perModel},
	}
	for m, w := range want {
		if fmt.Sprint(served[m]) != fmt.Sprint(w) {
			t.Errorf("model %s served by %v, want %v", m, served[m], w)
		}
	}
	if got := []uint64{a.rep.Seen("/v1/chat/completions"), b.rep.Seen("/v1/chat/completions"), c.rep.Seen("/v1/chat/completions")}; !slices.Equal(got, []uint64{perModel / 2, perModel, perModel/2 + perModel}) {
		t.Errorf("the replicas received %v chat requests, want [3 6 9]", got)
	}

	// A model nobody serves: 404 from prefixlb, no replica sees it, one log line.
	before := chatSeen(a, b, c)
	rec.Take()
	st, be, body := chat(t, base, "gamma", "hello")
	var e struct {
		Error struct {
			Message, Type, Code string
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("404 body is not JSON: %v: %s", err, body)
	}
	wantMsg := `model "gamma" is not served; served models: alpha, alpha-lora, beta`
	if st != http.StatusNotFound || be != "" || e.Error.Code != "model_not_found" || e.Error.Type != "invalid_request_error" || e.Error.Message != wantMsg {
		t.Errorf("unknown model: status %d, backend %q, error %+v; want 404, no backend, model_not_found %q", st, be, e.Error, wantMsg)
	}
	if after := chatSeen(a, b, c); after != before {
		t.Errorf("the unknown model's request reached a replica (%d -> %d chat requests)", before, after)
	}
	lines := rec.Count(func(l testutil.LogEntry) bool { return strings.Contains(l.Text(), "gamma") })
	if lines != 1 {
		t.Errorf("%d log lines name the unknown model, want 1", lines)
	}

	// Without a model field: any backend.
	if st, be, body := chat(t, base, "", "no model"); st != http.StatusOK || be == "" {
		t.Errorf("request without a model: status %d backend %q: %s", st, be, body)
	}

	// The model label: one series per model served, everything else "other".
	m := adminMetrics(t, sv)
	for series, want := range map[string]float64{
		`prefixlb_model_requests_total{model="alpha",status="200"}`:      perModel,
		`prefixlb_model_requests_total{model="alpha-lora",status="200"}`: perModel,
		`prefixlb_model_not_found_total`:                                 1,
		`prefixlb_model_ttft_seconds_count{model="beta"}`:                perModel,
	} {
		if got := metricValue(t, m, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	// "other": the request without a model (and GET /v1/models forwarded before the lists were read).
	if got := metricValue(t, m, `prefixlb_model_requests_total{model="other",status="200"}`); got < 1 {
		t.Errorf(`model="other" counted %v requests, want the one without a model at least`, got)
	}
	if strings.Contains(m, `model="gamma"`) {
		t.Error("the unknown model has a label of its own")
	}
}

// adminMetrics is sv's /metrics, served on a socket of its own.
func adminMetrics(t *testing.T, sv *proxy.Serving) string {
	t.Helper()
	admin := httptest.NewServer(sv.AdminHandler())
	defer admin.Close()
	resp, err := testutil.Client().Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return string(raw)
}

// backends[].models wins over the replica's /v1/models: the replica is never asked, and the
// adapter it lists is not routed to.
func TestModelPoolsConfigWins(t *testing.T) {
	a := startPoolSim(t, "127.0.0.1:0", "alpha")
	c := startPoolSim(t, "127.0.0.1:0", "alpha", "alpha-lora")
	cfg := poolConfig("round-robin", a, c)
	cfg.Backends[1].Models = []string{"alpha"}
	sv := startPools(t, cfg, nil)
	base := sv.URL()
	waitModels(t, base, "alpha")
	// The list is [alpha] as soon as the configured backend is in; until a's own list is
	// read, a serves any model (alpha-lora too), so wait for that read.
	testutil.Eventually(t, testutil.Timeout, "a's models read", func() bool {
		for _, b := range sv.Backends() {
			if b.Models() == nil {
				return false
			}
		}
		return true
	})
	if st, _, body := chat(t, base, "alpha-lora", "hi"); st != http.StatusNotFound || !strings.Contains(string(body), `"model_not_found"`) {
		t.Errorf("alpha-lora with backends[1].models [alpha]: status %d %s, want 404 model_not_found", st, body)
	}
	served := map[string]int{}
	for i := range 4 {
		st, by, body := chat(t, base, "alpha", fmt.Sprint("hi ", i))
		if st != http.StatusOK {
			t.Fatalf("alpha: %d %s", st, body)
		}
		served[by]++
	}
	// Counted by the backend that answered (x-prefixlb-backend), not by what each sim
	// received: a pooled connection the sim closed as the request reached it is resent on a
	// new one, and the sim may count both.
	if served[a.url] != 2 || served[c.url] != 2 {
		t.Errorf("alpha split %d / %d, want 2 / 2 (%v)", served[a.url], served[c.url], served)
	}
	if n := c.rep.Seen("/v1/models"); n != 0 {
		t.Errorf("the replica whose models the config gives was asked for its list %d times", n)
	}
}

// A replica that restarts serving other models is read again (the scrape sees its new
// process start time; the timer is an hour away): its new model is routed to it and its old
// one is gone.
func TestModelPoolsRereadAfterRestart(t *testing.T) {
	a := startPoolSim(t, "127.0.0.1:0", "alpha")
	b := startPoolSim(t, "127.0.0.1:0", "beta")
	sv := startPools(t, poolConfig("round-robin", a, b), nil)
	base := sv.URL()
	waitModels(t, base, "alpha", "beta")
	b.stop()
	b2 := startPoolSim(t, b.addr, "delta")
	waitModels(t, base, "alpha", "delta")
	if st, be, body := chat(t, base, "delta", "hi"); st != http.StatusOK || be != b.url {
		t.Errorf("delta after the restart: status %d backend %q %s, want 200 from %s", st, be, body, b.url)
	}
	if st, _, _ := chat(t, base, "beta", "hi"); st != http.StatusNotFound {
		t.Errorf("beta after its replica restarted as delta: status %d, want 404", st)
	}
	if b2.rep.Seen("/v1/chat/completions") != 1 {
		t.Errorf("the restarted replica received %d chat requests, want 1", b2.rep.Seen("/v1/chat/completions"))
	}
}

// In mode prefix, the pooled prefill model that stands in for a replica that has not learned
// its own speed is its model pool's: the replicas serving alpha (one with an adapter too)
// share one and beta's replica has another (at start the policy may also be rebound by the
// KV-capacity scrape's refresh), and a replica that restarts serving alpha joins alpha's,
// which only the health checker's models hook reaching the policy does (without it, this
// part fails).
func TestModelPoolsPrefillModels(t *testing.T) {
	a := startPoolSim(t, "127.0.0.1:0", "alpha")
	b := startPoolSim(t, "127.0.0.1:0", "beta")
	c := startPoolSim(t, "127.0.0.1:0", "alpha", "alpha-lora")
	sv := startPools(t, poolConfig("prefix", a, b, c), nil)
	byURL := map[string]*backend.Backend{}
	for _, be := range sv.Backends() {
		byURL[be.Name] = be
	}
	ba, bb, bc := byURL[a.url], byURL[b.url], byURL[c.url]
	testutil.Eventually(t, testutil.Timeout, "the pooled models split by model", func() bool {
		return ba.Models() != nil && bb.Models() != nil && bc.Models() != nil &&
			ba.FleetPrefill() == bc.FleetPrefill() && ba.FleetPrefill() != bb.FleetPrefill()
	})
	if ba.FleetPrefill() == nil || bb.FleetPrefill() == nil {
		t.Fatal("a replica has no pooled prefill model")
	}
	b.stop()
	startPoolSim(t, b.addr, "alpha")
	waitModels(t, sv.URL(), "alpha", "alpha-lora")
	testutil.Eventually(t, testutil.Timeout, "the restarted replica in alpha's pooled model", func() bool {
		return bb.FleetPrefill() == ba.FleetPrefill()
	})
}

// multiTurn sends a few conversations of several turns, turn by turn across conversations
// (each turn's prompt is the conversation so far), and returns the backend of each request.
func multiTurn(t *testing.T, base string) []string {
	t.Helper()
	const conversations, turns = 4, 5
	hist := make([][]map[string]string, conversations)
	for i := range hist {
		sys := strings.Repeat(fmt.Sprintf("You are assistant %d of the test fleet; answer briefly. ", i), 12)
		hist[i] = []map[string]string{{"role": "system", "content": sys}}
	}
	var order []string
	for turn := range turns {
		for i := range hist {
			q := strings.Repeat(fmt.Sprintf("Question %d of conversation %d about the cache. ", turn, i), 8)
			hist[i] = append(hist[i], map[string]string{"role": "user", "content": q})
			body, _ := json.Marshal(map[string]any{"model": "alpha", "max_tokens": 2, "messages": hist[i]})
			resp, err := testutil.Client().Post(base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("conversation %d turn %d: status %d", i, turn, resp.StatusCode)
			}
			order = append(order, resp.Header.Get(proxy.HeaderBackend))
			hist[i] = append(hist[i], map[string]string{"role": "assistant", "content": "Answer " + strconv.Itoa(turn)})
		}
	}
	return order
}

// metricValue is the value of the series named exactly name in a Prometheus text body.
func metricValue(t *testing.T, body, name string) float64 {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// Shadow mode beside round-robin on the multi-turn pattern: the prefix policy would have
// found more of each prompt cached than round-robin did (shadow prefix tokens and estimated
// TTFT beat the actual ones), and routing is untouched: the backends in order are exactly
// those of the same run without the shadow.
func TestShadowModeRoundRobin(t *testing.T) {
	sims := []*poolSim{startPoolSim(t, "127.0.0.1:0", "alpha"), startPoolSim(t, "127.0.0.1:0", "alpha"), startPoolSim(t, "127.0.0.1:0", "alpha")}
	shadowCfg := poolConfig("round-robin", sims...)
	shadowCfg.Shadow = "prefix"
	withShadow := startPools(t, shadowCfg, nil)
	waitModels(t, withShadow.URL(), "alpha")
	order := multiTurn(t, withShadow.URL())

	m := adminMetrics(t, withShadow)
	var excerpt []string
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, "prefixlb_shadow_") {
			excerpt = append(excerpt, l)
		}
	}
	t.Logf("shadow metrics after %d requests:\n%s", len(order), strings.Join(excerpt, "\n"))
	agree := metricValue(t, m, `prefixlb_shadow_decisions_total{agree="true"}`)
	disagree := metricValue(t, m, `prefixlb_shadow_decisions_total{agree="false"}`)
	shadowTok := metricValue(t, m, `prefixlb_shadow_prefix_tokens_total{choice="shadow"}`)
	actualTok := metricValue(t, m, `prefixlb_shadow_prefix_tokens_total{choice="actual"}`)
	shadowTTFT := metricValue(t, m, `prefixlb_shadow_predicted_ttft_seconds_total{choice="shadow"}`)
	actualTTFT := metricValue(t, m, `prefixlb_shadow_predicted_ttft_seconds_total{choice="actual"}`)
	if int(agree+disagree) != len(order) {
		t.Errorf("shadow decisions %v + %v, want one per request (%d)", agree, disagree, len(order))
	}
	if disagree == 0 || !(shadowTok > actualTok) || !(shadowTTFT < actualTTFT) {
		t.Errorf("no predicted saving on multi-turn: disagree %v, prefix tokens shadow %v vs actual %v, TTFT shadow %v vs actual %v",
			disagree, shadowTok, actualTok, shadowTTFT, actualTTFT)
	}

	plain := startPools(t, poolConfig("round-robin", sims...), nil)
	waitModels(t, plain.URL(), "alpha")
	if again := multiTurn(t, plain.URL()); !slices.Equal(order, again) {
		t.Errorf("the shadow changed routing:\nwith    %v\nwithout %v", order, again)
	}
}
