// Export and import: a copy of the index's entries, for another prefixlb replica that starts
// (peering's snapshot on join) to begin with what this one learned.

package index

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// BackendEntries is one backend's part of an export: the chunk hashes it holds, most recently
// used first, and when each was last used.
type BackendEntries struct {
	// ID is the backend's ID (backend.Backend.ID, stable across prefixlb replicas configured
	// with the same URL).
	ID uint64
	// Hashes are the chunk hashes, most recently used first.
	Hashes []uint64
	// Used[i] is when Hashes[i] was last recorded, unix nanoseconds.
	Used []int64
}

// Export returns, for each of bs registered here and still in the epoch its entries were
// recorded in, its entries most recently used first, at most maxPerBackend of them (≤ 0: all).
// It holds one backend's lock at a time, for the copy of its list (about 1 ms per 100k
// entries), so that Records on that backend wait meanwhile and Matches never do.
func (x *Index) Export(bs []*backend.Backend, maxPerBackend int) []BackendEntries {
	tab := x.tab.Load()
	out := make([]BackendEntries, 0, len(bs))
	for _, b := range bs {
		s := tab.byID[b.ID]
		if s == nil {
			continue
		}
		var e BackendEntries
		ok := false
		s.locked(func() {
			if s.removed.Load() || s.epoch.Load() != b.Epoch() {
				return
			}
			n := min(int(s.count.Load()), len(s.nodes)) // count is the entries' weight
			if maxPerBackend > 0 {
				n = min(n, maxPerBackend)
			}
			e = BackendEntries{ID: b.ID, Hashes: make([]uint64, 0, n), Used: make([]int64, 0, n)}
			for ni := s.head; ni != nilIdx && len(e.Hashes) < n; ni = s.nodes[ni].next {
				e.Hashes = append(e.Hashes, s.nodes[ni].hash)
				e.Used = append(e.Used, s.nodes[ni].used&^added)
			}
			ok = true
		})
		if !ok {
			continue
		}
		out = append(out, e)
	}
	return out
}

// importBatch is how many entries Import records under one hold of the backend's lock, so
// that local Records on that backend wait at most one batch (a few ms).
const importBatch = 4096

// Import records that b holds hashes (most recently used first, as Export gives them) as of
// now, keeping their order: hashes[0] ends up b's most recently used entry, and what does not
// fit b's capacity is the oldest. Entries b holds already are touched. An unregistered b is
// ignored. It returns how many entries it recorded (within the capacity).
func (x *Index) Import(b *backend.Backend, hashes []uint64, now time.Time) int {
	if b == nil || len(hashes) == 0 {
		return 0
	}
	s := x.tab.Load().byID[b.ID]
	if s == nil {
		return 0
	}
	hashes = hashes[:s.fit(hashes, max(s.capacity.Load(), 0))] // by weight, as Record cuts
	// Oldest batch first: each Record makes its batch the most recently used, and within a
	// batch Record leaves the first hash at the front.
	for end := len(hashes); end > 0; end -= importBatch {
		if x.Record(hashes[max(end-importBatch, 0):end], b, now) == 0 {
			return 0
		}
	}
	return len(hashes)
}
