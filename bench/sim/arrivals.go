package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// fingerprintTail is how many of a prompt's last tokens its Fingerprint hashes (with its
// length, chain seed and max_tokens): a request's tail is what makes it unique (the new user
// message, tool result or question after a shared prefix), and hashing only the tail keeps
// the replica's cost per request constant (hashing all of a 100k-token prompt is ≈0.2 ms, see
// BenchmarkBlockChain100k).
const fingerprintTail = 256

// arrivalLog is how many recent arrivals a replica remembers for ArrivalsSince: far more than
// one replica adds in the oracle's pending window (one second; the suite's busiest cell adds
// under 100 requests a second to a replica).
const arrivalLog = 4096

// Fingerprint identifies a request (the sim's token ids, ChainSeed seed, max_tokens) among
// the requests a replica receives, so a router can tell which of those it routed have
// arrived. Two requests with the same seed, max_tokens, prompt length and last
// fingerprintTail tokens share a fingerprint (in practice: the same request body).
func Fingerprint(prompt []uint32, seed uint64, maxTokens int) uint64 {
	var buf [24 + 4*fingerprintTail]byte
	binary.LittleEndian.PutUint64(buf[0:], seed)
	binary.LittleEndian.PutUint64(buf[8:], uint64(len(prompt)))
	binary.LittleEndian.PutUint64(buf[16:], uint64(maxTokens))
	tail := prompt[len(prompt)-min(len(prompt), fingerprintTail):]
	for i, id := range tail {
		binary.LittleEndian.PutUint32(buf[24+4*i:], id)
	}
	return xxhash.Sum64(buf[:24+4*len(tail)])
}

// Arrival is one request the replica's engine accepted: its sequence number among the
// replica's arrivals (from 1) and its Fingerprint.
type Arrival struct {
	Seq         uint64
	Fingerprint uint64
}

// arrivals is a replica's ring of its last arrivalLog arrivals. The caller holds the
// replica's mu.
type arrivals struct {
	seq  uint64 // arrivals so far
	ring [arrivalLog]uint64
}

func (a *arrivals) add(fp uint64) {
	a.seq++
	a.ring[a.seq%arrivalLog] = fp
}

// ArrivalSeq is the number of requests the replica's engine has accepted so far: a request
// routed now arrives with a larger Seq.
func (r *Replica) ArrivalSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.arr.seq
}

// ArrivalsSince appends to dst the arrivals with Seq > after, oldest first, and returns it
// and whether it is complete (false: more than arrivalLog arrived since, the oldest are
// forgotten).
func (r *Replica) ArrivalsSince(after uint64, dst []Arrival) ([]Arrival, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	from, complete := after+1, true
	if r.arr.seq >= arrivalLog && from <= r.arr.seq-arrivalLog {
		from, complete = r.arr.seq-arrivalLog+1, false
	}
	for s := from; s <= r.arr.seq; s++ {
		dst = append(dst, Arrival{Seq: s, Fingerprint: r.arr.ring[s%arrivalLog]})
	}
	return dst, complete
}
