// Update packets on a path of their own beside memberlist's. memberlist keeps membership,
// failure detection and the join snapshots; the flusher's update packets, a few hundred to a
// thousand a second to each peer from a busy replica, no longer go through its
// SendBestEffort, which builds a new AES-GCM for every packet, nor through its receive path,
// which hands every packet from the transport's read loop to its packet listener and from
// there to its handler goroutine: two goroutine wake-ups a packet on the receiving replica,
// on top of the read. A direct packet is sealed here with a cipher made once, written to the
// peer's UDP port through the same transport, and opened and applied by the receiving
// transport's read loop itself (netTransport.readLoop, directPath).
//
// Format: directMagic, a 24-byte random nonce, then the update (wire.go) sealed with
// XChaCha20-Poly1305 (16-byte tag) under a key derived from the shared secret (HKDF-SHA256,
// info directKeyInfo), directMagic as additional data: 41 bytes over the update, within
// packetReserve. XChaCha20's 192-bit random nonces need no per-sender state and no bound on
// the packets one key seals (AES-GCM's 96-bit random nonces are good for 2^32 packets under
// one key, which a fleet of busy replicas sharing one secret sends in days). memberlist never
// starts a packet with directMagic (its first byte is an encryption version, 0 or 1, or its
// label marker, 244), so a replica that does not know this path (an older version during a
// rolling update) rejects these packets as undecryptable, and its own updates, sent through
// memberlist, are still received here (delegate.NotifyMsg). Like memberlist's packets, a
// direct packet has no sequence number: one captured on the network and sent again is
// applied again (an old Learn recorded as recent, an old load report until the sender's
// next, within a flush); the NetworkPolicy that admits only the replicas to the peer port is
// the defence, as it is for memberlist's.

package peering

import (
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/crypto/chacha20poly1305"
)

const (
	// directMagic is the first byte of a direct update packet.
	directMagic byte = 0xd7
	// directKeyInfo is HKDF's info for the direct packets' key: naming the use keeps the key
	// apart from memberlist's, which is the secret itself.
	directKeyInfo = "prefixlb peering direct updates v1"
	// directOverhead is what sealing adds to an update: the magic byte, nonce and tag.
	directOverhead = 1 + chacha20poly1305.NonceSizeX + chacha20poly1305.Overhead
)

// A direct packet's framing fits in what the packet budget leaves for memberlist's.
var _ [packetReserve - directOverhead]struct{}

// errDirectShort is what opening a packet too short to hold a nonce and tag returns.
var errDirectShort = errors.New("peering: direct packet too short")

// directCodec seals and opens direct update packets. It is safe for concurrent use.
type directCodec struct{ aead cipher.AEAD }

// newDirectCodec makes the codec of secret (16, 24 or 32 bytes; see ParseSecret).
func newDirectCodec(secret []byte) (*directCodec, error) {
	key, err := hkdf.Key(sha256.New, secret, nil, directKeyInfo, chacha20poly1305.KeySize)
	if err != nil {
		return nil, fmt.Errorf("peering: derive the update key: %w", err)
	}
	a, err := chacha20poly1305.NewX(key)
	if err != nil {
		return nil, fmt.Errorf("peering: update cipher: %w", err)
	}
	return &directCodec{aead: a}, nil
}

// seal returns the direct packet of msg, built in dst's storage (dst's contents are lost).
func (c *directCodec) seal(dst, msg []byte) []byte {
	dst = append(dst[:0], directMagic)
	dst = append(dst, make([]byte, chacha20poly1305.NonceSizeX)...)
	rand.Read(dst[1:]) // never fails (crypto/rand: it crashes the program instead)
	return c.aead.Seal(dst, dst[1:], msg, dst[:1])
}

// open returns the update sealed in packet p, built in dst's storage. Errors: p too short,
// or not sealed under this codec's key (another secret, forged or corrupted).
func (c *directCodec) open(dst, p []byte) ([]byte, error) {
	if len(p) < directOverhead || p[0] != directMagic {
		return nil, errDirectShort
	}
	nonce := p[1 : 1+chacha20poly1305.NonceSizeX]
	return c.aead.Open(dst[:0], nonce, p[1+chacha20poly1305.NonceSizeX:], p[:1])
}

// directHandler takes a direct packet p (its first byte directMagic) from the sender at
// from. p is the transport's scratch: valid only during the call.
type directHandler func(p []byte, from netip.AddrPort)

// directPath is a transport that hands direct packets to a handler rather than to
// memberlist (PacketCh): netTransport, and the transports wrapped around it, which pass the
// handler on. Until a handler is set, direct packets are dropped.
type directPath interface {
	SetDirect(h directHandler)
}

// receiveDirect opens and applies a direct packet. It runs on the transport's read loop, one
// packet at a time, so that directBuf is its own.
func (n *Node) receiveDirect(p []byte, from netip.AddrPort) {
	msg, err := n.codec.open(n.directBuf, p)
	if err != nil {
		// Counted in prefixlb_peer_packets_rejected_total and logged at most once a second,
		// as memberlist's own undecryptable packets are (levelWriter).
		fmt.Fprintf(n.mlog, "[ERR] memberlist: Decrypt packet failed: peering update: %v from=%s", err, from)
		return
	}
	n.directBuf = msg[:0]
	n.receive(msg)
}
