// Update packets on a path of their own beside memberlist's. memberlist keeps membership,
// failure detection and the join snapshots; the flusher's update packets, a few hundred to a
// thousand a second to each peer from a busy replica, do not go through its SendBestEffort,
// which sets AES-GCM up anew for every packet, nor through its receive path, which hands
// every packet from the transport's read loop to its packet listener and from there to its
// handler goroutine. A direct packet is sealed here, written to the peer's UDP port through
// the same transport, and opened and applied by the receiving transport's read loop itself
// (netTransport.readLoop, directPath): no goroutine hand-off, whose wake-up per packet costs
// more CPU than the apply (bench overhead, prefixlb-prefix-peer). Inline, a packet (about 160
// chunk hashes) applies in tens of microseconds, so that even a full 2 MiB socket buffer
// (about 1,500 packets) drains well within memberlist's 100 ms probe timeout. A fleet whose
// updates outran one core's applying (tens of busy replicas) would lose memberlist's packets
// with the updates the kernel drops; a shard lock held by a join snapshot's export
// (milliseconds) delays them by as much. Peers learn who takes direct packets from the
// member metadata (NodeMeta, metaDirect): an older replica, during a rolling update, is sent
// its updates through memberlist, and its own, sent that way, are received here
// (delegate.NotifyMsg).
//
// Format: directMagic, a 24-byte random nonce, then the update (wire.go) sealed with
// XChaCha20-Poly1305 (16-byte tag) under a key derived from the shared secret (HKDF-SHA256,
// info directKeyInfo), directMagic as additional data: 41 bytes over the update, within
// packetReserve. XChaCha20's 192-bit random nonces need no per-sender state and no bound on
// the packets one key seals (AES-GCM's 96-bit random nonces are good for 2^32 packets under
// one key, which a fleet of busy replicas sharing one secret sends in days). memberlist never
// starts a packet with directMagic (its first byte is an encryption version, 0 or 1, its
// label marker, 244, or a message type under 20). Like memberlist's packets, a direct packet
// has no sequence number: one captured on the network and sent again is applied again, as
// often as it is sent: its Learns recorded as recent (after the forget window, counted again
// as decisions in the backends' recent share and the arrivals settling reads), its load
// report counted for loadTTL (also one of a replica that has left since). The NetworkPolicy
// that admits only the replicas to the peer port is the defence, as it is for memberlist's.

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
	// maxDirectPacket is the longest direct packet taken: udpBufferSize, which the flusher's
	// (packetBudget + directOverhead) is within. Longer ones are refused before opening.
	maxDirectPacket = udpBufferSize
	// metaDirect is the bit of a member's metadata (its first byte) that says it takes
	// direct packets.
	metaDirect byte = 1
	// metaLeaving is the bit a closing replica sets before it leaves, so that its peers log
	// its departure as one (Node.setMember).
	metaLeaving byte = 2
	// metaNotices is the bit that says a member takes leaving notices (kindLeaving); a
	// replica of an older version, without it, is not sent one.
	metaNotices byte = 4
)

// A direct packet's framing fits in what the packet budget leaves for memberlist's.
var _ [packetReserve - directOverhead]struct{}

// errDirectFraming is what opening a packet that is not a direct packet's length and first
// byte returns.
var errDirectFraming = errors.New("peering: not a direct packet (length or first byte)")

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

// open returns the update sealed in packet p, built in dst's storage. Errors: p shorter
// than the framing, longer than maxDirectPacket or not starting with directMagic
// (errDirectFraming), or not sealed under this codec's key (another secret, forged or
// corrupted).
func (c *directCodec) open(dst, p []byte) ([]byte, error) {
	if len(p) < directOverhead || len(p) > maxDirectPacket || p[0] != directMagic {
		return nil, errDirectFraming
	}
	nonce := p[1 : 1+chacha20poly1305.NonceSizeX]
	return c.aead.Open(dst[:0], nonce, p[1+chacha20poly1305.NonceSizeX:], p[:1])
}

// directHandler takes a direct packet p (its first byte directMagic) from the sender at
// from. p is the transport's scratch: valid only during the call.
type directHandler func(p []byte, from netip.AddrPort)

// directPath is a transport that hands direct packets to a handler rather than to
// memberlist (PacketCh): netTransport, and the transports wrapped around it, which pass the
// handler on. SetDirect reports whether the packets will reach h (false: a wrapper around a
// transport without the path). Until a handler is set, direct packets are refused.
type directPath interface {
	SetDirect(h directHandler) bool
}

// takesDirect reports whether a member's metadata (memberlist.Node.Meta) says it takes
// direct packets.
func takesDirect(meta []byte) bool { return len(meta) > 0 && meta[0]&metaDirect != 0 }

// takesNotices reports whether a member's metadata says it takes leaving notices.
func takesNotices(meta []byte) bool { return len(meta) > 0 && meta[0]&metaNotices != 0 }

// leavingMeta reports whether a member's metadata says it is leaving.
func leavingMeta(meta []byte) bool { return len(meta) > 0 && meta[0]&metaLeaving != 0 }

// receiveDirect opens a direct packet and applies its update. It runs on the transport's
// read loop, one packet at a time, so that directBuf is its own.
func (n *Node) receiveDirect(p []byte, from netip.AddrPort) {
	msg, err := n.codec.open(n.directBuf, p)
	if err != nil {
		// Counted in prefixlb_peer_packets_rejected_total and logged at most once a second
		// per kind: malformed (framing) apart from not authentic (the seal).
		what := "Update packet not authentic (another secret, forged or corrupted)"
		if errors.Is(err, errDirectFraming) {
			what = "Update packet malformed (length or first byte)"
		}
		n.mlog.emit("peering: rejected update packet", what+" from="+from.String(), true, true)
		return
	}
	n.directBuf = msg[:0]
	n.receive(msg)
}
