package peering

import (
	"bytes"
	"testing"
)

// TestDirectCodec: a sealed update opens to itself under the same secret, and a packet
// sealed under another secret, altered anywhere, cut short or not marked as direct does
// not open.
func TestDirectCodec(t *testing.T) {
	secret := bytes.Repeat([]byte{7}, 32)
	c, err := newDirectCodec(secret)
	if err != nil {
		t.Fatal(err)
	}
	other, err := newDirectCodec(bytes.Repeat([]byte{8}, 32))
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("an update: version, kind, sender, groups")
	p := c.seal(nil, msg)
	if len(p) != len(msg)+directOverhead || p[0] != directMagic {
		t.Fatalf("sealed %d bytes starting %#x; want %d starting %#x", len(p), p[0], len(msg)+directOverhead, directMagic)
	}
	if got, err := c.open(nil, p); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("open = %q, %v; want the message", got, err)
	}
	if q := c.seal(nil, msg); bytes.Equal(p[1:], q[1:]) {
		t.Fatal("two seals of one message are alike: the nonce is not drawn per packet")
	}
	flip := func(i int) []byte {
		q := bytes.Clone(p)
		q[i] ^= 1
		return q
	}
	for _, bad := range []struct {
		name string
		p    []byte
		c    *directCodec
	}{
		{"another secret", p, other},
		{"magic altered", flip(0), c},
		{"nonce altered", flip(1), c},
		{"ciphertext altered", flip(directOverhead), c},
		{"tag altered", flip(len(p) - 1), c},
		{"cut short", p[:len(p)-1], c},
		{"shorter than the framing", p[:directOverhead-1], c},
		{"empty", nil, c},
	} {
		if got, err := bad.c.open(nil, bad.p); err == nil {
			t.Errorf("%s: opened to %q", bad.name, got)
		}
	}
	// The magic byte is bound to the seal (additional data), not only checked.
	if _, err := c.aead.Open(nil, p[1:1+24], p[1+24:], []byte{directMagic ^ 1}); err == nil {
		t.Error("opened with other additional data")
	}
	if _, err := c.open(nil, make([]byte, maxDirectPacket+1)); err == nil {
		t.Error("opened a packet longer than maxDirectPacket")
	}
	// Buffers reused as the flusher and the read loop reuse them: each round trip is exact.
	var sealed, opened []byte
	for i := range 50 {
		m := bytes.Repeat([]byte{byte(i)}, i*27)
		sealed = c.seal(sealed, m)
		got, err := c.open(opened, sealed)
		if err != nil || !bytes.Equal(got, m) {
			t.Fatalf("round %d: open = %d bytes, %v; want the %d sealed", i, len(got), err, len(m))
		}
		opened = got[:0]
	}
	// 16- and 24-byte secrets derive keys too, each its own.
	for _, n := range []int{16, 24} {
		k, err := newDirectCodec(bytes.Repeat([]byte{7}, n))
		if err != nil {
			t.Fatalf("%d-byte secret: %v", n, err)
		}
		if _, err := k.open(nil, p); err == nil {
			t.Fatalf("a %d-byte secret opened a 32-byte secret's packet", n)
		}
	}
}
