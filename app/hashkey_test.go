package app

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/flowcontrol"
)

// hash-key prints the SHA-256 of the key on stdin, the hash a rule matches; it refuses an
// argument (shell history), an empty or multi-line input, a whole Authorization value, and
// never echoes the key in an error.
func TestHashKeyCommand(t *testing.T) {
	const key = "sk-tenant-a-0123456789"
	for _, tc := range []struct {
		name, stdin string
		args        []string
		out, err    string
	}{
		{"a key and its newline", key + "\n", nil, flowcontrol.HashKey(key) + "\n", ""},
		{"CRLF and spaces trimmed", "  " + key + " \r\n", nil, flowcontrol.HashKey(key) + "\n", ""},
		{"the FIPS 180-2 vector", "abc", nil, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n", ""},
		{"an argument", "", []string{key}, "", "never from an argument (it would land in the shell history)"},
		{"nothing", "\n", nil, "", "no key on stdin"},
		{"two keys", key + "\n" + key + "\n", nil, "", "more than one line"},
		{"a header value", "Bearer " + key + "\n", nil, "", `starts with "Bearer "`},
		{"a key with a space", "sk a\n", nil, "", "holds a space"},
		{"a file", strings.Repeat("k", maxKeyBytes+1), nil, "", "over 65536 bytes"},
	} {
		c := HashKeyCommand()
		var out, errOut bytes.Buffer
		c.SetIn(strings.NewReader(tc.stdin))
		c.SetOut(&out)
		c.SetErr(&errOut)
		c.SetArgs(tc.args)
		c.SilenceUsage, c.SilenceErrors = true, true
		err := c.Execute()
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.err)
		case out.String() != tc.out:
			t.Errorf("%s: printed %q, want %q", tc.name, out.String(), tc.out)
		}
		if err != nil && strings.Contains(err.Error(), key) || strings.Contains(errOut.String(), key) {
			t.Errorf("%s: the key appears in the error or on stderr", tc.name)
		}
	}
}
