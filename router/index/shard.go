// Shards: each maps chunk hashes (table.go) to the list of slots that hold them.

package index

import "sync"

// cacheLine is the size of a CPU cache line in bytes (x86-64 and most arm64 cores).
const cacheLine = 64

type shard struct {
	mu     sync.RWMutex
	chunks chunkTable
	hs     holderSlab
	_      [cacheLine]byte // keep neighbouring shards' locks off one cache line
}

// holder says that slot number num holds the chunk; node is the slot's LRU node for it.
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
	ni := sh.find(h, num)
	sh.mu.RUnlock()
	return ni
}

// holderOf returns the LRU node of slot num's holder of ch, or nilIdx. Called with sh.mu held.
func (sh *shard) holderOf(ch *chunk, num uint16) int32 {
	if num < maskSlots && ch.mask&(1<<num) == 0 {
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
	hi := sh.hs.alloc() // does not move ch
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
		}
		return
	}
}

// drop is remove under sh's write lock.
func (sh *shard) drop(h uint64, num uint16) {
	sh.mu.Lock()
	sh.remove(h, num)
	sh.mu.Unlock()
}
