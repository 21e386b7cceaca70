package hashring

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// labelHash places "N#i" at N*1000+i, so ring positions can be checked by hand: member "2"
// owns the points 2000..2159 and every key in (1159, 2159].
func labelHash(b []byte) uint64 {
	name, i, _ := bytes.Cut(b, []byte("#"))
	n, _ := strconv.Atoi(string(name))
	k, _ := strconv.Atoi(string(i))
	return uint64(n*1000 + k)
}

// owner is the name of the member that owns key.
func owner(r *Ring, key uint64) string { return r.members[r.Lookup(key, nil)].Name }

func names(ms ...string) []Member {
	out := make([]Member, len(ms))
	for i, m := range ms {
		out[i] = Member{Name: m, Weight: 1}
	}
	return out
}

func TestLookupByHand(t *testing.T) {
	r := newRing(names("1", "2", "3"), labelHash)
	tests := []struct {
		key  uint64
		want string
	}{
		{0, "1"}, {1000, "1"}, {1159, "1"}, {1160, "2"}, {2100, "2"}, {2500, "3"},
		{3159, "3"}, {3160, "1"}, {1<<64 - 1, "1"},
	}
	for _, tt := range tests {
		if g := owner(r, tt.key); g != tt.want {
			t.Errorf("owner of %d = %s, want %s", tt.key, g, tt.want)
		}
	}
}

func TestLookupSkipsRejected(t *testing.T) {
	r := newRing(names("1", "2", "3"), labelHash)
	asked := map[int]int{}
	not2 := func(m int) bool { asked[m]++; return r.members[m].Name != "2" }
	if g := r.members[r.Lookup(1500, not2)].Name; g != "3" {
		t.Errorf("Lookup(1500, not 2) = %s, want 3", g)
	}
	for m, n := range asked {
		if n != 1 {
			t.Errorf("member %s asked %d times, want once", r.members[m].Name, n)
		}
	}
	if g := r.Lookup(1500, func(int) bool { return false }); g != -1 {
		t.Errorf("Lookup with nothing accepted = %d, want -1", g)
	}
	if g := (&Ring{}).Lookup(1, nil); g != -1 {
		t.Errorf("empty ring Lookup = %d, want -1", g)
	}
}

func TestDistributionWithWeights(t *testing.T) {
	ms := []Member{{"http://a:8000", 1}, {"http://b:8000", 1}, {"http://c:8000", 2}, {"http://d:8000", 4}}
	r := New(ms)
	const keys = 200_000
	count := make([]int, len(ms))
	rng := rand.New(rand.NewPCG(1, 2))
	for range keys {
		count[r.Lookup(rng.Uint64(), nil)]++
	}
	for i, m := range ms {
		want := float64(keys) * float64(m.Weight) / 8
		if got := float64(count[i]); got < 0.8*want || got > 1.2*want {
			t.Errorf("%s (weight %d) got %d keys, want %.0f ± 20%%", m.Name, m.Weight, count[i], want)
		}
	}
}

// Adding or removing one of n members moves about 1/n of the keys, and only keys that
// belong to (or go to) that member.
func TestRemapOnChange(t *testing.T) {
	const keys = 100_000
	for _, n := range []int{4, 8, 16} {
		ms := make([]Member, n)
		for i := range ms {
			ms[i] = Member{Name: fmt.Sprintf("http://10.0.0.%d:8000", i), Weight: 1}
		}
		full, less := New(ms), New(ms[:n-1])
		gone := ms[n-1].Name
		moved := 0
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		for range keys {
			k := rng.Uint64()
			a, b := owner(full, k), owner(less, k)
			if a != b {
				moved++
				if a != gone {
					t.Fatalf("n=%d: key %d moved from %s to %s, but only %s left", n, k, a, b, gone)
				}
			}
		}
		frac, fair := float64(moved)/keys, 1/float64(n)
		if frac < 0.5*fair || frac > 2*fair {
			t.Errorf("n=%d: %.3f of keys moved, want within [%.3f, %.3f]", n, frac, 0.5*fair, 2*fair)
		}
	}
}

func TestOrderIndependent(t *testing.T) {
	ms := names("http://a:1", "http://b:1", "http://c:1", "http://d:1", "http://e:1")
	rev := make([]Member, len(ms))
	for i := range ms {
		rev[i] = ms[len(ms)-1-i]
	}
	// A hash with many collisions makes the tie order matter too.
	coarse := func(b []byte) uint64 { return labelHash([]byte{b[len(b)-1]}) & ^uint64(0xff) }
	for _, h := range []func([]byte) uint64{xxhash.Sum64, coarse} {
		r1, r2 := newRing(ms, h), newRing(rev, h)
		rng := rand.New(rand.NewPCG(3, 4))
		for range 10_000 {
			k := rng.Uint64()
			if a, b := owner(r1, k), owner(r2, k); a != b {
				t.Fatalf("key %d: %s in one order, %s in the other", k, a, b)
			}
		}
	}
}

// The bounded-load walk: with a cap of ceil(c·(m+1)/n) per member, 10,000 keys that all hash
// to one point still spread so that no member exceeds the cap.
func TestBoundedWalk(t *testing.T) {
	ms := names("http://a:1", "http://b:1", "http://c:1", "http://d:1")
	r := New(ms)
	load := make([]int, len(ms))
	total := 0
	for range 10_000 {
		limit := (5*(total+1) + 4*len(ms) - 1) / (4 * len(ms)) // ceil(1.25·(total+1)/n)
		m := r.Lookup(42, func(m int) bool { return load[m] < limit })
		if m < 0 {
			t.Fatalf("no member under the cap %d (loads %v)", limit, load)
		}
		load[m]++
		total++
	}
	for m, l := range load {
		if l > (5*total+4*len(ms)-1)/(4*len(ms)) {
			t.Errorf("%s took %d of %d keys, over the cap", ms[m].Name, l, total)
		}
	}
}

// members is n members named as backends, each of weight w.
func members(n, w int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{Name: fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256), Weight: w}
	}
	return ms
}

func TestPoints(t *testing.T) {
	sum := func(ps []int) (s int) {
		for _, p := range ps {
			s += p
		}
		return s
	}
	tests := []struct {
		name    string
		members []Member
		want    []int // nil: only the bound is checked
	}{
		{"empty", nil, []int{}},
		{"weight 1", names("a", "b"), []int{Replicas, Replicas}},
		{"weights under the bound", []Member{{"a", 1}, {"b", 3}, {"c", 0}}, []int{Replicas, 3 * Replicas, Replicas}},
		{"at the bound", members(MaxPoints/Replicas, 1), nil},
		{"scaled", []Member{{"a", 1000}, {"b", 3000}}, []int{MaxPoints / 4, 3 * MaxPoints / 4}},
		{"a light member keeps a point", []Member{{"a", 1}, {"b", 1 << 20}}, []int{1, MaxPoints - 1}},
		{"huge weights", []Member{{"a", 1 << 62}, {"b", 1 << 62}}, []int{MaxPoints / 2, MaxPoints / 2}},
		{"200 x 1000", members(200, 1000), nil},
		{"5000 x 1", members(5000, 1), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Points(tt.members)
			if tt.want != nil && !slices.Equal(got, tt.want) {
				t.Errorf("Points = %v, want %v", got, tt.want)
			}
			if s := sum(got); s > MaxPoints+len(tt.members) {
				t.Errorf("%d points in all, over MaxPoints + members (%d)", s, MaxPoints+len(tt.members))
			}
			for i, p := range got {
				if p < 1 {
					t.Errorf("member %d has %d points", i, p)
				}
			}
			rev := slices.Clone(tt.members)
			slices.Reverse(rev)
			back := Points(rev)
			slices.Reverse(back)
			if !slices.Equal(back, got) {
				t.Errorf("Points depends on the order of the members: %v reversed, %v", back, got)
			}
		})
	}
}

// 200 members of weight 1000 (the largest weight a config takes) build a ring of at most
// MaxPoints + 200 points in a few MiB, where 160 points per unit of weight made 32 million.
func TestLargeWeightsBounded(t *testing.T) {
	ms := members(200, 1000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r := New(ms)
	runtime.ReadMemStats(&after)
	if n := r.Len(); n > MaxPoints+len(ms) {
		t.Errorf("%d points, want at most %d", n, MaxPoints+len(ms))
	}
	// The points are 16 bytes each (1 MiB); the bound leaves room for the labels and the
	// clone of the members.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("New allocated %d bytes, want at most 8 MiB", alloc)
	}
}

// Scaled down to MaxPoints, weights still set the shares, and the ring is the same whatever
// the order of the members.
func TestScaledWeights(t *testing.T) {
	ms := []Member{{"http://a:8000", 1000}, {"http://b:8000", 1000}, {"http://c:8000", 2000}, {"http://d:8000", 4000}}
	r := New(ms)
	if n := r.Len(); n > MaxPoints+len(ms) || n < MaxPoints-len(ms) {
		t.Fatalf("%d points, want about MaxPoints (%d)", n, MaxPoints)
	}
	const keys = 200_000
	count := make([]int, len(ms))
	rng := rand.New(rand.NewPCG(1, 2))
	for range keys {
		count[r.Lookup(rng.Uint64(), nil)]++
	}
	for i, m := range ms {
		want := float64(keys) * float64(m.Weight) / 8000
		if got := float64(count[i]); got < 0.9*want || got > 1.1*want {
			t.Errorf("%s (weight %d) got %d keys, want %.0f ± 10%%", m.Name, m.Weight, count[i], want)
		}
	}
	rev := slices.Clone(ms)
	slices.Reverse(rev)
	r2 := New(rev)
	for range 10_000 {
		k := rng.Uint64()
		if a, b := owner(r, k), owner(r2, k); a != b {
			t.Fatalf("key %d: %s in one order, %s in the other", k, a, b)
		}
	}
}

// On a scaled ring, removing one of n members gives the others more points, which take keys
// from any member: more than the 1/n of the gone member's keys move, but a bounded share.
func TestScaledRemap(t *testing.T) {
	const n, keys = 100, 100_000
	ms := members(n, 100) // 16,000 points at 160 per unit: scaled to MaxPoints
	full, less := New(ms), New(ms[:n-1])
	moved := 0
	rng := rand.New(rand.NewPCG(9, 10))
	for range keys {
		k := rng.Uint64()
		if owner(full, k) != owner(less, k) {
			moved++
		}
	}
	frac, fair := float64(moved)/keys, 1/float64(n)
	t.Logf("%.4f of keys moved (1/n = %.4f)", frac, fair)
	if frac > 3*fair {
		t.Errorf("%.4f of keys moved, want at most %.4f (3/n)", frac, 3*fair)
	}
}

func benchmarkNew(b *testing.B, n, w int) {
	ms := members(n, w)
	b.ReportAllocs()
	var r *Ring
	for b.Loop() {
		r = New(ms)
	}
	b.ReportMetric(float64(r.Len()), "points")
}

func BenchmarkNew4x1(b *testing.B)      { benchmarkNew(b, 4, 1) }
func BenchmarkNew64x1000(b *testing.B)  { benchmarkNew(b, 64, 1000) }
func BenchmarkNew200x1000(b *testing.B) { benchmarkNew(b, 200, 1000) }

func benchmarkLookup(b *testing.B, n int) {
	r := New(members(n, 1))
	keys := make([]uint64, 1024)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	full := make([]bool, n)
	for i := range full {
		full[i] = i%2 == 0 // half the members over the cap
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r.Lookup(keys[i%len(keys)], func(m int) bool { return !full[m] })
	}
}

func BenchmarkLookup8(b *testing.B)   { benchmarkLookup(b, 8) }
func BenchmarkLookup64(b *testing.B)  { benchmarkLookup(b, 64) }
func BenchmarkLookup512(b *testing.B) { benchmarkLookup(b, 512) }
