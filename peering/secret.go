package peering

import (
	"bytes"
	"encoding/base64"
	"fmt"
)

// ParseSecret returns the AES key in data, the content of a secret file or variable: 16, 24
// or 32 raw bytes, or their standard base64 (as `openssl rand -base64 32` prints it);
// surrounding white space is ignored. The error never quotes the secret.
func ParseSecret(data []byte) ([]byte, error) {
	s := bytes.TrimSpace(data)
	if validKeyLen(len(s)) {
		return s, nil
	}
	if k, err := base64.StdEncoding.DecodeString(string(s)); err == nil && validKeyLen(len(k)) {
		return k, nil
	}
	return nil, fmt.Errorf("the secret is %d bytes; want 16, 24 or 32 bytes, raw or base64 (openssl rand -base64 32)", len(s))
}

func validKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }
