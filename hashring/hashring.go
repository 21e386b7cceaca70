// Package hashring is consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam).
//
// A Ring is immutable once built, so it is safe for concurrent use without locking; to change
// the members, build a new Ring and swap it in (the owner keeps it in an atomic.Pointer).
// The load bound itself is the caller's: Lookup walks clockwise from the key and returns the
// first member that the caller's accept function takes.
package hashring

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Replicas is the number of points (virtual nodes) per unit of weight while the ring holds
// at most MaxPoints. 160 points per member keep every member's share of the circle within a
// few percent of its fair share.
const Replicas = 160

// MaxPoints bounds the points of a ring beyond one per member: members whose weights sum
// past MaxPoints / Replicas share MaxPoints points in proportion to their weights (at least
// one each), so that a ring of 200 members of weight 1000 holds 65,536 points (1 MiB),
// not 32 million (BenchmarkNew). Up to 409 members of equal weight still get 160 points
// or more each.
const MaxPoints = 1 << 16

// maxWeight is the largest weight counted; a larger one counts as it (the sums below stay
// far from overflowing).
const maxWeight = 1 << 24

// Member is one participant of the ring.
type Member struct {
	// Name identifies the member; rings built from the same names and weights place keys the
	// same way, whatever the order of the members.
	Name string
	// Weight scales the member's number of points; values below 1 count as 1, above 2^24 as
	// 2^24.
	Weight int
}

// Points is the number of points each member gets on a ring of members, in their order:
// Replicas × weight while those sum to at most MaxPoints, else ⌊weight × MaxPoints / total
// weight⌋ and at least 1. It depends only on the weights, not their order, so that every
// prefixlb replica configured alike builds the same ring; the sum is at most MaxPoints +
// len(members).
func Points(members []Member) []int {
	var total uint64
	for _, m := range members {
		total += weight(m)
	}
	out := make([]int, len(members))
	for i, m := range members {
		w := weight(m)
		if total <= MaxPoints/Replicas {
			out[i] = int(w * Replicas)
		} else {
			out[i] = int(max(w*MaxPoints/total, 1))
		}
	}
	return out
}

// weight is m's weight as the ring counts it: 1..maxWeight.
func weight(m Member) uint64 { return uint64(min(max(m.Weight, 1), maxWeight)) }

type point struct {
	hash   uint64
	member int32
}

// Ring is an immutable consistent-hash ring. The zero value is an empty ring.
type Ring struct {
	points  []point
	members []Member
}

// New builds a ring of members, each with its Points, point i placed by the xxhash64 of its
// label ("name#i"): a member whose count shrinks loses its last points, and keeps the others
// where they were. Member indexes (Lookup's results) are positions in members.
func New(members []Member) *Ring { return newRing(members, xxhash.Sum64) }

// newRing is New with hash placing the points.
func newRing(members []Member, hash func(label []byte) uint64) *Ring {
	r := &Ring{members: slices.Clone(members)}
	counts := Points(r.members)
	total := 0
	for _, c := range counts {
		total += c
	}
	r.points = make([]point, 0, total)
	var buf []byte
	for m, mb := range r.members {
		for i := range counts[m] {
			buf = strconv.AppendInt(append(append(buf[:0], mb.Name...), '#'), int64(i), 10)
			r.points = append(r.points, point{hash: hash(buf), member: int32(m)})
		}
	}
	// Colliding points are ordered by member name so that the result does not depend on the
	// order in which members were given.
	slices.SortFunc(r.points, func(a, b point) int {
		if c := cmp.Compare(a.hash, b.hash); c != 0 {
			return c
		}
		return cmp.Compare(r.members[a.member].Name, r.members[b.member].Name)
	})
	return r
}

// Len is the number of points on the ring.
func (r *Ring) Len() int { return len(r.points) }

// Lookup walks clockwise from key's position and returns the first member that accept takes
// (nil accepts all: the member that owns key, the first point clockwise from it), asking about each member at most once. It returns -1 when no member is
// accepted. With accept = "load below the bound" this is the bounded-load walk: a key whose
// owner is full goes to the next member on the circle, so a full member's overflow spreads
// as its points' successors do. accept must not retain or modify the ring.
func (r *Ring) Lookup(key uint64, accept func(member int) bool) int {
	n := len(r.points)
	if n == 0 {
		return -1
	}
	// Compared by hand: cmp.Compare here makes a cold pick slower (BenchmarkPickCold).
	i, _ := slices.BinarySearchFunc(r.points, key, func(p point, k uint64) int {
		if p.hash < k {
			return -1
		} else if p.hash > k {
			return 1
		}
		return 0
	})
	if accept == nil {
		return int(r.points[i%n].member)
	}
	// seen holds the members already asked; members beyond its size are asked again on
	// each of their points, which is correct and only slower.
	var seen [16]uint64
	left := len(r.members)
	for j := 0; j < n && left > 0; j++ {
		m := int(r.points[(i+j)%n].member)
		if m < len(seen)*64 {
			w, bit := m/64, uint64(1)<<(m%64)
			if seen[w]&bit != 0 {
				continue
			}
			seen[w] |= bit
			left--
		}
		if accept(m) {
			return m
		}
	}
	return -1
}
