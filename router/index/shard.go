// Shards: each maps chunk hashes (table.go) to the list of slots that hold them.
//
// Every shard lock is released by a defer, here and in batch.go, match.go and record.go: a
// panic inside the index (a bug) fails the request that hit it, which the proxy contains,
// rather than leave a shard locked and every later request that needs it waiting forever.

package index

import (
	"math"
	"math/bits"
	"sync"
)

// cacheLine is the size of a CPU cache line in bytes (x86-64 and most arm64 cores).
const cacheLine = 64

type shard struct {
	mu     sync.RWMutex
	chunks chunkTable
	hs     holderSlab
	_      [cacheLine]byte // keep neighbouring shards' locks off one cache line
}

// holder says that slot number num holds the chunk; node is the slot's LRU node for it.
//
// A chunk held by one slot below maskSlots, as most are (a prompt's unshared suffix), keeps
// that holder in itself instead (inline: chunk.head is inlineHead(node), the slot the one bit
// of chunk.mask), so that evicting it reads only its table slot: a holder in the slab was one
// more cache miss per eviction, after the table slot's (BenchmarkRecordNewAtCapacity), and
// 12 bytes per entry. A second holder moves both to the slab's list, and the last one left
// there goes back inline.
type holder struct {
	next int32 // next holder of the same chunk, nilIdx at the end
	node int32
	num  uint16
}

// maskSlots is the number of slots that chunk.mask covers.
const maskSlots = 32

// find returns the LRU node of slot num's holder of h, or nilIdx. Called with sh.mu held.
func (sh *shard) find(h uint64, num uint16) int32 {
	ch := sh.chunks.get(h)
	if ch == nil {
		return nilIdx
	}
	return sh.holderOf(ch, num)
}

// lookup is find under sh's read lock.
func (sh *shard) lookup(h uint64, num uint16) int32 {
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return sh.find(h, num)
}

// maskOf is the holder mask of h (0: no slot below maskSlots holds it), under sh's read lock.
func (sh *shard) maskOf(h uint64) uint32 {
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if ch := sh.chunks.get(h); ch != nil {
		return ch.mask
	}
	return 0
}

// inlineHead is chunk.head for a chunk whose one holder, node's, is kept inline: below
// nilIdx, so that no holder index is one.
func inlineHead(node int32) int32 { return nilIdx - 1 - node }

// inlinable reports whether slot num's holder with node can be kept inline: the slot is one
// of the mask's (which names it) and inlineHead(node) does not overflow.
func inlinable(num uint16, node int32) bool { return num < maskSlots && node < math.MaxInt32 }

// inline reports whether c keeps its one holder inline, and that holder's slot and node.
func (c *chunk) inline() (num uint16, node int32, ok bool) {
	if c.head >= nilIdx {
		return 0, nilIdx, false
	}
	return uint16(bits.TrailingZeros32(c.mask)), nilIdx - 1 - c.head, true
}

// each calls fn with the slot and node of every holder of ch until fn returns false. Called
// with sh.mu held.
func (sh *shard) each(ch *chunk, fn func(num uint16, node int32) bool) {
	if num, node, ok := ch.inline(); ok {
		fn(num, node)
		return
	}
	for hi := ch.head; hi != nilIdx; {
		hold := sh.hs.at(hi)
		if !fn(hold.num, hold.node) {
			return
		}
		hi = hold.next
	}
}

// holderOf returns the LRU node of slot num's holder of ch, or nilIdx. Called with sh.mu held.
func (sh *shard) holderOf(ch *chunk, num uint16) int32 {
	if num < maskSlots && ch.mask&(1<<num) == 0 {
		return nilIdx
	}
	if n, node, ok := ch.inline(); ok {
		if n == num {
			return node
		}
		return nilIdx
	}
	for hi := ch.head; hi != nilIdx; {
		hold := sh.hs.at(hi)
		if hold.num == num {
			return hold.node
		}
		hi = hold.next
	}
	return nilIdx
}

// add links a new holder of h. Called with sh.mu held.
func (sh *shard) add(h uint64, num uint16, node int32) { sh.link(sh.chunks.put(h), num, node) }

// link adds a holder to ch, which put returned. Called with sh.mu held.
func (sh *shard) link(ch *chunk, num uint16, node int32) {
	if ch.head == nilIdx && inlinable(num, node) {
		ch.head = inlineHead(node)
		ch.mask |= 1 << num
		return
	}
	if n, inNode, ok := ch.inline(); ok { // a second holder: the first goes to the slab too
		hi := sh.hs.alloc() // does not move ch
		*sh.hs.at(hi) = holder{next: nilIdx, node: inNode, num: n}
		ch.head = hi
	}
	hi := sh.hs.alloc()
	*sh.hs.at(hi) = holder{next: ch.head, node: node, num: num}
	ch.head = hi
	if num < maskSlots {
		ch.mask |= 1 << num
	}
}

// remove unlinks slot num's holder of h, if any. Called with sh.mu held.
func (sh *shard) remove(h uint64, num uint16) {
	ch := sh.chunks.get(h)
	if ch == nil {
		return
	}
	if n, _, ok := ch.inline(); ok {
		if n == num {
			sh.chunks.del(h)
		}
		return
	}
	prev := int32(nilIdx)
	for hi := ch.head; hi != nilIdx; {
		hold := sh.hs.at(hi)
		if hold.num != num {
			prev, hi = hi, hold.next
			continue
		}
		if prev != nilIdx {
			sh.hs.at(prev).next = hold.next
		} else {
			ch.head = hold.next
		}
		if num < maskSlots {
			ch.mask &^= 1 << num
		}
		sh.hs.release(hi)
		if ch.head == nilIdx {
			sh.chunks.del(h)
		} else if last := *sh.hs.at(ch.head); last.next == nilIdx && inlinable(last.num, last.node) {
			// One holder left: back inline, as if it had been the only one all along.
			sh.hs.release(ch.head)
			ch.head = inlineHead(last.node)
		}
		return
	}
}

// drop is remove under sh's write lock.
func (sh *shard) drop(h uint64, num uint16) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.remove(h, num)
}
