package configs

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/proxy"
	"github.com/prefixlb/prefixlb/router"
	"gopkg.in/yaml.v3"
)

// A zero written in the file means what the field documents. prefix.load_margin is the one
// field whose zero is a value of its own (no margin) rather than its default; it reaches the
// policy as router.NoLoadMargin. Every other field takes its default from a 0 as from a field
// left out, because its zero would mean nothing (a zero interval, chunk or threshold) or
// because "off" is written otherwise (consecutive_failures: -1, scrape_disabled: true).
func TestZeroWrittenInTheFile(t *testing.T) {
	const bk = "backends:\n  - url: http://a:8000\n"
	cases := []struct {
		yaml string
		get  func(*Config) any
		want any
	}{
		{"prefix:\n  load_margin: 0\n" + bk, func(c *Config) any { return c.Prefix.LoadMargin }, OptionalInt{V: 0, Set: true}},
		{"prefix:\n  load_margin: 0\n" + bk, func(c *Config) any { return c.Prefix.RouterOptions().LoadMargin }, router.NoLoadMargin},
		{"prefix:\n  load_margin: 3\n" + bk, func(c *Config) any { return c.Prefix.RouterOptions().LoadMargin }, 3},
		{bk, func(c *Config) any { return c.Prefix.RouterOptions().LoadMargin }, router.DefaultLoadMargin},
		{"prefix:\n  load_margin: ~\n" + bk, func(c *Config) any { return c.Prefix.LoadMargin }, OptionalInt{V: router.DefaultLoadMargin, Set: true}},
		{"prefix:\n  tie_margin_percent: 0\n" + bk, func(c *Config) any { return c.Prefix.RouterOptions().TieMargin }, float64(router.NoTieMargin)},
		{"prefix:\n  tie_margin_percent: 25\n" + bk, func(c *Config) any { return c.Prefix.RouterOptions().TieMargin }, 0.25},
		{bk, func(c *Config) any { return c.PrefixOptions().TieBreak }, router.TieBreakAuto},
		{"prefix:\n  tie_break: ring\n" + bk, func(c *Config) any { return c.PrefixOptions().TieBreak }, router.TieBreakRing},
		{"prefix:\n  tie_break: load\n" + bk, func(c *Config) any { return c.Prefix.RouterOptions().TieBreak }, router.TieBreakLoad},
		{bk, func(c *Config) any { return c.Prefix.RouterOptions().TieMargin }, router.DefaultTieMargin},
		{bk, func(c *Config) any { return c.Prefix.RouterOptions().NoSpreadNewPrefixes }, false},
		{"prefix:\n  spread_new_prefixes: false\n" + bk, func(c *Config) any { return c.Prefix.RouterOptions().NoSpreadNewPrefixes }, true},
		{"prefix:\n  spread_new_prefixes: true\n" + bk, func(c *Config) any { return c.Prefix.RouterOptions().NoSpreadNewPrefixes }, false},
		{"max_request_body_bytes: 0\n" + bk, func(c *Config) any { return c.MaxRequestBodyBytes }, proxy.DefaultMaxRequestBodyBytes},
		{"timeouts:\n  connect: 0s\n  idle: 0s\n" + bk, func(c *Config) any { return []time.Duration{c.Timeouts.Connect.D(), c.Timeouts.Idle.D()} },
			[]time.Duration{proxy.DefaultConnectTimeout, proxy.DefaultIdleTimeout}},
		{"prefix:\n  chunk_tokens: 0\n  load_factor: 0\n  default_kv_cache_tokens: 0\n  max_index_entries: 0\n" + bk,
			func(c *Config) any { return c.Prefix.RouterOptions() }, defaulted.Prefix.RouterOptions()},
		{"health:\n  consecutive_failures: 0\n  max_ejected_percent: 0\n  healthy_threshold: 0\n" + bk,
			func(c *Config) any {
				return []int{c.Health.ConsecutiveFailures, c.Health.MaxEjectedPercent, c.Health.HealthyThreshold}
			},
			[]int{defaulted.Health.ConsecutiveFailures, defaulted.Health.MaxEjectedPercent, defaulted.Health.HealthyThreshold}},
		{"health:\n  consecutive_failures: -1\n" + bk, func(c *Config) any { return c.Health.ConsecutiveFailures }, -1},
		{"backends:\n  - url: http://a:8000\n    weight: 0\n    kv_cache_tokens: 0\n", func(c *Config) any { return c.Backends[0] },
			Backend{URL: "http://a:8000", Weight: 1}},
	}
	for _, c := range cases {
		cfg, err := Parse([]byte(c.yaml))
		if err != nil {
			t.Errorf("Parse(%q): %v", c.yaml, err)
			continue
		}
		if got := c.get(cfg); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q): got %+v, want %+v", c.yaml, got, c.want)
		}
	}
}

// prefix.load_margin reads as the plain integer field it was: a non-integer is an error
// naming the field and the line, a negative one fails validation, a null is left out.
func TestLoadMarginSyntax(t *testing.T) {
	const bk = "backends:\n  - url: http://a:8000\n"
	for _, c := range []struct {
		yaml    string
		want    int
		errPart string
	}{
		{"prefix:\n  load_margin: two\n", 0, `prefix.load_margin: line 2: want an integer, got the string "two"`},
		{"prefix:\n  load_margin: \"3\"\n", 0, `prefix.load_margin: line 2: want an integer, got the string "3"`},
		{"prefix:\n  load_margin: [1]\n", 0, "prefix.load_margin: line 2: want an integer, got a list"},
		{"prefix:\n  load_margin: -1\n", 0, "prefix.load_margin: -1 is negative"},
		{"prefix:\n  load_margin: ~\n", router.DefaultLoadMargin, ""},
		{"prefix:\n  load_margin: 0x10\n", 16, ""},
	} {
		cfg, err := Parse([]byte(c.yaml + bk))
		switch {
		case c.errPart != "":
			if err == nil || !strings.Contains(err.Error(), c.errPart) {
				t.Errorf("Parse(%q) = %v, want an error containing %q", c.yaml, err, c.errPart)
			}
		case err != nil:
			t.Errorf("Parse(%q): %v", c.yaml, err)
		case cfg.Prefix.LoadMargin != OptionalInt{V: c.want, Set: true}:
			t.Errorf("Parse(%q): load_margin %+v, want %d", c.yaml, cfg.Prefix.LoadMargin, c.want)
		}
	}
}

// prefix.spread_new_prefixes reads as a plain boolean: anything else is an error naming the
// field.
func TestSpreadNewPrefixesSyntax(t *testing.T) {
	_, err := Parse([]byte("prefix:\n  spread_new_prefixes: sometimes\nbackends:\n  - url: http://a:8000\n"))
	if err == nil || !strings.Contains(err.Error(), "prefix.spread_new_prefixes: line 2: want true or false") {
		t.Fatalf("Parse: %v, want an error about the boolean", err)
	}
}

// A Config written back to YAML reads back the same, unset optional fields included (null,
// not their zero, which would turn a default-on field off).
func TestOptionalRoundTrip(t *testing.T) {
	for _, in := range []Prefix{
		{},
		{LoadMargin: OptionalInt{V: 0, Set: true}, SpreadNewPrefixes: OptionalBool{V: false, Set: true}},
		{TieMarginPercent: OptionalInt{V: 25, Set: true}, SpreadNewPrefixes: OptionalBool{V: true, Set: true}},
	} {
		out, err := yaml.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var back Prefix
		if err := yaml.Unmarshal(out, &back); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if back != in {
			t.Errorf("round trip of %+v: %+v (%s)", in, back, out)
		}
	}
}
