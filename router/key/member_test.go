package key

import "testing"

func TestTopLevelInt(t *testing.T) {
	for _, tc := range []struct {
		body string
		n    int64
		ok   bool
	}{
		{`{"model":"m","max_tokens":512,"messages":[]}`, 512, true},
		{`{"messages":[{"role":"user","content":"{\"max_tokens\": 9}"}],"max_completion_tokens":64}`, 64, true},
		{`{"messages":[{"max_tokens":9}]}`, 0, false},
		{`{"max_tokens":null}`, 0, false},
		{`{"max_tokens":-3}`, 0, false},
		{`{"max_tokens":1.5}`, 0, false},
		{`not json`, 0, false},
	} {
		n, ok := TopLevelInt([]byte(tc.body), "max_tokens", "max_completion_tokens", "max_output_tokens")
		if n != tc.n || ok != tc.ok {
			t.Errorf("%s: %d %v, want %d %v", tc.body, n, ok, tc.n, tc.ok)
		}
	}
}
