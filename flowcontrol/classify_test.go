package flowcontrol

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

const (
	chatKey  = "sk-chat-0123456789abcdef"
	batchKey = "sk-batch-fedcba9876543210"
	otherKey = "sk-other-5555"
)

func prio(p int) *int { return &p }

// testRules: a key raised, a model marked sheddable and given a flow, a path given a flow,
// and a rule that needs both a key and a model.
func testClassifierConfig(trusted bool) ClassifierConfig {
	return ClassifierConfig{
		DefaultPriority: 0,
		Objectives:      map[string]int{"critical": 50, "sheddable": -5},
		TrustedHeaders:  trusted,
		Rules: []Rule{
			{APIKeySHA256: HashKey(chatKey), Priority: prio(10)},
			{Model: "llama-batch", Priority: prio(-1), Flow: "batch"},
			{Path: "/v1/embeddings", Flow: "embed"},
			{APIKeySHA256: strings.ToUpper(HashKey(batchKey)), Model: "m2", Priority: prio(5)},
		},
	}
}

func mustClassifier(t testing.TB, cfg ClassifierConfig) *Classifier {
	t.Helper()
	c, err := NewClassifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hdr builds headers from name/value pairs (names canonicalised as net/http does).
func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func keyFlowOf(key string) string { return "key:" + HashKey(key)[:16] }

func TestClassify(t *testing.T) {
	long := strings.Repeat("f", MaxHeaderValue+1)
	edge := strings.Repeat("e", MaxHeaderValue)
	cases := []struct {
		name    string
		trusted bool
		req     Request
		want    Class
	}{
		{"nothing: default priority, anonymous flow", false, Request{Path: "/v1/completions"},
			Class{0, AnonymousFlow, SourceDefault, SourceAnonymous, 0}},
		{"a key no rule names: its hash's flow", false, Request{Headers: hdr("authorization", "Bearer "+otherKey)},
			Class{0, keyFlowOf(otherKey), SourceDefault, SourceKey, 0}},
		{"x-api-key is the same key", false, Request{Headers: hdr("x-api-key", otherKey)},
			Class{0, keyFlowOf(otherKey), SourceDefault, SourceKey, 0}},
		{"scheme in any case, spaces trimmed", false, Request{Headers: hdr("authorization", "bearer  "+otherKey+" ")},
			Class{0, keyFlowOf(otherKey), SourceDefault, SourceKey, 0}},
		{"Authorization wins over x-api-key", false, Request{Headers: hdr("authorization", "Bearer "+otherKey, "x-api-key", chatKey)},
			Class{0, keyFlowOf(otherKey), SourceDefault, SourceKey, 0}},
		{"not a bearer token: x-api-key, else anonymous", false, Request{Headers: hdr("authorization", "Basic dXNlcjpwYXNz")},
			Class{0, AnonymousFlow, SourceDefault, SourceAnonymous, 0}},
		{"rule by key sets the priority, the key keeps its flow", false, Request{Headers: hdr("authorization", "Bearer "+chatKey)},
			Class{10, keyFlowOf(chatKey), SourceRule, SourceKey, 0}},
		{"rule by model sets both", false, Request{Model: "llama-batch", Headers: hdr("x-api-key", otherKey)},
			Class{-1, "rule:batch", SourceRule, SourceRule, 0}},
		{"first match wins, whole: the key's rule, not the model's flow", false, Request{Model: "llama-batch", Headers: hdr("authorization", "Bearer "+chatKey)},
			Class{10, keyFlowOf(chatKey), SourceRule, SourceKey, 0}},
		{"rule by path sets the flow only", false, Request{Path: "/v1/embeddings"},
			Class{0, "rule:embed", SourceDefault, SourceRule, 0}},
		{"key and model both match (hash in upper case)", false, Request{Model: "m2", Headers: hdr("x-api-key", batchKey)},
			Class{5, keyFlowOf(batchKey), SourceRule, SourceKey, 0}},
		{"key matches, model not: no rule", false, Request{Model: "m3", Headers: hdr("x-api-key", batchKey)},
			Class{0, keyFlowOf(batchKey), SourceDefault, SourceKey, 0}},
		{"a rule by key never matches a request without one", false, Request{Model: "m2"},
			Class{0, AnonymousFlow, SourceDefault, SourceAnonymous, 0}},

		// Headers without trusted_headers: ignored, noted.
		{"untrusted priority header ignored", false, Request{Headers: hdr("x-prefixlb-priority", "100")},
			Class{0, AnonymousFlow, SourceDefault, SourceAnonymous, IgnoredUntrusted}},
		{"untrusted objective ignored", false, Request{Headers: hdr("x-llm-d-inference-objective", "critical", "authorization", "Bearer "+otherKey)},
			Class{0, keyFlowOf(otherKey), SourceDefault, SourceKey, IgnoredUntrusted}},
		{"untrusted flow ignored", false, Request{Headers: hdr("x-prefixlb-flow", "tenant-a", "x-llm-d-inference-fairness-id", "b")},
			Class{0, AnonymousFlow, SourceDefault, SourceAnonymous, IgnoredUntrusted}},
		{"untrusted header cannot lift a ruled key", false, Request{Headers: hdr("x-prefixlb-priority", "1000", "authorization", "Bearer "+chatKey)},
			Class{10, keyFlowOf(chatKey), SourceRule, SourceKey, IgnoredUntrusted}},

		// Trusted headers.
		{"trusted priority", true, Request{Headers: hdr("x-prefixlb-priority", "100")},
			Class{100, AnonymousFlow, SourceHeader, SourceAnonymous, 0}},
		{"trusted negative priority", true, Request{Headers: hdr("x-prefixlb-priority", "-3")},
			Class{-3, AnonymousFlow, SourceHeader, SourceAnonymous, 0}},
		{"a rule's priority wins over the header", true, Request{Headers: hdr("x-prefixlb-priority", "100", "authorization", "Bearer "+chatKey)},
			Class{10, keyFlowOf(chatKey), SourceRule, SourceKey, 0}},
		{"a rule without a flow leaves it to the header", true, Request{Headers: hdr("x-prefixlb-flow", "t1", "authorization", "Bearer "+chatKey)},
			Class{10, "hdr:t1", SourceRule, SourceHeader, 0}},
		{"a rule's flow wins over the header", true, Request{Model: "llama-batch", Headers: hdr("x-prefixlb-flow", "t1", "x-prefixlb-priority", "7")},
			Class{-1, "rule:batch", SourceRule, SourceRule, 0}},
		{"a rule without a priority leaves it to the header", true, Request{Path: "/v1/embeddings", Headers: hdr("x-prefixlb-priority", "7")},
			Class{7, "rule:embed", SourceHeader, SourceRule, 0}},
		{"objective", true, Request{Headers: hdr("x-llm-d-inference-objective", "critical")},
			Class{50, AnonymousFlow, SourceObjective, SourceAnonymous, 0}},
		{"unknown objective: default, noted", true, Request{Headers: hdr("x-llm-d-inference-objective", "urgent")},
			Class{0, AnonymousFlow, SourceDefault, SourceAnonymous, IgnoredUnknownObjective}},
		{"x-prefixlb-priority wins over the objective", true, Request{Headers: hdr("x-llm-d-inference-objective", "sheddable", "x-prefixlb-priority", "2")},
			Class{2, AnonymousFlow, SourceHeader, SourceAnonymous, 0}},
		{"a bad priority falls to the objective", true, Request{Headers: hdr("x-llm-d-inference-objective", "sheddable", "x-prefixlb-priority", "high")},
			Class{-5, AnonymousFlow, SourceObjective, SourceAnonymous, IgnoredBadPriority}},
		{"priority out of range ignored", true, Request{Headers: hdr("x-prefixlb-priority", "1001")},
			Class{0, AnonymousFlow, SourceDefault, SourceAnonymous, IgnoredBadPriority}},
		{"priority over the length bound ignored", true, Request{Headers: hdr("x-prefixlb-priority", strings.Repeat("0", MaxHeaderValue)+"1")},
			Class{0, AnonymousFlow, SourceDefault, SourceAnonymous, IgnoredTooLong}},
		{"flow header", true, Request{Headers: hdr("x-prefixlb-flow", "tenant-a", "x-api-key", otherKey)},
			Class{0, "hdr:tenant-a", SourceDefault, SourceHeader, 0}},
		{"fairness id", true, Request{Headers: hdr("x-llm-d-inference-fairness-id", "tenant-b")},
			Class{0, "hdr:tenant-b", SourceDefault, SourceFairness, 0}},
		{"x-prefixlb-flow wins over the fairness id", true, Request{Headers: hdr("x-llm-d-inference-fairness-id", "tenant-b", "x-prefixlb-flow", "tenant-a")},
			Class{0, "hdr:tenant-a", SourceDefault, SourceHeader, 0}},
		{"a header cannot name a key's flow", true, Request{Headers: hdr("x-prefixlb-flow", keyFlowOf(chatKey))},
			Class{0, "hdr:" + keyFlowOf(chatKey), SourceDefault, SourceHeader, 0}},
		{"a flow at the bound is read whole", true, Request{Headers: hdr("x-prefixlb-flow", edge)},
			Class{0, "hdr:" + edge, SourceDefault, SourceHeader, 0}},
		{"a flow over the bound is ignored, not cut", true, Request{Headers: hdr("x-prefixlb-flow", long, "x-api-key", otherKey)},
			Class{0, keyFlowOf(otherKey), SourceDefault, SourceKey, IgnoredTooLong}},
		{"a long flow falls to the fairness id", true, Request{Headers: hdr("x-prefixlb-flow", long, "x-llm-d-inference-fairness-id", "b")},
			Class{0, "hdr:b", SourceDefault, SourceFairness, IgnoredTooLong}},
	}
	untrusted, trusted := mustClassifier(t, testClassifierConfig(false)), mustClassifier(t, testClassifierConfig(true))
	for _, tc := range cases {
		c := untrusted
		if tc.trusted {
			c = trusted
		}
		got := c.Classify(tc.req)
		if got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
		for _, k := range []string{chatKey, batchKey, otherKey} {
			if strings.Contains(got.Flow, k) || strings.Contains(got.Flow, HashKey(k)) {
				t.Errorf("%s: flow %q holds a key or its whole hash", tc.name, got.Flow)
			}
		}
	}
}

// Without trusted_headers no header a client can send changes its priority, whatever the
// config: the default and the rules alone decide.
func TestClientCannotRaiseItsPriority(t *testing.T) {
	c := mustClassifier(t, testClassifierConfig(false))
	base := c.Classify(Request{Headers: hdr("x-api-key", otherKey)})
	for _, h := range []http.Header{
		hdr("x-api-key", otherKey, "x-prefixlb-priority", "1000"),
		hdr("x-api-key", otherKey, "x-llm-d-inference-objective", "critical"),
		hdr("x-api-key", otherKey, "x-prefixlb-priority", "1000", "x-llm-d-inference-objective", "critical", "x-prefixlb-flow", "vip", "x-llm-d-inference-fairness-id", "vip"),
	} {
		got := c.Classify(Request{Headers: h})
		if got.Priority != base.Priority || got.Flow != base.Flow || got.Ignored != IgnoredUntrusted {
			t.Errorf("headers %v: %+v, want %+v with untrusted noted", h, got, base)
		}
	}
}

func TestNewClassifierErrors(t *testing.T) {
	const raw = "sk-live-this-is-a-secret-key-written-by-mistake-0000000000000000" // 64 characters, not hex
	for _, tc := range []struct {
		cfg  ClassifierConfig
		want string
	}{
		{ClassifierConfig{DefaultPriority: 1001}, "default_priority: 1001 is outside -1000..1000"},
		{ClassifierConfig{Objectives: map[string]int{"a": -2000}}, "objectives.a: -2000 is outside"},
		{ClassifierConfig{Objectives: map[string]int{"": 1}}, "objectives: empty name"},
		{ClassifierConfig{Objectives: map[string]int{"two words": 1}}, "objectives: \"two words\" holds a space"},
		{ClassifierConfig{Rules: []Rule{{Flow: "a"}, {APIKeySHA256: raw, Priority: prio(1)}}}, "rules[1].api_key_sha256: not hex digits"},
		{ClassifierConfig{Rules: []Rule{{APIKeySHA256: "sk-short", Priority: prio(1)}}}, "rules[0].api_key_sha256: 8 characters, want the 64 hex digits"},
		{ClassifierConfig{Rules: []Rule{{Path: "v1/chat/completions", Flow: "a"}}}, "rules[0].path: \"v1/chat/completions\" must start with /"},
		{ClassifierConfig{Rules: []Rule{{Model: "m", Priority: prio(-1001)}}}, "rules[0].priority: -1001 is outside"},
		{ClassifierConfig{Rules: []Rule{{Model: "m", Flow: strings.Repeat("x", MaxHeaderValue+1)}}}, "rules[0].flow: a name of 129 bytes, over 128"},
		{ClassifierConfig{Rules: []Rule{{Model: "m", Flow: "a\tb"}}}, "rules[0].flow: \"a\\tb\" holds a space or control character"},
		{ClassifierConfig{Rules: []Rule{{Model: "m"}}}, "rules[0]: sets neither priority nor flow"},
	} {
		_, err := NewClassifier(tc.cfg)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one starting %q", tc.cfg, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "sk-") {
			t.Errorf("error %q quotes what may be a key", err)
		}
	}
	// A rule with no match field matches every request (a shared flow for all, say).
	c := mustClassifier(t, ClassifierConfig{Rules: []Rule{{Flow: "all"}}})
	if got := c.Classify(Request{Headers: hdr("x-api-key", otherKey)}); got.Flow != "rule:all" {
		t.Errorf("catch-all rule: %+v", got)
	}
}

// parsePriority agrees with strconv.Atoi on the integers within range and refuses the rest.
func TestParsePriority(t *testing.T) {
	for _, s := range []string{"0", "7", "-7", "+7", "1000", "-1000", "1001", "-1001", "0001000", "00001000", "", "-", "+", "1e3", "1.0", " 1", "1 ", "0x10", "9999999", "99999999999999999999", "١"} {
		want, err := strconv.Atoi(s)
		wantOK := err == nil && want >= -MaxPriority && want <= MaxPriority && len(strings.TrimLeft(s, "+-")) <= 7
		got, ok := parsePriority(s)
		if ok != wantOK || ok && got != want {
			t.Errorf("parsePriority(%q) = %d, %v; want %d, %v", s, got, ok, want, wantOK)
		}
	}
}

// HashKey is the SHA-256 a rule holds (the FIPS 180-2 test vector for "abc"), spaces and
// tabs around the key trimmed as Classify trims them from a header.
func TestHashKey(t *testing.T) {
	const abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	for _, in := range []string{"abc", " abc\t"} {
		if got := HashKey(in); got != abc {
			t.Errorf("HashKey(%q) = %s, want %s", in, got, abc)
		}
	}
	c := mustClassifier(t, ClassifierConfig{Rules: []Rule{{APIKeySHA256: abc, Priority: prio(3)}}})
	if got := c.Classify(Request{Headers: hdr("authorization", "Bearer abc")}); got.Priority != 3 || got.Flow != "key:ba7816bf8f01cfea" {
		t.Errorf("Classify by the hash of abc: %+v", got)
	}
}

// The classifier allocates only the flow ID of a key or a header: nothing for a rule's
// flow or the anonymous flow, whatever the rules and headers read.
func TestClassifyAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	c := mustClassifier(t, benchClassifierConfig())
	for _, tc := range []struct {
		name string
		req  Request
		max  float64
	}{
		{"anonymous", Request{Path: "/v1/chat/completions", Model: "m", Headers: hdr("x-prefixlb-priority", "3")}, 0},
		{"rule flow, key hashed", Request{Path: "/v1/chat/completions", Model: "batch", Headers: hdr("authorization", "Bearer "+otherKey, "x-llm-d-inference-objective", "critical")}, 0},
		{"key flow", Request{Path: "/v1/chat/completions", Model: "m", Headers: hdr("authorization", "Bearer "+otherKey)}, 1},
		{"header flow", Request{Path: "/v1/chat/completions", Model: "m", Headers: hdr("x-prefixlb-flow", "tenant-a", "x-prefixlb-priority", "bad")}, 1},
	} {
		if got := testing.AllocsPerRun(200, func() { c.Classify(tc.req) }); got > tc.max {
			t.Errorf("%s: %.1f allocations per Classify, want at most %.0f", tc.name, got, tc.max)
		}
	}
}

// benchClassifierConfig: 16 rules by key, then by model and path, trusted headers.
func benchClassifierConfig() ClassifierConfig {
	cfg := ClassifierConfig{TrustedHeaders: true, Objectives: map[string]int{"critical": 10, "batch": -1}}
	for i := range 16 {
		cfg.Rules = append(cfg.Rules, Rule{APIKeySHA256: HashKey(fmt.Sprint("sk-tenant-", i)), Priority: prio(i % 3)})
	}
	cfg.Rules = append(cfg.Rules, Rule{Model: "batch", Priority: prio(-1), Flow: "batch"}, Rule{Path: "/v1/embeddings", Flow: "embed"})
	return cfg
}

// go test -run XXX -bench Classify -benchmem ./flowcontrol/
func BenchmarkClassify(b *testing.B) {
	c := mustClassifier(b, benchClassifierConfig())
	req := Request{Path: "/v1/chat/completions", Model: "m", Headers: hdr("authorization", "Bearer "+otherKey, "x-llm-d-inference-objective", "critical")}
	b.ReportAllocs()
	for b.Loop() {
		c.Classify(req)
	}
}
