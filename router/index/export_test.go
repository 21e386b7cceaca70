package index

import (
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
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
