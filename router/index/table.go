package index

import (
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/prefixlb/prefixlb/internal/prefetch"
)

// chunkTable is an open-addressing hash table from chunk hash to chunk, with linear probing
// and backward-shift deletion. The home slot is the top bits of the key times a Fibonacci
// constant: one multiply, enough for keys that are already xxhash values and still safe for
// keys that are not. Deletion leaves no tombstones, so a table under constant LRU churn
// keeps its size; it shrinks when mostly empty. 16 bytes a slot, at most 3/4 full.
type chunkTable struct {
	slots []chunk // length a power of two, or nil
	n     int
	shift uint // 64 − log2(len(slots))
	// view is slots' address and shift as of the last resize, read without the shard's lock
	// by prefetchHome alone: a view that a resize has since replaced yields an address that
	// is only a wasted hint.
	view atomic.Pointer[tableView]
}

// tableView is where a chunkTable's slots were and how they were indexed.
type tableView struct {
	base  uintptr
	shift uint
}

// chunk is what the index knows of one chained hash.
type chunk struct {
	key  uint64 // the chunk hash; 0 marks an empty slot (hash 0 is stored as 1)
	head int32  // first holder in the shard's slab, nilIdx for none, or below it the only one (inlineHead)
	// mask has bit s set when slot s < maskSlots holds the chunk, so that Match, the hot
	// path, reads one table slot per chunk and no list.
	mask uint32
}

const minTableSlots = 16

// A table doubles when an insertion would make it more than growNum/growDen full (to 3/8
// full), and halves when a deletion leaves it less than 1/shrinkDen full (to 1/4 full).
const (
	growNum, growDen = 3, 4
	shrinkDen        = 8
)

func (t *chunkTable) home(key uint64) int { return int((key * fibonacci) >> t.shift) }

// prefetchHome starts loading key's home slot into the cache, without the shard's lock: a
// walk that is about to claim or evict several chunks hints them all first, so that their
// misses (each a random slot of a table far larger than the caches) overlap instead of each
// waiting for the one before. It reads the table only through view.
func (t *chunkTable) prefetchHome(key uint64) {
	if v := t.view.Load(); v != nil {
		prefetch.Line(v.base + uintptr((key*fibonacci)>>v.shift)*unsafe.Sizeof(chunk{}))
	}
}

// get returns the chunk of key, or nil. The pointer is valid until the next put or del.
func (t *chunkTable) get(key uint64) *chunk {
	if t.n == 0 {
		return nil
	}
	m := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & m {
		c := &t.slots[i]
		if c.key == key {
			return c
		}
		if c.key == 0 {
			return nil
		}
	}
}

// put returns key's chunk, adding an empty one (head nilIdx) if absent. The pointer is
// valid until the next put or del. The table grows only when key is added.
func (t *chunkTable) put(key uint64) *chunk {
	if t.slots == nil {
		t.resize(minTableSlots)
	}
	m := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & m {
		c := &t.slots[i]
		if c.key == key {
			return c
		}
		if c.key != 0 {
			continue
		}
		if growDen*(t.n+1) > growNum*len(t.slots) {
			t.resize(2 * len(t.slots))
			return t.put(key)
		}
		*c = chunk{key: key, head: nilIdx}
		t.n++
		return c
	}
}

// del removes key, moving later members of its probe run back so that no gap breaks a run.
func (t *chunkTable) del(key uint64) {
	if t.n == 0 {
		return
	}
	m := len(t.slots) - 1
	i := t.home(key)
	for ; t.slots[i].key != key; i = (i + 1) & m {
		if t.slots[i].key == 0 {
			return
		}
	}
	for j := i; ; {
		j = (j + 1) & m
		k := t.slots[j].key
		if k == 0 {
			break
		}
		// The entry at j may move to the gap at i only if its home is not in (i, j],
		// cyclically: otherwise the move would put it before its home.
		h := t.home(k)
		if (i < j && i < h && h <= j) || (j < i && (i < h || h <= j)) {
			continue
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = chunk{}
	t.n--
	if len(t.slots) > minTableSlots && shrinkDen*t.n < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

func (t *chunkTable) resize(size int) {
	old := t.slots
	t.slots = make([]chunk, size)
	t.shift = uint(64 - bits.Len(uint(size-1)))
	t.view.Store(&tableView{base: uintptr(unsafe.Pointer(unsafe.SliceData(t.slots))), shift: t.shift})
	m := size - 1
	for _, c := range old {
		if c.key == 0 {
			continue
		}
		i := t.home(c.key)
		for t.slots[i].key != 0 {
			i = (i + 1) & m
		}
		t.slots[i] = c
	}
}
