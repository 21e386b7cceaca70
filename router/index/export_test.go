package index

import (
	"cmp"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/splitmix"
	"github.com/prefixlb/prefixlb/router/key"
)

// TestExportImportRoundTrip: an index built from another's export matches the same prompts
// on the same backends and keeps the LRU order, across several import batches.
func TestExportImportRoundTrip(t *testing.T) {
	a, b := newBackend(t, "a", 1<<30), newBackend(t, "b", 1<<30)
	src := New(Options{MaxEntries: -1})
	src.SetBackends([]*backend.Backend{a, b})
	const prompts = 300 // × 20 chunks: 6000 entries on a, more than one importBatch
	for i := range prompts {
		src.Record(chain(uint64(i), 20), a, t0.Add(time.Duration(i)*time.Millisecond))
		if i%3 == 0 {
			src.Record(chain(uint64(i), 10), b, t0.Add(time.Duration(i)*time.Millisecond))
		}
	}
	exp := src.Export([]*backend.Backend{a, b}, 0)
	if len(exp) != 2 || len(exp[0].Hashes) != prompts*20 || len(exp[1].Hashes) != 100*10 {
		t.Fatalf("export sizes: %d backends, %d and %d entries", len(exp), len(exp[0].Hashes), len(exp[1].Hashes))
	}
	if !slices.IsSortedFunc(exp[0].Used, func(x, y int64) int { return int(y - x) }) {
		t.Fatal("export not most recently used first")
	}
	dst := New(Options{MaxEntries: -1})
	dst.SetBackends([]*backend.Backend{a, b})
	for _, e := range exp {
		bk := a
		if e.ID == b.ID {
			bk = b
		}
		if n := dst.Import(bk, e.Hashes, t0.Add(time.Hour)); n != len(e.Hashes) {
			t.Fatalf("imported %d of %d", n, len(e.Hashes))
		}
	}
	for _, i := range []uint64{0, 3, 150, 299} {
		want := match(src, chain(i, 25), a, b)
		if got := match(dst, chain(i, 25), a, b); !slices.Equal(got, want) {
			t.Fatalf("prompt %d: match %v after import, %v before", i, got, want)
		}
	}
	again := dst.Export([]*backend.Backend{a, b}, 0)
	for j := range exp {
		if !slices.Equal(again[j].Hashes, exp[j].Hashes) {
			t.Fatalf("backend %d: LRU order not kept by the import", j)
		}
	}
}

// TestImportKeepsNewestWithinCapacity: an import larger than the backend's capacity keeps
// the most recently used entries; maxPerBackend bounds the export to the newest.
func TestImportKeepsNewestWithinCapacity(t *testing.T) {
	big := newBackend(t, "a", 1<<30)
	src := New(Options{MaxEntries: -1})
	src.SetBackends([]*backend.Backend{big})
	for i := range 100 {
		src.Record(chain(uint64(i), 10), big, t0.Add(time.Duration(i)*time.Millisecond))
	}
	newest := src.Export([]*backend.Backend{big}, 50)[0].Hashes
	if len(newest) != 50 || !slices.Equal(newest[:10], chain(99, 10)) {
		t.Fatalf("export of 50: %d entries, first %v", len(newest), newest[:min(len(newest), 10)])
	}
	small, _ := backend.New(big.Name, 64*30, 1) // 30 chunks of 64 tokens; same ID as big
	dst := New(Options{MaxEntries: -1})
	dst.SetBackends([]*backend.Backend{small})
	if n := dst.Import(small, src.Export([]*backend.Backend{big}, 0)[0].Hashes, t0); n != 30 {
		t.Fatalf("imported %d, want the capacity 30", n)
	}
	got := match(dst, chain(99, 10), small)[0] + match(dst, chain(98, 10), small)[0] + match(dst, chain(97, 10), small)[0]
	if got != 30 || match(dst, chain(96, 10), small)[0] != 0 {
		t.Fatalf("the newest 3 prompts should be held whole and nothing older: %d chunks", got)
	}
}

// TestExportSkipsStaleAndUnknown: a backend whose cache epoch moved (restart) or that is not
// registered exports nothing; Import of an unregistered backend records nothing.
func TestExportSkipsStaleAndUnknown(t *testing.T) {
	a, b, c := newBackend(t, "a", 1<<20), newBackend(t, "b", 1<<20), newBackend(t, "c", 1<<20)
	x := New(Options{})
	x.SetBackends([]*backend.Backend{a, b})
	x.Record(chain(1, 4), a, t0)
	x.Record(chain(2, 4), b, t0)
	b.ResetCache()
	exp := x.Export([]*backend.Backend{a, b, c}, 0)
	if len(exp) != 1 || exp[0].ID != a.ID || len(exp[0].Hashes) != 4 {
		t.Fatalf("export: %+v", exp)
	}
	if n := x.Import(c, chain(3, 4), t0); n != 0 || x.Entries() != 8 {
		t.Fatalf("import of an unregistered backend: %d recorded, %d entries", n, x.Entries())
	}
}

// TestImportCoarseCountsWhatItKept: Import into a backend whose capacity holds only part of an
// export of coarse-weighted entries keeps the newest that fit by weight, in order, and returns
// how many it kept (the count the snapshot metric and log line report); a backend with room
// takes the whole export back in order.
func TestImportCoarseCountsWhatItKept(t *testing.T) {
	o := Options{ChunkTokens: 64, MaxEntries: -1, CoarseWeight: key.CoarseFactor}
	a := newBackend(t, "a", 1<<30)
	src := newIndex(o, defaultShards)
	src.SetBackends([]*backend.Backend{a})
	for i := range 20 {
		src.Record(keyChunks(uint64(i), 400), a, t0.Add(time.Duration(i)*time.Millisecond))
	}
	exp := src.Export([]*backend.Backend{a}, 0)[0]
	small, err := backend.New(a.Name, 64*2000, 1)
	if err != nil {
		t.Fatal(err)
	}
	dst := newIndex(o, defaultShards)
	dst.SetBackends([]*backend.Backend{small})
	n := dst.Import(small, exp.Hashes, t0.Add(time.Hour))
	got := dst.Export([]*backend.Backend{small}, 0)[0]
	check(t, dst)
	if n != len(got.Hashes) || n == 0 || n >= len(exp.Hashes) {
		t.Errorf("Import returned %d; the backend holds %d of the %d exported", n, len(got.Hashes), len(exp.Hashes))
	}
	if !slices.Equal(got.Hashes, exp.Hashes[:len(got.Hashes)]) {
		t.Errorf("Import did not keep the newest entries in their order")
	}
	whole := newIndex(o, defaultShards)
	whole.SetBackends([]*backend.Backend{a})
	if n := whole.Import(a, exp.Hashes, t0.Add(time.Hour)); n != len(exp.Hashes) {
		t.Errorf("with room, Import kept %d of %d", n, len(exp.Hashes))
	}
	if again := whole.Export([]*backend.Backend{a}, 0)[0]; !slices.Equal(again.Hashes, exp.Hashes) {
		t.Errorf("with room, the order was lost")
	}
	check(t, whole)
}

// mergeCase is two indexes' worth of entries on one backend: a local one (each prompt
// recorded twice, so that no entry is left marked added) and an export to merge into it.
type mergeCase struct {
	x      *Index
	b      *backend.Backend
	times  map[uint64]int64 // every entry of either side, at the later of its times
	export BackendEntries
}

// newMergeCase records local prompts on x's backend b (capacity chunks) and exports remote
// ones of another index, their times interleaved with the local ones'.
func newMergeCase(t *testing.T, capacity int64, local, remote int, seed uint64) *mergeCase {
	return newMergeCaseAt(t, capacity, local, remote, seed, 500*time.Millisecond)
}

// newMergeCaseAt is newMergeCase with the remote prompt i recorded at shift past the local
// prompt i (a negative shift of more than the local span: every remote entry older).
func newMergeCaseAt(t *testing.T, capacity int64, local, remote int, seed uint64, shift time.Duration) *mergeCase {
	t.Helper()
	b := newBackend(t, "a", capacity*64)
	mc := &mergeCase{x: New(Options{ChunkTokens: 64, MaxEntries: -1}), b: b, times: map[uint64]int64{}}
	mc.x.SetBackends([]*backend.Backend{b})
	src := New(Options{ChunkTokens: 64, MaxEntries: -1})
	src.SetBackends([]*backend.Backend{b})
	note := func(hs []uint64, at time.Time) {
		for _, h := range hs {
			mc.times[norm(h)] = max(mc.times[norm(h)], at.UnixNano())
		}
	}
	rng := seed
	for i := range max(local, remote) {
		rng = rng*6364136223846793005 + 1442695040888963407
		at := t0.Add(time.Duration(i) * time.Second)
		if i < local {
			// A third of the local prompts share their first chunks with a remote one.
			hs := chain(seed<<20|uint64(i), 3+int(rng>>60))
			if i%3 == 0 {
				hs = append(chain(seed<<20|1<<19|uint64(i/3), 2), chain(seed<<20|uint64(i), 2)...)
			}
			mc.x.Record(hs, b, at)
			mc.x.Record(hs, b, at.Add(time.Millisecond))
			note(hs, at.Add(time.Millisecond))
		}
		if i < remote {
			hs := chain(seed<<20|1<<18|uint64(i), 2+int(rng>>61))
			if i%3 == 0 {
				hs = chain(seed<<20|1<<19|uint64(i), 2)
			}
			at := at.Add(shift)
			src.Record(hs, b, at)
			note(hs, at)
		}
	}
	mc.export = src.Export([]*backend.Backend{b}, 0)[0]
	return mc
}

// verify checks that x's entries on b are the newest of both sides by the later of each
// entry's times, in that order, as many as the capacity takes.
func (mc *mergeCase) verify(t *testing.T) {
	t.Helper()
	check(t, mc.x)
	got := mc.x.Export([]*backend.Backend{mc.b}, 0)[0]
	if !slices.IsSortedFunc(got.Used, func(p, q int64) int { return cmp.Compare(q, p) }) {
		t.Fatal("the merged list is not newest first")
	}
	kept := map[uint64]bool{}
	oldestKept := int64(math.MaxInt64)
	for i, h := range got.Hashes {
		kept[h] = true
		if want := mc.times[h]; got.Used[i] != want {
			t.Fatalf("entry %d: used %d, want the later of its times %d", i, got.Used[i], want)
		}
		oldestKept = min(oldestKept, got.Used[i])
	}
	capacity := int(stat(mc.x, mc.b).Capacity)
	if want := min(capacity, len(mc.times)); len(got.Hashes) != want {
		t.Fatalf("%d entries after the merge, want %d (capacity %d, %d distinct)", len(got.Hashes), want, capacity, len(mc.times))
	}
	for h, at := range mc.times {
		if !kept[h] && at > oldestKept {
			t.Fatalf("entry used at %d dropped while one used at %d was kept", at, oldestKept)
		}
	}
}

// TestMergeByAge: Merge leaves a backend with the newest entries of the union of its own and
// an export, by the later of each entry's two times, newest first, within the capacity;
// Import of the same export (everything at now) would have evicted the newer local ones.
func TestMergeByAge(t *testing.T) {
	for _, c := range []struct {
		name                 string
		capacity             int64
		local, remote, batch int
		shift                time.Duration
	}{
		{"room for both", 1000, 40, 40, importBatch, 500 * time.Millisecond},
		{"at capacity", 120, 60, 60, importBatch, 500 * time.Millisecond},
		{"at capacity, small batches", 120, 60, 60, 7, 500 * time.Millisecond},
		{"empty local", 100, 0, 80, 5, 500 * time.Millisecond},
		{"every remote entry older, at capacity", 50, 60, 40, 5, -time.Hour},
		{"every remote entry older, room", 1000, 30, 40, 5, -time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			mc := newMergeCaseAt(t, c.capacity, c.local, c.remote, 1, c.shift)
			n := mc.x.merge(mc.b, mc.export.Hashes, mc.export.Used, 0, c.batch, nil)
			mc.verify(t)
			got := mc.x.Export([]*backend.Backend{mc.b}, 0)[0]
			in := 0
			for _, h := range got.Hashes {
				if slices.Contains(mc.export.Hashes, h) {
					in++
				}
			}
			if n != in {
				t.Fatalf("Merge returned %d; %d of the export are held", n, in)
			}
		})
	}
}

// TestMergeBetweenBatches: local Records between two batches of a Merge (new entries at the
// front, evictions at the back, the merge's own position touched) are kept, and the result
// is still the newest of everything.
func TestMergeBetweenBatches(t *testing.T) {
	for _, capacity := range []int64{80, 1000} {
		mc := newMergeCase(t, capacity, 50, 50, 2)
		step := 0
		between := func() {
			step++
			at := t0.Add(time.Hour + time.Duration(step)*time.Second)
			// A new prompt (evicting at capacity), then an old local one touched again.
			hs := chain(1<<40|uint64(step), 3)
			mc.x.Record(hs, mc.b, at)
			mc.x.Record(hs, mc.b, at.Add(time.Millisecond))
			for _, h := range hs {
				mc.times[norm(h)] = at.Add(time.Millisecond).UnixNano()
			}
			all := mc.x.Export([]*backend.Backend{mc.b}, 0)[0]
			mid := all.Hashes[len(all.Hashes)/2:][:1]
			mc.x.Record(mid, mc.b, at.Add(2*time.Millisecond))
			mc.times[norm(mid[0])] = at.Add(2 * time.Millisecond).UnixNano()
			if step == 5 && capacity > 100 { // the capacity cut: the oldest entries freed, the merge's position among them
				smaller, err := backend.New(mc.b.Name, 16*64, 1)
				if err != nil {
					t.Fatal(err)
				}
				mc.x.SetBackends([]*backend.Backend{smaller})
			}
			if step == 3 { // every entry touched: the merge's position moved to the front
				mc.x.Record(all.Hashes, mc.b, at.Add(3*time.Millisecond))
				mc.x.Record(all.Hashes, mc.b, at.Add(4*time.Millisecond))
				for _, h := range all.Hashes {
					mc.times[norm(h)] = at.Add(4 * time.Millisecond).UnixNano()
				}
			}
		}
		mc.x.merge(mc.b, mc.export.Hashes, mc.export.Used, 0, 4, between)
		if step == 0 {
			t.Fatal("one batch only")
		}
		// Entries the merge placed before the local Records between batches stay where
		// their own time puts them; the check is the same.
		mc.verify(t)
	}
}

// TestMergeLeavesAddedEntries: an entry added by a Record that may yet be withdrawn stays
// marked, whatever the merge says of it, and Forget still withdraws it.
func TestMergeLeavesAddedEntries(t *testing.T) {
	b := newBackend(t, "a", 1<<20)
	x := New(Options{})
	x.SetBackends([]*backend.Backend{b})
	hs := chain(7, 4)
	st := x.Record(hs, b, t0)
	used := []int64{t0.Add(time.Hour).UnixNano(), t0.Add(time.Hour).UnixNano(), t0.Add(time.Hour).UnixNano(), t0.Add(time.Hour).UnixNano()}
	if n := x.Merge(b, hs, used); n != 4 {
		t.Fatalf("Merge returned %d", n)
	}
	x.Forget(hs, b, st)
	if x.Entries() != 0 {
		t.Fatalf("%d entries left: the merge confirmed entries a refused request added", x.Entries())
	}
	check(t, x)
}

// TestMergeAfterPartition: two replicas' indexes at capacity learn apart, then each merges
// the other's export: both hold what either learned apart, where importing at now swapped
// them (each the other's list, its own new entries evicted).
func TestMergeAfterPartition(t *testing.T) {
	const capacity = 100
	b := newBackend(t, "a", capacity*64)
	a, c := New(Options{ChunkTokens: 64, MaxEntries: -1}), New(Options{ChunkTokens: 64, MaxEntries: -1})
	a.SetBackends([]*backend.Backend{b})
	c.SetBackends([]*backend.Backend{b})
	for i := range 50 { // both learn the same before the partition
		at := t0.Add(time.Duration(i) * time.Second)
		a.Record(chain(uint64(i), 4), b, at)
		c.Record(chain(uint64(i), 4), b, at)
	}
	late := t0.Add(time.Hour)
	a.Record(chain(1000, 4), b, late)
	c.Record(chain(2000, 4), b, late.Add(time.Second))
	ea, ec := a.Export([]*backend.Backend{b}, 0)[0], c.Export([]*backend.Backend{b}, 0)[0]
	// held reports whether x, holding own's export, holds each side's partition learn after
	// taking the other's export with take.
	held := func(own, other BackendEntries, take func(x *Index, e BackendEntries)) [2]bool {
		x := New(Options{ChunkTokens: 64, MaxEntries: -1})
		x.SetBackends([]*backend.Backend{b})
		x.Merge(b, own.Hashes, own.Used)
		take(x, other)
		check(t, x)
		return [2]bool{match(x, chain(1000, 4), b)[0] == 4, match(x, chain(2000, 4), b)[0] == 4}
	}
	merge := func(x *Index, e BackendEntries) { x.Merge(b, e.Hashes, e.Used) }
	importNow := func(x *Index, e BackendEntries) { x.Import(b, e.Hashes, late.Add(time.Minute)) }
	if got := held(ea, ec, merge); got != [2]bool{true, true} {
		t.Errorf("a after merging c's export holds a's and c's partition learns: %v", got)
	}
	if got := held(ec, ea, merge); got != [2]bool{true, true} {
		t.Errorf("c after merging a's export holds a's and c's partition learns: %v", got)
	}
	// The case is one where importing at now loses the replica's own learn.
	if got := held(ea, ec, importNow); got != [2]bool{false, true} {
		t.Errorf("a after importing c's export at now: %v; the case should show the swap", got)
	}
}

// TestMergeCursorFreed: an entry freed between two batches of a Merge (a refused request's
// Forget) where the merge was to go on is not linked to: the merge finds its place again.
func TestMergeCursorFreed(t *testing.T) {
	b := newBackend(t, "a", 100*64)
	x := New(Options{ChunkTokens: 64, MaxEntries: -1})
	x.SetBackends([]*backend.Backend{b})
	sec := func(tenths int) time.Time { return t0.Add(time.Duration(tenths) * 100 * time.Millisecond) }
	stamps := map[int]Stamp{}
	for i := 1; i <= 10; i++ { // local entries at 1..10 s, each added by one Record
		stamps[i] = x.Record(chain(uint64(i), 1), b, sec(10*i))
	}
	var hs []uint64
	var used []int64
	for i := 9; i >= 0; i-- { // remote entries at 9.5, 8.5, …, 0.5 s
		hs = append(hs, chain(100+uint64(i), 1)...)
		used = append(used, sec(10*i+5).UnixNano())
	}
	step := 0
	x.merge(b, hs, used, 0, 1, func() {
		if step++; step == 5 { // the merge's next place is before the entry at 5 s
			x.Forget(chain(5, 1), b, stamps[5])
		}
	})
	check(t, x)
	got := x.Export([]*backend.Backend{b}, 0)[0]
	if len(got.Hashes) != 19 || !slices.IsSortedFunc(got.Used, func(p, q int64) int { return cmp.Compare(q, p) }) {
		t.Fatalf("%d entries, used %v: want 19, newest first", len(got.Hashes), got.Used)
	}
}

// TestMergeCoarse: a coarse entry (weighing CoarseWeight chunks) is merged only where its
// claim evicts nothing newer than itself; one that does not fit leaves room for the fine
// entries after it; a capacity cut below its weight between two batches leaves the list
// whole.
func TestMergeCoarse(t *testing.T) {
	const w = 4
	sec := func(s float64) int64 { return t0.Add(time.Duration(s * float64(time.Second))).UnixNano() }
	// local records fine single-chunk prompts at the given seconds, each confirmed.
	local := func(t *testing.T, capacity int64, secs ...float64) (*Index, *backend.Backend) {
		b := newBackend(t, "a", capacity*64)
		x := New(Options{ChunkTokens: 64, MaxEntries: -1, CoarseWeight: w})
		x.SetBackends([]*backend.Backend{b})
		for i, at := range secs {
			h := fine(uint64(1000 + i))
			x.Record([]uint64{h}, b, time.Unix(0, sec(at)))
			x.Record([]uint64{h}, b, time.Unix(0, sec(at)).Add(time.Millisecond))
		}
		return x, b
	}
	t.Run("evicts nothing newer", func(t *testing.T) {
		x, b := local(t, 10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
		if n := x.Merge(b, []uint64{coarse(1)}, []int64{sec(0.5)}); n != 0 {
			t.Fatalf("a coarse entry at 0.5 s merged (%d) over entries at 1–3 s", n)
		}
		check(t, x)
		if e := stat(x, b).Entries; e != 10 {
			t.Fatalf("%d entries, want the 10 local ones", e)
		}
		if n := x.Merge(b, []uint64{coarse(2)}, []int64{sec(3.5)}); n != 1 {
			t.Fatal("a coarse entry newer than the 4 oldest not merged")
		}
		check(t, x)
		if m := match(x, []uint64{fine(1000 + 4)}, b)[0]; m != 1 {
			t.Fatal("the entry at 4 s was evicted for the one at 3.5 s")
		}
	})
	t.Run("fine after a coarse that does not fit", func(t *testing.T) {
		x, b := local(t, 10, 10, 11, 12, 13, 14, 15, 16, 17)
		n := x.Merge(b, []uint64{coarse(3), fine(4), fine(6)}, []int64{sec(3), sec(2), sec(1)})
		check(t, x)
		if n != 2 || stat(x, b).Entries != 10 {
			t.Fatalf("merged %d, %d entries: want the 2 fine ones in the 2 free places", n, stat(x, b).Entries)
		}
	})
	t.Run("capacity under its weight between batches", func(t *testing.T) {
		x, b := local(t, 100, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
		x.merge(b, []uint64{fine(2), coarse(3)}, []int64{sec(3600), sec(3599)}, 0, 1, func() {
			s := x.tab.Load().byID[b.ID]
			s.locked(func() {
				s.learned.Store(2) // what Correct sets for a backend that kept 2 chunks
				x.trim(s)
			})
		})
		check(t, x)
		if m := match(x, []uint64{coarse(3)}, b)[0]; m != 0 {
			t.Fatal("a chunk heavier than the capacity merged")
		}
	})
}

// TestImportAtOddNow: Import at an odd nanosecond does not leave its entries marked added
// (the mark is a stamp's low bit): a later Merge still moves them to a later time.
func TestImportAtOddNow(t *testing.T) {
	b := newBackend(t, "a", 100*64)
	x := New(Options{ChunkTokens: 64, MaxEntries: -1})
	x.SetBackends([]*backend.Backend{b})
	now := t0.Add(1)
	x.Import(b, []uint64{10, 12}, now)
	later := now.Add(time.Hour).UnixNano() &^ added
	x.Merge(b, []uint64{12}, []int64{later})
	e := x.Export([]*backend.Backend{b}, 0)[0]
	if e.Hashes[0] != 12 || e.Used[0] != later {
		t.Fatalf("after the merge: %v used %v; want 12 first, used %d", e.Hashes, e.Used, later)
	}
}

// fine and coarse are single-chunk hashes of either weight (key.IsCoarse).
func fine(i uint64) uint64 {
	for h := splitmix.Mix(i); ; h++ {
		if !key.IsCoarse(h) && h > 1 {
			return h
		}
	}
}

func coarse(i uint64) uint64 {
	for h := splitmix.Mix(i | 1<<62); ; h++ {
		if key.IsCoarse(h) {
			return h
		}
	}
}
