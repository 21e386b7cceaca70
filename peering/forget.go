// Forgets: a peer's Learn withdrawn because the backend refused the request.

package peering

import (
	"time"

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
	// maxRecentLearns bounds the groups remembered (64Ki, ≈ 5 MiB at ≈ 80 bytes a map entry):
	// 6500 routed requests per second over the fleet fill it within the window, and then the
	// window shortens.
	maxRecentLearns = 1 << 16
)

// learnKey names one learned group of one peer.
type learnKey struct {
	sender string
	id     uint64
	stamp  int64
}

// localStamps are the stamps the groups of one learned prompt got in this replica's index:
// one, or several when the sender split the prompt across packets.
type localStamps struct {
	first     index.Stamp
	more      []index.Stamp
	forgotten bool // a forget of the group arrived: its later parts are not recorded
}

// recentLearns remembers the peers' learned groups of the last forgetWindow in two
// generations: add and forget write the current one, started anew (the older dropped) every
// half window or half maxRecentLearns (rotate); forget and forgotten read both. Not safe for
// concurrent use (receive holds recvMu).
type recentLearns struct {
	cur, prev map[learnKey]localStamps
	started   time.Time
	// forgets counts the forgets written to the current and the previous generation, so
	// that forgotten, asked of every group received, looks nothing up while there were none
	// (the common case: a tenth of the receiving replica's CPU went to those lookups at 16 KB
	// bodies, bench overhead).
	forgets, prevForgets int
}

// rotate starts a new generation when the current one is half a window old or half full,
// in the dropped generation's map, cleared: a map made anew each time grew again entry by
// entry and was garbage (a busy replica rotates every few seconds, tens of thousands of
// entries each).
func (r *recentLearns) rotate(now time.Time) {
	if r.cur == nil || now.Sub(r.started) >= forgetWindow/2 || len(r.cur) >= maxRecentLearns/2 {
		next := r.prev
		if next == nil {
			next = make(map[learnKey]localStamps, len(r.cur))
		} else {
			clear(next)
		}
		r.prev, r.cur, r.started = r.cur, next, now
		r.prevForgets, r.forgets = r.forgets, 0
	}
}

// add records that sender's group stamped stamp on backend id got local in this index (0:
// not recorded, the backend gone or of no capacity), and reports whether it is the first part
// of that group seen within the window (a prompt split across packets comes in several).
func (r *recentLearns) add(sender string, id uint64, stamp int64, local index.Stamp, now time.Time) (first bool) {
	r.rotate(now)
	k := learnKey{sender, id, stamp}
	v, ok := r.cur[k]
	_, old := r.prev[k]
	switch {
	case !ok:
		v.first = local
	case local != 0:
		v.more = append(v.more, local)
	}
	r.cur[k] = v
	return !ok && !old
}

// forget returns the local stamps of sender's group stamped stamp on backend id (nil when it
// is unknown or older than the window), and marks the group forgotten, so that its parts
// still to come are not recorded (forgotten) and every part of a split forget finds the same
// stamps.
func (r *recentLearns) forget(sender string, id uint64, stamp int64, now time.Time) []index.Stamp {
	k := learnKey{sender, id, stamp}
	var out []index.Stamp
	for _, m := range []map[learnKey]localStamps{r.prev, r.cur} {
		if v, ok := m[k]; ok {
			if v.first != 0 {
				out = append(out, v.first)
			}
			out = append(out, v.more...)
		}
	}
	r.rotate(now)
	delete(r.prev, k)
	v := localStamps{forgotten: true}
	if len(out) > 0 {
		v.first, v.more = out[0], out[1:]
	}
	r.cur[k] = v
	r.forgets++
	return out
}

// forgotten reports whether a forget of sender's group stamped stamp on backend id arrived
// within the window: a part of it that arrives now is not recorded.
func (r *recentLearns) forgotten(sender string, id uint64, stamp int64) bool {
	if r.forgets+r.prevForgets == 0 {
		return false
	}
	k := learnKey{sender, id, stamp}
	return r.cur[k].forgotten || r.prev[k].forgotten
}
