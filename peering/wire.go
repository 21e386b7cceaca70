// The wire format of peer messages: compact, fixed-layout, encoding/binary only.

package peering

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// wireVersion is the first byte of every message; a receiver drops other versions (and
// counts them in prefixlb_peer_messages_invalid_total). 2: each learned group carries its
// decision's prefill work, and the chunk hashes are key format v5's (router/key's
// seedDomain). 3: a learned group's work carries its decision's class (held to settle, and
// for a match or not: settle.go's rank). During a rolling upgrade from an older
// version the versions ignore each other, each routing on what it learned itself, until the
// last old replica is gone.
const wireVersion = 3

// Message kinds (the second byte).
const (
	// kindUpdate is a flusher batch, sent to every live peer by UDP:
	//
	//	version kind  uvarint(len(sender)) sender
	//	uvarint(loads) { id:u64 in_flight:uvarint prefill_tokens:uvarint }…
	//	{ id:u64 stamp:i64 uvarint(4×work+class) uvarint(n) hash:u64 × n }…   (to the end: learned prompts;
	//	  a forget, stamp < 0, has no work: { id:u64 stamp:i64 uvarint(n) hash:u64 × n })
	//
	// integers little-endian; stamp unix nanoseconds; a learned group is one routed request's
	// chained chunk hashes (or a part of them, see minGroupHashes) on backend id, with n 0
	// for a prompt the backend held whole; work is the decision's prefill work in tokens
	// (router.Prefix.RoutedWork), which the receiver counts once per group in the backend's
	// recent share (router.Prefix.NotePeerRouted; the parts of a split one repeat it and
	// count once). A request held to settle (settle.go) sends its decision as an empty group
	// with its stamp, work and class (1: held for a match, 2: held and placed by load; 0 for
	// a decision sent at once), and, if it keeps the backend, its hashes later in a group of
	// the same stamp with work 0, which counts as no decision (work is otherwise ≥ 1); a
	// class past 2 reads as 0. A group whose stamp is negative is a forget: backend id
	// refused the request of the group stamped ^stamp that this sender sent before, whose
	// hashes it repeats (forget.go).
	kindUpdate = 1
	// kindSnapshot is a push/pull join state (LocalState) of a replica before kindAgedSnapshot:
	//
	//	version kind { id:u64 uvarint(n) hash:u64 × n }…   (hashes most recently used first)
	//
	// It is still taken (index.Import: every entry as of its arrival) but no longer sent.
	kindSnapshot = 2
	// kindSamples carries prefill observations the sender made itself (backend.PrefillSample,
	// Lease.FirstByte), sent to every live peer by UDP, so that each replica learns a
	// backend's prefill model from every request the fleet sent there:
	//
	//	version kind uvarint(n) { id:u64 work:uvarint ttft_ns:uvarint }…
	//
	// A replica of an older version counts it as an invalid message and drops it.
	kindSamples = 3
	// kindLeaving is a closing replica's notice to each live peer, sent before it leaves
	// memberlist, so that the peers log its departure as one, not as a loss (Node.Close):
	//
	//	version kind uvarint(len(sender)) sender
	//
	// A replica of an older version counts it as an invalid message and drops it.
	kindLeaving = 4
	// kindAgedSnapshot is a push/pull join state (LocalState) with each entry's age, so that
	// the receiver places the entries among its own by age (index.Merge) rather than ahead
	// of them all (a healed partition's exchange would otherwise swap two replicas' indexes):
	//
	//	version kind uvarint(len(sender)) sender { id:u64 uvarint(n) hash:u64 × n uvarint(Δage) × n }…
	//
	// The sender's name tells a replica its own snapshot, come back over a join to itself
	// (a join target naming it in a spelling isSelf missed), from a peer's, however alike
	// their indexes (two empty ones are byte for byte the same otherwise). Hashes most
	// recently used first; an entry's age is the sum of the Δages up to it, in
	// microseconds before the snapshot was taken (non-decreasing, so each Δ is ≥ 0, mostly a
	// byte or two), read against the receiver's own clock: the two clocks need not agree. A
	// replica of an older version refuses it (an invalid snapshot, logged), as a replica of
	// this one takes an older one's kindSnapshot.
	kindAgedSnapshot = 5
)

// maxAgeMicros caps an entry's age in a snapshot (about 12.7 days): an older one reads as
// that old.
const maxAgeMicros = 1 << 40

// hashBytes is the size of one chunk hash on the wire (fixed: the hashes are uniformly
// random, a varint would take 9–10 bytes).
const hashBytes = 8

// groupOverhead is the most bytes a learned group takes besides its hashes: the backend id,
// the stamp, the work and the count.
const groupOverhead = 8 + 8 + 2*binary.MaxVarintLen64

// recordBytes is the most bytes one record of a load section or a samples message takes: a
// backend id and two counts (appendRecord); recordMinBytes the least.
const (
	recordBytes    = 8 + 2*binary.MaxVarintLen64
	recordMinBytes = 8 + 2
)

// peerLoad is one backend's load as one replica reports it.
type peerLoad struct {
	id       uint64
	inFlight int64
	prefill  int64
}

// hasSender reports whether a message of kind names its sender after the kind.
func hasSender(kind byte) bool {
	return kind == kindUpdate || kind == kindLeaving || kind == kindAgedSnapshot
}

// appendHeader starts a message of kind from sender.
func appendHeader(dst []byte, kind byte, sender string) []byte {
	dst = append(dst, wireVersion, kind)
	if hasSender(kind) {
		dst = binary.AppendUvarint(dst, uint64(len(sender)))
		dst = append(dst, sender...)
	}
	return dst
}

// appendLoads writes the load section of an update.
func appendLoads(dst []byte, ls []peerLoad) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ls)))
	for _, l := range ls {
		dst = appendRecord(dst, l.id, l.inFlight, l.prefill)
	}
	return dst
}

// appendRecord writes one record: id as 8 bytes, then a and b (negative: 0) as uvarints.
func appendRecord(dst []byte, id uint64, a, b int64) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, id)
	dst = binary.AppendUvarint(dst, uint64(max(a, 0)))
	return binary.AppendUvarint(dst, uint64(max(b, 0)))
}

// appendGroup writes one learned group of an update (stamp ≥ 0, work its decision's prefill
// work, negative: 0, at most maxCount; c its class, see kindUpdate) or, with stamp < 0, one
// backend's part of a snapshot (work and class not written).
func appendGroup(dst []byte, id uint64, stamp, work int64, c class, hashes []uint64) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, id)
	if stamp >= 0 {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(stamp))
		dst = binary.AppendUvarint(dst, uint64(min(max(work, 0), maxCount))<<classBits|uint64(c&classMask))
	}
	dst = binary.AppendUvarint(dst, uint64(len(hashes)))
	for _, h := range hashes {
		dst = binary.LittleEndian.AppendUint64(dst, h)
	}
	return dst
}

// appendForget writes the forget of the learned group stamped stamp (≥ 0) on backend id.
func appendForget(dst []byte, id uint64, stamp int64, hashes []uint64) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, id)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(^stamp))
	dst = binary.AppendUvarint(dst, uint64(len(hashes)))
	for _, h := range hashes {
		dst = binary.LittleEndian.AppendUint64(dst, h)
	}
	return dst
}

// peerSample is one prefill observation on backend id: work tokens, ttft nanoseconds.
type peerSample struct {
	id   uint64
	work int64
	ttft int64
}

// wireBytes is the bytes x takes in a samples message (appendRecord): recordMinBytes to
// recordBytes.
func (x peerSample) wireBytes() int {
	return 8 + uvarintLen(uint64(max(x.work, 0))) + uvarintLen(uint64(max(x.ttft, 0)))
}

// uvarintLen is the bytes binary.AppendUvarint writes for v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// appendSamples writes a samples message.
func appendSamples(dst []byte, ss []peerSample) []byte {
	dst = appendHeader(dst, kindSamples, "")
	dst = binary.AppendUvarint(dst, uint64(len(ss)))
	for _, x := range ss {
		dst = appendRecord(dst, x.id, x.work, x.ttft)
	}
	return dst
}

// decodeSamples decodes a samples message into *ss (reused).
func decodeSamples(buf []byte, ss *[]peerSample) error {
	r := reader{buf: buf}
	r.header(kindSamples)
	*ss = (*ss)[:0]
	for n := r.records(); n > 0 && r.err == nil; n-- {
		id, work, ttft := r.record()
		if r.err == nil {
			*ss = append(*ss, peerSample{id: id, work: work, ttft: ttft})
		}
	}
	return r.err
}

var errShort = errors.New("truncated message")

// reader decodes a message; the first error sticks.
type reader struct {
	buf []byte
	err error
}

func (r *reader) u64() uint64 {
	if r.err != nil || len(r.buf) < 8 {
		r.err = errShort
		return 0
	}
	v := binary.LittleEndian.Uint64(r.buf)
	r.buf = r.buf[8:]
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

// records reads the count of the records that follow; more than the rest could hold is an
// error.
func (r *reader) records() uint64 {
	n := r.uvarint()
	if r.err == nil && uint64(len(r.buf))/recordMinBytes < n {
		r.err = errShort
	}
	return n
}

// maxCount bounds a count read off the wire (in-flight requests, queued prefill tokens, a
// decision's prefill work): 2^40, past any real one (a 10M-token prompt's work is ~1.5e9),
// so that sums over peers and over the arrivals ring (settle.go: 1024 × 10 × 2^40 < 2^54)
// cannot wrap, and a value over 2^63 does not turn negative. Peers are authenticated; this
// guards against a buggy one.
const maxCount = 1 << 40

// count reads a uvarint count, at most maxCount.
func (r *reader) count() int64 {
	return int64(min(r.uvarint(), maxCount))
}

// record reads one record (appendRecord).
func (r *reader) record() (id uint64, a, b int64) {
	id = r.u64()
	return id, r.count(), r.count()
}

// hashes decodes n hashes into dst (reused) and returns it.
func (r *reader) hashes(dst []uint64) []uint64 {
	n := r.uvarint()
	if r.err != nil || uint64(len(r.buf))/hashBytes < n {
		r.err = errShort
		return dst[:0]
	}
	dst = dst[:0]
	for i := uint64(0); i < n; i++ {
		dst = append(dst, binary.LittleEndian.Uint64(r.buf[i*hashBytes:]))
	}
	r.buf = r.buf[n*hashBytes:]
	return dst
}

// header checks the version and kind and returns the sender (updates, leaving notices and
// aged snapshots).
func (r *reader) header(kind byte) string {
	if len(r.buf) < 2 {
		r.err = errShort
		return ""
	}
	if r.buf[0] != wireVersion || r.buf[1] != kind {
		r.err = fmt.Errorf("version %d kind %d, want version %d kind %d", r.buf[0], r.buf[1], wireVersion, kind)
		return ""
	}
	r.buf = r.buf[2:]
	if !hasSender(kind) {
		return ""
	}
	n := r.uvarint()
	if r.err == nil && n > maxNameBytes {
		// No replica sends a longer one (New refuses it); every update's sender is kept, as
		// the key of its recent learns and loads, so a longer one is not taken.
		r.err = fmt.Errorf("a sender name of %d bytes, over %d", n, maxNameBytes)
		return ""
	}
	if r.err != nil || uint64(len(r.buf)) < n {
		r.err = errShort
		return ""
	}
	s := string(r.buf[:n])
	r.buf = r.buf[n:]
	return s
}

// group is one learned group of an update as decoded (kindUpdate): on backend id, stamped
// stamp, with its decision's prefill work and class; or, forget set, the withdrawal of the
// learned group stamped stamp (work 0, classSent).
type group struct {
	id     uint64
	stamp  int64
	work   int64
	class  class
	forget bool
}

// classBits are the low bits of a learned group's work field that carry its class.
const (
	classBits = 2
	classMask = 1<<classBits - 1
)

// decodeUpdate calls onLoads with the sender and its loads, then onGroup for each learned
// group or forget of one; *ls and *hs are scratch, reused across calls (what the callbacks
// get is valid only during the call). It returns the first decoding error; what was
// delivered before it stands.
func decodeUpdate(buf []byte, ls *[]peerLoad, hs *[]uint64, onLoads func(sender string, ls []peerLoad), onGroup func(g group, hashes []uint64)) error {
	r := reader{buf: buf}
	sender := r.header(kindUpdate)
	*ls = (*ls)[:0]
	for n := r.records(); n > 0 && r.err == nil; n-- {
		id, inFlight, prefill := r.record()
		*ls = append(*ls, peerLoad{id: id, inFlight: inFlight, prefill: prefill})
	}
	if r.err != nil {
		return r.err
	}
	onLoads(sender, *ls)
	for len(r.buf) > 0 {
		g := group{id: r.u64(), stamp: int64(r.u64())}
		if g.stamp >= 0 {
			v := r.uvarint()
			g.work, g.class = int64(min(v>>classBits, maxCount)), class(v&classMask)
			if g.class >= numClasses {
				g.class = classSent
			}
		} else {
			g.stamp, g.forget = ^g.stamp, true
		}
		*hs = r.hashes(*hs)
		if r.err != nil {
			return r.err
		}
		onGroup(g, *hs)
	}
	return nil
}

// appendAgedGroup writes one backend's part of a kindAgedSnapshot: hashes, most recently used
// first, and used[i], when hashes[i] was last used (unix nanoseconds), as ages before taken.
func appendAgedGroup(dst []byte, id uint64, hashes []uint64, used []int64, taken int64) []byte {
	dst = appendGroup(dst, id, -1, 0, classSent, hashes)
	var last int64
	for _, u := range used {
		age := min(max((taken-u)/int64(time.Microsecond), last), maxAgeMicros)
		dst = binary.AppendUvarint(dst, uint64(age-last))
		last = age
	}
	return dst
}

// decodeSnapshot calls onGroup for each backend's part of a snapshot, kindAgedSnapshot or
// an older replica's kindSnapshot (ages nil), once take said yes to its sender ("" for an
// older replica's): hashes most recently used first, ages[i] how long before the snapshot
// was taken hashes[i] was last used. Both slices are reused.
func decodeSnapshot(buf []byte, take func(sender string) bool, onGroup func(id uint64, hashes []uint64, ages []time.Duration)) error {
	kind := byte(kindAgedSnapshot)
	if len(buf) >= 2 && buf[1] == kindSnapshot {
		kind = kindSnapshot
	}
	r := reader{buf: buf}
	if sender := r.header(kind); r.err != nil || !take(sender) {
		return r.err
	}
	var hs []uint64
	var ages []time.Duration
	for r.err == nil && len(r.buf) > 0 {
		id := r.u64()
		hs = r.hashes(hs)
		if r.err != nil {
			break
		}
		if kind == kindSnapshot {
			onGroup(id, hs, nil)
			continue
		}
		if len(r.buf) < len(hs) { // a Δage is at least a byte
			r.err = errShort
			break
		}
		ages = ages[:0]
		var age uint64
		for range hs {
			age = min(age+min(r.uvarint(), maxAgeMicros), maxAgeMicros)
			ages = append(ages, time.Duration(age)*time.Microsecond)
		}
		if r.err == nil {
			onGroup(id, hs, ages)
		}
	}
	return r.err
}

// decodeLeaving returns the sender of a leaving notice (kindLeaving). Errors: another version
// or kind, a short sender, or bytes after it.
func decodeLeaving(buf []byte) (string, error) {
	r := reader{buf: buf}
	sender := r.header(kindLeaving)
	if r.err == nil && len(r.buf) > 0 {
		r.err = fmt.Errorf("%d bytes after a leaving notice", len(r.buf))
	}
	return sender, r.err
}
