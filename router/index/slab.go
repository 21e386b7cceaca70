// Slabs: the shards' holders and the backends' LRU nodes live in slices indexed by int32,
// not behind pointers (see the package comment for the bytes an entry costs).

package index

// nilIdx ends a list and stands for no holder or node.
const nilIdx = -1

// A holder slab page holds pageSize holders (12 KiB).
const (
	pageBits = 10
	pageSize = 1 << pageBits
)

// holderSlab allocates holders in fixed pages, so growth never copies and wastes at most
// one page per shard.
type holderSlab struct {
	pages [][]holder
	n     int32
	free  int32 // free list through holder.next
}

func (s *holderSlab) at(i int32) *holder { return &s.pages[i>>pageBits][i&(pageSize-1)] }

func (s *holderSlab) alloc() int32 {
	if i := s.free; i != nilIdx {
		s.free = s.at(i).next
		return i
	}
	if int(s.n)>>pageBits == len(s.pages) {
		s.pages = append(s.pages, make([]holder, pageSize))
	}
	s.n++
	return s.n - 1
}

func (s *holderSlab) release(i int32) {
	*s.at(i) = holder{next: s.free}
	s.free = i
}

// alloc takes a node for h and puts it at the front. limit bounds the slab's growth.
func (s *slot) alloc(h uint64, t int64, limit int64) int32 {
	ni := s.free
	if ni != nilIdx {
		s.free = s.nodes[ni].next
	} else {
		s.reserve(limit)
		s.nodes = append(s.nodes, node{})
		ni = int32(len(s.nodes) - 1)
	}
	s.nodes[ni] = node{hash: h, used: t, prev: nilIdx, next: nilIdx}
	s.pushFront(ni)
	s.count.Add(s.weight(h))
	return ni
}

// minNodeSlab is the node slab's first size, in nodes.
const minNodeSlab = 64

// reserve grows the node slab, if full, so that the next alloc does not copy it: it doubles,
// up to exactly limit (the capacity). A doubling slice alone (append, slices.Grow) overshoots
// by up to a quarter past the capacity, where the slab then stays: at capacity the slab is
// exactly 24 bytes a node. While a backend fills up, the slab is up to twice its entries.
func (s *slot) reserve(limit int64) {
	if s.free != nilIdx || len(s.nodes) < cap(s.nodes) {
		return
	}
	want := min(max(2*len(s.nodes), minNodeSlab), int(limit))
	if want <= len(s.nodes) {
		want = len(s.nodes) + 1 // not reached: alloc runs only below the capacity
	}
	grown := make([]node, len(s.nodes), want)
	copy(grown, s.nodes)
	s.nodes = grown
}

func (s *slot) release(ni int32) {
	s.count.Add(-s.weight(s.nodes[ni].hash))
	s.nodes[ni] = node{next: s.free}
	s.free = ni
}
