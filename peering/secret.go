package peering

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
)

// ParseSecret returns the AES key in data, the content of a secret file or variable, tried
// in this order:
//
//  1. exactly 16, 24 or 32 bytes as they are: a raw binary key, which may begin or end with
//     bytes that look like white space (0x20, 0x0a);
//  2. with surrounding white space trimmed, 16, 24 or 32 bytes (a key typed as text, or a
//     file with a trailing newline);
//  3. trimmed, the standard base64 of a 32-byte key (as `openssl rand -base64 32` prints
//     it: 44 characters). The base64 of 16 or 24 bytes is 24 or 32 characters, which step
//     2 takes as a raw AES-192 or AES-256 key, as ParseSecret always did: every replica
//     reading the same secret agrees.
//
// A text key is used as its bytes: a 16-character password is an AES-128 key with far less
// than 128 bits of entropy, so generate keys (`openssl rand -base64 32`) rather than type
// them. The error gives the lengths, never the secret.
func ParseSecret(data []byte) ([]byte, error) {
	if validKeyLen(len(data)) {
		return data, nil
	}
	s := bytes.TrimSpace(data)
	if validKeyLen(len(s)) {
		return s, nil
	}
	if k, err := base64.StdEncoding.DecodeString(string(s)); err == nil && validKeyLen(len(k)) {
		return k, nil
	}
	return nil, fmt.Errorf("the secret is %d bytes (%d without surrounding white space), and not the base64 of a key; "+
		"want 16, 24 or 32 bytes, raw or base64 (openssl rand -base64 32)", len(data), len(s))
}

func validKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }

// secretHint is logged with a failed join or a refused packet that memberlist could not
// decrypt: most often a peer configured with another secret.
const secretHint = "a peer with another secret (or forged traffic): peering.secret_file or secret_env must hold the same key on every replica"

// secretMismatch reports whether err is memberlist's failure to decrypt what a peer sent.
func secretMismatch(err error) bool { return err != nil && undecryptable(err.Error()) }

// undecryptable reports whether memberlist's message says it could not decrypt a packet or
// stream (memberlist v0.7.0's words).
func undecryptable(msg string) bool {
	return strings.Contains(msg, "no installed keys could decrypt") || strings.HasPrefix(msg, "Decrypt packet failed")
}
