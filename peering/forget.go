// Forgets: a peer's Learn withdrawn because the backend refused the request.

package peering

import (
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prefixlb/prefixlb/internal/splitmix"
	"github.com/prefixlb/prefixlb/router/index"
)

// Why forgets are propagated: the proxy Learns a prompt as soon as the request is on its way
// to the backend (a request held to settle, before it is held) and Unlearns it when the
// backend refuses it (a 400 for a prompt over the context, a 429 or 503 retried elsewhere)
// or never answers. Without a forget the peers would keep the entry, route the
// conversation's next turn to a backend that does not hold it (a cold prefill) until usage
// reports correct it or it ages out, and count the backend as holding the prompt as well as
// the one that took the retry. A forget costs nothing on the
// common path: a Learn withdrawn before the next flush (within FlushInterval) is just dropped
// from the queue; one already sent is followed by a forget group repeating its hashes.
//
// A peer's index records a learned group under its own stamp (index.Record's, not the
// sender's), which index.Forget needs: so each replica remembers, per peer, backend and
// sender stamp, the local stamps of the groups received within the last forgetWindow, at most
// maxRecentLearns of them. A forget of an older group is ignored: the entry then stays until
// usage reports correct it or it ages out, as without forgets. A forget repeats the group's
// hashes and may be split across packets as the group was, and UDP orders neither: every part
// of a forget withdraws its hashes under all the stamps the group's parts got, and a part of
// the group that arrives after its forget is not recorded.

const (
	// forgetWindow is how long a peer's learned group can still be withdrawn: 10 s. Unlearn
	// comes before the response's first byte: refusals and connect errors within
	// milliseconds; a backend that answers nothing for longer is a rare case left to usage
	// corrections.
	forgetWindow = 10 * time.Second
	// maxRecentLearns bounds the groups remembered (64Ki, ≈ 1.5 MiB at ≈ 20 bytes a map
	// entry, groupKey): 6500 routed requests per second over the fleet fill it within the
	// window, and then the window shortens.
	maxRecentLearns = 1 << 16
)

// groupKey names one learned group of one peer: a 64-bit digest of the sender's name, the
// backend ID and the sender's stamp. Two groups of one sender and backend never share a key
// (the finaliser is a bijection); others do with odds of about 2^-64 a pair on average, as
// two prompts share a chunk hash, and a collision costs little (a part not recorded, a
// decision not counted, or a Forget under another group's local stamps). A Go map keyed by
// it is a sixth the size of one keyed by the three (16 bytes a slot against 72 with the
// stamps), so that a busy replica's tens of thousands of recent groups mostly stay in the
// core's cache: add runs on every group received (bench overhead, prefixlb-prefix-peer).
func groupKey(sender string, id uint64, stamp int64) uint64 {
	return splitmix.Mix(splitmix.Mix(xxhash.Sum64String(sender)^id) ^ uint64(stamp))
}

// generation is the groups received in one part of the window: first holds each group's
// local stamp of its first part (0: not recorded), rare what only a split or forgotten group
// has, the stamps of its later parts and the forget's mark.
type generation struct {
	first   map[uint64]index.Stamp
	rare    map[uint64]rareParts
	forgets int // forgets written to this generation
}

// rareParts is what a group has past its first part's stamp.
type rareParts struct {
	more      []index.Stamp
	forgotten bool // a forget of the group arrived: its later parts are not recorded
}

// stamps returns the local stamps g holds for key k, appended to out, and whether g knows k.
func (g *generation) stamps(k uint64, out []index.Stamp) ([]index.Stamp, bool) {
	f, ok := g.first[k]
	if !ok {
		return out, false
	}
	if f != 0 {
		out = append(out, f)
	}
	return append(out, g.rare[k].more...), true
}

// recentLearns remembers the peers' learned groups of the last forgetWindow in two
// generations: add and forget write the current one, started anew (the older dropped) every
// half window or half maxRecentLearns (rotate); forget and forgotten read both. Not safe for
// concurrent use (receive holds recvMu).
type recentLearns struct {
	cur, prev generation
	started   time.Time
}

// rotate starts a new generation when the current one is half a window old or half full,
// in the dropped generation's maps, cleared: a map made anew each time grew again entry by
// entry and was garbage (a busy replica rotates every few seconds, tens of thousands of
// entries each).
func (r *recentLearns) rotate(now time.Time) {
	if r.cur.first == nil || now.Sub(r.started) >= forgetWindow/2 || len(r.cur.first) >= maxRecentLearns/2 {
		next := r.prev
		if next.first == nil {
			next = generation{first: make(map[uint64]index.Stamp, len(r.cur.first)), rare: make(map[uint64]rareParts)}
		} else {
			clear(next.first)
			clear(next.rare)
			next.forgets = 0
		}
		r.prev, r.cur, r.started = r.cur, next, now
	}
}

// add records that sender's group stamped stamp on backend id got local in this index (0:
// not recorded, the backend gone or of no capacity), and reports whether it is the first part
// of that group seen within the window (a prompt split across packets comes in several).
func (r *recentLearns) add(sender string, id uint64, stamp int64, local index.Stamp, now time.Time) (first bool) {
	r.rotate(now)
	k := groupKey(sender, id, stamp)
	if _, ok := r.cur.first[k]; ok {
		if local != 0 {
			rp := r.cur.rare[k]
			rp.more = append(rp.more, local)
			r.cur.rare[k] = rp
		}
		return false
	}
	r.cur.first[k] = local
	_, old := r.prev.first[k]
	return !old
}

// forget returns the local stamps of sender's group stamped stamp on backend id (nil when it
// is unknown or older than the window), and marks the group forgotten, so that its parts
// still to come are not recorded (forgotten) and every part of a split forget finds the same
// stamps.
func (r *recentLearns) forget(sender string, id uint64, stamp int64, now time.Time) []index.Stamp {
	k := groupKey(sender, id, stamp)
	var out []index.Stamp
	out, _ = r.prev.stamps(k, out)
	out, _ = r.cur.stamps(k, out)
	r.rotate(now)
	delete(r.prev.first, k)
	delete(r.prev.rare, k)
	rp := rareParts{forgotten: true}
	var first index.Stamp
	if len(out) > 0 {
		first, rp.more = out[0], out[1:]
	}
	r.cur.first[k] = first
	r.cur.rare[k] = rp
	r.cur.forgets++
	return out
}

// forgotten reports whether a forget of sender's group stamped stamp on backend id arrived
// within the window: a part of it that arrives now is not recorded.
func (r *recentLearns) forgotten(sender string, id uint64, stamp int64) bool {
	if r.cur.forgets+r.prev.forgets == 0 {
		return false
	}
	k := groupKey(sender, id, stamp)
	return r.cur.rare[k].forgotten || r.prev.rare[k].forgotten
}
