// Matching: how many leading chunks of a prompt each candidate holds.

package index

import (
	"math/bits"

	"github.com/prefixlb/prefixlb/backend"
)

// Match sets out[j] to the number of leading chunks of chunks that cs[j] holds: chunk i
// counts only if chunks 0..i all do. It walks the chunks from the start and stops at the
// first chunk that no candidate still matching holds. It returns the largest out[j].
// out must have room for len(cs); candidates must have distinct IDs. It allocates only when
// there are more than matchStackCandidates candidates or matchStackSlots registered backends.
func (x *Index) Match(chunks []uint64, cs []*backend.Backend, out []int) int {
	out = out[:len(cs)]
	clear(out)
	if len(chunks) == 0 || len(cs) == 0 {
		return 0
	}
	tab := x.tab.Load()
	var posBuf [matchStackSlots]uint16      // slot number → candidate index + 1
	var slotBuf [matchStackCandidates]*slot // candidate index → slot
	pos, slots := posBuf[:], slotBuf[:]
	if tab.maxNum > len(pos) {
		pos = make([]uint16, tab.maxNum)
	}
	if len(cs) > len(slots) {
		slots = make([]*slot, len(cs))
	}
	var want uint32 // candidates' slot bits
	wide := false   // some candidate's slot is beyond the mask
	for j, b := range cs {
		s := tab.byID[b.ID]
		// A restarted backend's entries are ignored until they are purged.
		if s == nil || s.epoch.Load() != b.Epoch() {
			continue
		}
		slots[j] = s
		pos[s.num] = uint16(j + 1)
		if s.num < maskSlots {
			want |= 1 << s.num
		} else {
			wide = true
		}
	}
	var best int
	switch {
	case wide:
		best = x.matchList(chunks, pos, out)
	case want != 0:
		best = x.matchMask(chunks, want, pos, out)
	}
	// A candidate whose slot was retired meanwhile may have been credited with holders of
	// a new slot that reuses the number: retire happens before any reuse, so checking it
	// after the walk is enough.
	for j, s := range slots[:len(cs)] {
		if s != nil && s.removed.Load() {
			out[j] = 0
		}
	}
	return best
}

// Match works on the stack for up to matchStackCandidates candidates and
// matchStackSlots registered backends (1 KiB of stack in all).
const (
	matchStackCandidates = 64
	matchStackSlots      = 256
)

// matchMask is Match for slots that all fit the chunk mask. It looks up the first
// seqChunks chunks one at a time and the rest, if the prompt is still held that far, in
// growing batches (batch.go), each shard of a batch read-locked once.
func (x *Index) matchMask(chunks []uint64, want uint32, pos []uint16, out []int) int {
	alive := want
	seq := min(len(chunks), seqChunks)
	for i, h := range chunks[:seq] {
		h = norm(h)
		if alive = x.narrow(alive, x.shard(h).maskOf(h), i, pos, out); alive == 0 {
			return i
		}
	}
	if seq < len(chunks) {
		sc := scratchPool.Get().(*scratch)
		defer scratchPool.Put(sc)
		for lo, n := seq, firstBatch; lo < len(chunks); lo, n = lo+n, min(n*batchGrowth, batchChunks) {
			hs := chunks[lo:min(lo+n, len(chunks))]
			masks := sc.masks[:len(hs)]
			x.masksOf(hs, masks, &sc.batch)
			for j, mask := range masks {
				if alive = x.narrow(alive, mask, lo+j, pos, out); alive == 0 {
					return lo + j
				}
			}
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		out[pos[bits.TrailingZeros32(alive)]-1] = len(chunks)
	}
	return len(chunks)
}

// narrow returns the candidates of alive that also hold chunk i (mask), and sets out to i
// for those that do not.
func (*Index) narrow(alive, mask uint32, i int, pos []uint16, out []int) uint32 {
	next := alive & mask
	for gone := alive &^ next; gone != 0; gone &= gone - 1 {
		out[pos[bits.TrailingZeros32(gone)]-1] = i
	}
	return next
}

// matchList is Match through the holder lists, for slots beyond the chunk mask.
func (x *Index) matchList(chunks []uint64, pos []uint16, out []int) int {
	best := 0
	for i, h := range chunks {
		if !x.shard(norm(h)).advance(norm(h), i, pos, out) {
			break
		}
		best = i + 1
	}
	return best
}

// advance sets out[p] to i+1 for every candidate p that holds the first i chunks (out[p] ==
// i) and holds h too, under sh's read lock. It reports whether any did.
func (sh *shard) advance(h uint64, i int, pos []uint16, out []int) bool {
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	advanced := false
	if ch := sh.chunks.get(h); ch != nil {
		sh.each(ch, func(num uint16, _ int32) bool {
			if p := int(pos[num]); p > 0 && out[p-1] == i {
				out[p-1] = i + 1
				advanced = true
			}
			return true
		})
	}
	return advanced
}
