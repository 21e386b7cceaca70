package configs

import (
	"strings"
	"testing"
)

// A value of the wrong type is an error of one line that names the field's path (as
// Validate's errors do) and the line, in the file's terms, not Go's.
func TestTypeErrorsNameTheFieldPath(t *testing.T) {
	const bk = "backends:\n - url: http://a:1\n"
	for _, c := range []struct{ name, yaml, want string }{
		{"flow mapping", "prefix: {hard_load_factor: \"abc\"}\n" + bk, `config: prefix.hard_load_factor: line 1: want a number, got the string "abc"`},
		{"float", "prefix:\n  hard_load_factor: abc\n" + bk, `config: prefix.hard_load_factor: line 2: want a number, got the string "abc"`},
		{"list for a mapping", "prefix:\n  - a\n" + bk, "config: prefix: line 2: want a mapping, got a list"},
		{"scalar for a mapping", "health: on\n" + bk, `config: health: line 1: want a mapping, got the string "on"`},
		{"mapping for a list", "backends: {url: http://a:1}\n", "config: backends: line 1: want a list, got a mapping"},
		{"list element", bk + "   weight: heavy\n", `config: backends[0].weight: line 3: want an integer, got the string "heavy"`},
		{"string list element", bk + "   models: [a, {b: c}]\n", "config: backends[0].models[1]: line 3: want a string, got a mapping"},
		{"pointer section", "peering:\n  join: 10.0.0.1:7946\n" + bk, `config: peering.join: line 2: want a list, got the string "10.0.0.1:7946"`},
		{"number for a bool", "health:\n  disabled: 1.5\n" + bk, "config: health.disabled: line 2: want true or false, got 1.5"},
		{"quoted number", "prefix:\n  load_margin: \"3\"\n" + bk, `config: prefix.load_margin: line 2: want an integer, got the string "3"`},
		{"bool", "health:\n  disabled: [yes]\n" + bk, "config: health.disabled: line 2: want true or false, got a list"},
		{"optional int", "prefix:\n  load_margin: two\n" + bk, `config: prefix.load_margin: line 2: want an integer, got the string "two"`},
		// yaml.v3 would truncate these (1000.7 read as 1000): a fraction is refused.
		{"fraction for an integer", bk + "   kv_cache_tokens: 1000.7\n", "config: backends[0].kv_cache_tokens: line 3: want an integer, got 1000.7"},
		{"fraction for a weight", bk + "   weight: 2.9\n", "config: backends[0].weight: line 3: want an integer, got 2.9"},
		{"fraction for an optional int", "prefix:\n  load_margin: 1.5\n" + bk, "config: prefix.load_margin: line 2: want an integer, got 1.5"},
		{"duration syntax", "timeouts:\n  connect: soon\n" + bk, `config: timeouts.connect: line 2: "soon" is not a duration`},
		{"duration of a list", "timeouts:\n  idle: [1]\n" + bk, "config: timeouts.idle: line 2: want a duration (e.g. 500ms, 5s, 10m), got a list"},
		{"discovery", "discovery:\n  dns:\n    port: http\n" + bk, `config: discovery.dns.port: line 3: want an integer, got the string "http"`},
		{"unknown field", "prefix:\n  hard_load_factr: 2\n" + bk, "config: prefix.hard_load_factr: line 2: unknown field"},
		{"duplicate key", "prefix:\n  chunk_tokens: 1\n  chunk_tokens: 2\n" + bk, "config: prefix.chunk_tokens: line 3: already set at line 2"},
		{"several errors", "prefix:\n  hard_load_factor: abc\n  chunk_tokens: x\n" + bk, `config: prefix.hard_load_factor: line 2: want a number, got the string "abc" (and 1 more error)`},
		{"the whole file", "- a\n", "config: line 1: want a mapping, got a list"},
		{"long value", "mode: [" + strings.Repeat("x", 200) + "]\n" + bk, "config: mode: line 1: want a string, got a list"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml))
			if err == nil {
				t.Fatalf("Parse(%q) = nil, want %q", c.yaml, c.want)
			}
			got := err.Error()
			if !strings.HasPrefix(got, c.want) || strings.Contains(got, "\n") {
				t.Errorf("Parse(%q) =\n  %q\nwant one line starting\n  %q", c.yaml, got, c.want)
			}
		})
	}
}

// A value too long to quote whole is cut in the error.
func TestTypeErrorQuotesABoundedValue(t *testing.T) {
	_, err := Parse([]byte("prefix:\n  chunk_tokens: " + strings.Repeat("x", 500) + "\nbackends:\n - url: http://a:1\n"))
	if err == nil {
		t.Fatal("Parse: nil error, want prefix.chunk_tokens's")
	}
	if got := err.Error(); len(got) > 200 || !strings.Contains(got, "prefix.chunk_tokens: line 2: want an integer") {
		t.Errorf("error %q (%d bytes), want a bounded one naming prefix.chunk_tokens", got, len(got))
	}
}
