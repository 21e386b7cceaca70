// Shards: each maps chunk hashes (table.go) to the list of slots that hold them.

package index

import "sync"

type shard struct {
	mu     sync.RWMutex
	chunks chunkTable
	hs     holderSlab
	_      [64]byte // keep neighbouring shards' locks off one cache line
}

// holder says that slot holds the chunk; node is the slot's LRU node for it.
type holder struct {
	next int32 // next holder of the same chunk, -1 at the end
	node int32
	slot uint16
}

// maskSlots is the number of slots that chunk.mask covers.
const maskSlots = 32

// find returns the LRU node of slot's holder of h, or nilIdx. Called with sh.mu held.
func (sh *shard) find(h uint64, slot uint16) int32 {
	c := sh.chunks.get(h)
	if c == nil {
		return nilIdx
	}
	return sh.holderOf(c, slot)
}

// holderOf returns the LRU node of slot's holder of c, or nilIdx. Called with sh.mu held.
func (sh *shard) holderOf(c *chunk, slot uint16) int32 {
	if slot < maskSlots && c.mask&(1<<slot) == 0 {
		return nilIdx
	}
	for hi := c.head; hi != nilIdx; {
		hd := sh.hs.at(hi)
		if hd.slot == slot {
			return hd.node
		}
		hi = hd.next
	}
	return nilIdx
}

// add links a new holder of h. Called with sh.mu held.
func (sh *shard) add(h uint64, slot uint16, node int32) { sh.link(sh.chunks.put(h), slot, node) }

// link adds a holder to c, which put returned. Called with sh.mu held.
func (sh *shard) link(c *chunk, slot uint16, node int32) {
	hi := sh.hs.alloc() // does not move c
	*sh.hs.at(hi) = holder{next: c.head, node: node, slot: slot}
	c.head = hi
	if slot < maskSlots {
		c.mask |= 1 << slot
	}
}

// remove unlinks slot's holder of h, if any. Called with sh.mu held.
func (sh *shard) remove(h uint64, slot uint16) {
	c := sh.chunks.get(h)
	if c == nil {
		return
	}
	prev := int32(nilIdx)
	for hi := c.head; hi != nilIdx; {
		hd := sh.hs.at(hi)
		if hd.slot != slot {
			prev, hi = hi, hd.next
			continue
		}
		if prev != nilIdx {
			sh.hs.at(prev).next = hd.next
		} else {
			c.head = hd.next
		}
		if slot < maskSlots {
			c.mask &^= 1 << slot
		}
		sh.hs.release(hi)
		if c.head == nilIdx {
			sh.chunks.del(h)
		}
		return
	}
}
