package proxy

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router"
)

// cachedBackend is a replica that streams one token and a usage event reporting prompt
// prompt tokens of which cached were found in its KV cache, as vLLM with
// --enable-prompt-tokens-details does.
func cachedBackend(t *testing.T, prompt, cached int) *httptest.Server {
	t.Helper()
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", prompt, cached)
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(be.Close)
	return be
}

// teachPrefillRate gives b a learned base of 20 ms and prefill rate of rate tokens/s, as
// backend.MinPrefillSamples streamed requests of each kind would.
func teachPrefillRate(b *backend.Backend, rate float64) {
	for range backend.MinPrefillSamples {
		b.ObservePrefill(0, 20*time.Millisecond)
	}
	for range backend.MinPrefillSamples {
		b.ObservePrefill(int64(rate), time.Second+20*time.Millisecond)
	}
}

// scrapeMetrics is the admin listener's /metrics page of s.
func scrapeMetrics(t *testing.T, s *Server) string {
	t.Helper()
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	resp, err := testClient().Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// sampleValue is the value of the sample named exactly series (name and labels) on page.
func sampleValue(t *testing.T, page, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", series)
	return 0
}

// checkFamily fails unless family has exactly one HELP line (saying what help must contain)
// and one TYPE counter line on page, both before its first sample.
func checkFamily(t *testing.T, page, family, help string) {
	t.Helper()
	helpAt, typeAt, firstSample := -1, -1, -1
	for i, l := range strings.Split(page, "\n") {
		switch {
		case strings.HasPrefix(l, "# HELP "+family+" "):
			if helpAt >= 0 {
				t.Errorf("%s: two HELP lines", family)
			}
			helpAt = i
			if !strings.Contains(l, help) {
				t.Errorf("%s: HELP does not say %q: %s", family, help, l)
			}
		case l == "# TYPE "+family+" counter":
			if typeAt >= 0 {
				t.Errorf("%s: two TYPE lines", family)
			}
			typeAt = i
		case firstSample < 0 && (strings.HasPrefix(l, family+"{") || strings.HasPrefix(l, family+" ")):
			firstSample = i
		}
	}
	if helpAt < 0 || typeAt < 0 || firstSample < 0 || helpAt > firstSample || typeAt > firstSample {
		t.Errorf("%s: HELP at line %d, TYPE at %d, first sample at %d: want both before the samples", family, helpAt, typeAt, firstSample)
	}
}

func chatBody(turn int) string {
	return `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("a shared document ", 300) +
		`"},{"role":"user","content":"question ` + strconv.Itoa(turn) + `"}]}`
}

// The backend reports 2048 of 3000 prompt tokens cached on every request: prefixlb counts
// them (prefixlb_backend_cached_tokens_total) and, once it has learned the backend's prefill
// rate, their prefill seconds at that rate (prefixlb_prefill_saved_seconds_total: the cached
// tokens as attention-weighted work ÷ the rate); before that, none. Keying and picking count
// time in prefixlb_routing_seconds_total. Each family has its HELP and TYPE.
func TestSavedPrefillSecondsAtLearnedRate(t *testing.T) {
	const prompt, cached = 3000, 2048
	be := cachedBackend(t, prompt, cached)
	s, url := startProxy(t, "prefix", []string{be.URL}, nil)
	c := testClient()
	post := func(turn int) {
		t.Helper()
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(turn)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		waitInFlightZero(t, s) // finished: counted
	}
	lbl := `{backend="` + be.URL + `"}`
	b := s.Backends()[0]

	post(0)
	page := scrapeMetrics(t, s)
	if got := sampleValue(t, page, "prefixlb_backend_cached_tokens_total"+lbl); got != cached {
		t.Errorf("cached tokens %v, want %d", got, cached)
	}
	if _, ok := b.LearnedPrefillRate(); ok {
		t.Fatal("a rate learned from one request")
	}
	if got := sampleValue(t, page, "prefixlb_prefill_saved_seconds_total"+lbl); got != 0 {
		t.Errorf("saved %v s before any rate was learned, want 0", got)
	}

	teachPrefillRate(b, 20_000)
	post(1)
	// The rate as it stood when the request finished: the taught samples with the two
	// requests' own TTFTs folded in.
	rate, ok := b.LearnedPrefillRate()
	if !ok {
		t.Fatal("no rate learned")
	}
	page = scrapeMetrics(t, s)
	want := router.CachedPrefillWork(cached) / rate // 2048 × (1 + 1024/32768) tokens of work
	if got := sampleValue(t, page, "prefixlb_prefill_saved_seconds_total"+lbl); math.Abs(got-want) > 1e-8 {
		t.Errorf("saved %v s, want %v (2048 cached tokens at %v tokens/s)", got, want, rate)
	}
	if got := sampleValue(t, page, "prefixlb_backend_cached_tokens_total"+lbl); got != 2*cached {
		t.Errorf("cached tokens %v, want %d", got, 2*cached)
	}
	for _, stage := range []string{"key", "pick"} {
		if got := sampleValue(t, page, `prefixlb_routing_seconds_total{stage="`+stage+`"}`); !(got > 0 && got < 10) {
			t.Errorf("routing seconds, stage %s: %v after 2 requests", stage, got)
		}
	}
	checkFamily(t, page, "prefixlb_routing_seconds_total", "approximates CPU-seconds")
	checkFamily(t, page, "prefixlb_prefill_saved_seconds_total", "learned")
	if strings.Contains(page, "\nprefixlb_shadow_") || strings.Contains(page, "# HELP prefixlb_shadow_") {
		t.Error("shadow families written without a shadow")
	}
	parseMetrics(t, page) // every sample line well formed

	// A removed backend's series goes with it.
	s.UpdateBackends(nil)
	if page := scrapeMetrics(t, s); strings.Contains(page, "prefixlb_prefill_saved_seconds_total{") {
		t.Error("saved seconds of a removed backend still written")
	}
}

// Shadow mode beside round-robin, two backends with learned rates, a conversation whose
// turns share a long prefix: prefixlb_shadow_prefill_saved_seconds_total reports, per choice,
// what the shadow policy estimated (its ShadowStats), and the prefix policy would have saved
// more than round-robin did.
func TestShadowSavedPrefillSeconds(t *testing.T) {
	b1, b2 := cachedBackend(t, 3000, 0), cachedBackend(t, 3000, 0)
	s, url := startProxy(t, "round-robin", []string{b1.URL, b2.URL}, func(o *Options) {
		sh, err := router.NewShadow(router.ShadowPrefix, "round-robin", o.Policy, router.PolicyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		o.Policy = sh
	})
	for _, b := range s.Backends() {
		teachPrefillRate(b, 20_000)
	}
	c := testClient()
	var history strings.Builder
	history.WriteString(strings.Repeat("a long system prompt ", 400))
	for turn := range 6 {
		fmt.Fprintf(&history, " turn %d: %s", turn, strings.Repeat("more context ", 100))
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + history.String() + `"}]}`
		resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		waitInFlightZero(t, s)
	}
	page := scrapeMetrics(t, s)
	st, _ := s.Policy().(router.Inspector).ShadowStats()
	shadow := sampleValue(t, page, `prefixlb_shadow_prefill_saved_seconds_total{choice="shadow"}`)
	actual := sampleValue(t, page, `prefixlb_shadow_prefill_saved_seconds_total{choice="actual"}`)
	if shadow != st.ShadowSavedPrefillSeconds || actual != st.ActualSavedPrefillSeconds {
		t.Errorf("written shadow %v actual %v, the policy's %v and %v", shadow, actual, st.ShadowSavedPrefillSeconds, st.ActualSavedPrefillSeconds)
	}
	if !(shadow > actual) {
		t.Errorf("shadow saved %v s, actual %v s: the prefix policy finds every earlier turn, round-robin half of them", shadow, actual)
	}
	checkFamily(t, page, "prefixlb_shadow_prefill_saved_seconds_total", "not yet switched on")
}
