package peering

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
)

// TestParseSecret: raw binary keys are taken as they are, even when they begin or end with
// white-space bytes; text keys and base64 are trimmed; anything else is a clear error that
// never quotes the secret.
func TestParseSecret(t *testing.T) {
	bin := make([]byte, 32)
	for i := range bin {
		bin[i] = byte(0x80 + i)
	}
	endsNL := append(append([]byte(nil), bin[:31]...), '\n')
	startsSP := append([]byte{' '}, bin[1:]...)
	ws := append(append([]byte(" \t"), bin[:28]...), ' ', '\n') // 32 bytes, trims to 28
	b64 := base64.StdEncoding.EncodeToString(bin)
	for _, c := range []struct {
		name string
		in   []byte
		want []byte // nil: an error
	}{
		{"raw 32", bin, bin},
		{"raw 32 ending in 0x0a", endsNL, endsNL},
		{"raw 32 starting with 0x20", startsSP, startsSP},
		{"raw 32 with white-space bytes at both ends", ws, ws},
		{"raw 16", bin[:16], bin[:16]},
		{"raw 24", bin[:24], bin[:24]},
		{"text 16 and a newline", []byte("0123456789abcdef\n"), []byte("0123456789abcdef")},
		{"base64 32", []byte(b64), bin},
		{"base64 32 and a newline", []byte(b64 + "\n"), bin},
		// 24 characters are a raw AES-192 key first, as ParseSecret always took them.
		{"base64 of 16 is 24 raw bytes", []byte(base64.StdEncoding.EncodeToString(bin[:16]) + "\n"), []byte(base64.StdEncoding.EncodeToString(bin[:16]))},
		{"base64 of 24 is 32 raw bytes", []byte(base64.StdEncoding.EncodeToString(bin[:24])), []byte(base64.StdEncoding.EncodeToString(bin[:24]))},
		{"empty", nil, nil},
		{"short", []byte("short\n"), nil},
		{"33 bytes", append(append([]byte(nil), bin...), 'x'), nil},
		{"base64 of 20", []byte(base64.StdEncoding.EncodeToString(bin[:20])), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseSecret(c.in)
			if c.want == nil {
				if err == nil {
					t.Fatalf("accepted %d bytes", len(got))
				}
				if len(c.in) > 0 && strings.Contains(err.Error(), strings.TrimSpace(string(c.in))) {
					t.Fatalf("the error quotes the secret: %v", err)
				}
				if !strings.Contains(err.Error(), "want 16, 24 or 32 bytes") {
					t.Fatalf("unclear error: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.want) {
				t.Fatalf("key %x, want %x", got, c.want)
			}
		})
	}
}
