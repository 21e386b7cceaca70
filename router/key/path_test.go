package key

import (
	"strings"
	"testing"
)

// Paths are classified as the backend reads them: percent-decoded (uvicorn unquotes the path
// before routing), so an encoded letter does not take a request out of prefix routing.
func TestClassifyDecodesPath(t *testing.T) {
	cases := []struct {
		path string
		want API
	}{
		{"/v1/chat/completions", APIChat},
		{"/v1/%63hat/completions", APIChat},
		{"/v1/%63%68%61%74/completions/", APIChat},
		{"%2Fv1%2fchat%2Fcompletions", APIChat},
		{"/v1/c%6Fmpletions", APICompletions},
		{"/v1/%6Dessages", APIMessages},
		{"/v1/r%65rank", APIModelOnly},
		{"/v1/%zzhat/completions", APINone},     // not an escape: kept, as uvicorn keeps it
		{"/v1/chat/completions%", APINone},      // a lone '%'
		{"/v1/chat/completions%2", APINone},     // a short escape
		{"/v1/chat/completions%2F%2F", APINone}, // two trailing slashes
		{"/v1/" + strings.Repeat("%63", 40), APINone},
		{"/v1/models", APINone},
	}
	for _, c := range cases {
		if got := APIOf([]byte(c.path)); got != c.want {
			t.Errorf("APIOf(%q) = %v, want %v", c.path, got, c.want)
		}
	}
	if !PathIs([]byte("/v1/%6Dodels"), "/v1/models") || PathIs([]byte("/v1/%6Dodels/"), "/v1/models") {
		t.Error("PathIs does not decode as classify does")
	}
	p := []byte("/v1/%63hat/completions")
	if n := testing.AllocsPerRun(100, func() { _ = APIOf(p); _ = PathIs(p, "/v1/models") }); n != 0 {
		t.Errorf("classifying an encoded path allocates %v times", n)
	}
}

// A routed body the key cannot read keeps its top-level model (so its model pool): too deep
// for fastjson, invalid UTF-8, a prompt of the wrong type, broken after the model.
func TestFallbackKeepsModel(t *testing.T) {
	deep := `{"model":"qwen","messages":[{"role":"user","content":"hi"}],"tools":[` +
		strings.Repeat(`{"p":`, 400) + `1` + strings.Repeat(`}`, 400) + `]}`
	cases := []struct {
		name, path, body, model string
	}{
		{"nested past fastjson's depth", "/v1/chat/completions", deep, "qwen"},
		{"invalid UTF-8 in a message", "/v1/chat/completions", "{\"model\":\"qwen\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "qwen"},
		{"invalid JSON after the model", "/v1/chat/completions", `{"model":"qwen","messages":[{"role":"user","content":"hi"}`, "qwen"},
		{"model after a nested value with braces in strings", "/v1/completions", `{"prompt":{"a":"}{][\"","b":[1,{}]},"model":"q\u0077en","x":}`, "qwen"},
		{"the last duplicate wins", "/v1/chat/completions", `{"model":"a","model":"qwen","messages":7}`, "qwen"},
		{"model not a string", "/v1/chat/completions", `{"model":7,"messages":[`, ""},
		{"model with invalid UTF-8", "/v1/chat/completions", "{\"model\":\"q\xffen\",\"messages\":[", ""},
		{"not an object", "/v1/chat/completions", `["model","qwen"]`, ""},
		{"nested model only", "/v1/chat/completions", `{"x":{"model":"qwen"},"messages":[`, ""},
	}
	b := NewBuilder(0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var k Key
			b.Build([]byte(c.path), []byte(c.body), &k)
			if !k.Routed || k.OK {
				t.Fatalf("Routed %v OK %v, want a routed parse fallback", k.Routed, k.OK)
			}
			if string(k.Model) != c.model {
				t.Errorf("model %q, want %q", k.Model, c.model)
			}
		})
	}
}
