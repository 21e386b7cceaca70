package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// kvCache is a paged KV cache with prefix caching, after vLLM V1's block pool:
//
//   - numBlocks fixed-size blocks; a block holding a full, computed run of blockSize tokens is
//     registered under its chained hash (blockHash), so any later request whose prompt has the
//     same prefix finds it;
//   - a block is pinned while any running request uses it (ref > 0);
//   - blocks with ref == 0 sit in one free list in LRU order: allocation pops the head and, if
//     the block was registered, evicts it (drops its hash). A released cached block goes to the
//     tail (most recently used); a released block that holds nothing reusable goes to the head.
//     A request releases its blocks last-first, so its deepest blocks are evicted before the
//     prefix it shares with others.
//
// It is not safe for concurrent use; the Engine owns it.
type kvCache struct {
	blockSize int
	blocks    []kvBlock
	byHash    map[uint64]int32
	head      int32 // least recently used free block, -1 if none
	tail      int32
	nfree     int
	// version counts releases and registrations; the engine retries a blocked admission only
	// when it changed.
	version uint64
	// ev records stores and evictions as KV events (nil: events off).
	ev *eventLog
}

type kvBlock struct {
	hash       uint64
	hashed     bool
	ref        int32
	prev, next int32 // free-list links, -1 = none
}

func newKVCache(numBlocks, blockSize int) *kvCache {
	c := &kvCache{
		blockSize: blockSize,
		blocks:    make([]kvBlock, numBlocks),
		byHash:    make(map[uint64]int32, numBlocks),
		head:      -1,
		tail:      -1,
	}
	for i := range c.blocks {
		c.blocks[i].prev, c.blocks[i].next = -1, -1
		c.pushTail(int32(i))
	}
	return c
}

// blockHash chains a block's hash to its parent's: xxhash64(parent ‖ ids), 8 + 4×len(ids) bytes,
// little endian, like vLLM's hash(parent_hash, token_ids). The first block's parent is the
// request's seed (model name + cache_salt), so equal text under another salt does not hit.
func blockHash(parent uint64, ids []uint32) uint64 {
	var buf [8 + 4*64]byte
	if len(ids) <= 64 {
		binary.LittleEndian.PutUint64(buf[:8], parent)
		for i, id := range ids {
			binary.LittleEndian.PutUint32(buf[8+4*i:], id)
		}
		return xxhash.Sum64(buf[:8+4*len(ids)])
	}
	d := xxhash.New()
	binary.LittleEndian.PutUint64(buf[:8], parent)
	_, _ = d.Write(buf[:8])
	for _, id := range ids {
		binary.LittleEndian.PutUint32(buf[:4], id)
		_, _ = d.Write(buf[:4])
	}
	return d.Sum64()
}

func (c *kvCache) numBlocks() int { return len(c.blocks) }
func (c *kvCache) numFree() int   { return c.nfree }
func (c *kvCache) numUsed() int   { return len(c.blocks) - c.nfree }

// lookup returns the block registered under h.
func (c *kvCache) lookup(h uint64) (int32, bool) {
	b, ok := c.byHash[h]
	return b, ok
}

// touch pins block b for one more request (a prefix hit).
func (c *kvCache) touch(b int32) {
	blk := &c.blocks[b]
	if blk.ref == 0 {
		c.unlink(b)
	}
	blk.ref++
}

// allocate pops the least recently used free block, evicting whatever it cached, and pins it.
// The caller checks numFree first.
func (c *kvCache) allocate() int32 {
	b := c.head
	if b < 0 {
		panic("sim: kv cache allocate with no free block")
	}
	c.unlink(b)
	blk := &c.blocks[b]
	if blk.hashed {
		if c.byHash[blk.hash] == b {
			delete(c.byHash, blk.hash)
			if c.ev != nil {
				c.ev.removed(blk.hash)
			}
		}
		blk.hashed = false
	}
	blk.ref = 1
	return b
}

// register records that pinned block b now holds the full block with hash h, and reports
// whether it did. If another block already holds h (two requests computed the same prefix at
// once), b stays unregistered and the first copy is the one found.
func (c *kvCache) register(b int32, h uint64) bool {
	blk := &c.blocks[b]
	if blk.hashed {
		return false
	}
	if _, dup := c.byHash[h]; dup {
		return false
	}
	c.byHash[h] = b
	blk.hash, blk.hashed = h, true
	c.version++
	return true
}

// release unpins block b once; at zero it becomes free (and evictable).
func (c *kvCache) release(b int32) {
	blk := &c.blocks[b]
	blk.ref--
	if blk.ref > 0 {
		return
	}
	if blk.ref < 0 {
		panic("sim: kv cache block released more often than pinned")
	}
	c.version++
	if blk.hashed {
		c.pushTail(b)
	} else {
		c.pushHead(b)
	}
}

func (c *kvCache) pushTail(b int32) {
	blk := &c.blocks[b]
	blk.prev, blk.next = c.tail, -1
	if c.tail >= 0 {
		c.blocks[c.tail].next = b
	} else {
		c.head = b
	}
	c.tail = b
	c.nfree++
}

func (c *kvCache) pushHead(b int32) {
	blk := &c.blocks[b]
	blk.prev, blk.next = -1, c.head
	if c.head >= 0 {
		c.blocks[c.head].prev = b
	} else {
		c.tail = b
	}
	c.head = b
	c.nfree++
}

func (c *kvCache) unlink(b int32) {
	blk := &c.blocks[b]
	if blk.prev >= 0 {
		c.blocks[blk.prev].next = blk.next
	} else {
		c.head = blk.next
	}
	if blk.next >= 0 {
		c.blocks[blk.next].prev = blk.prev
	} else {
		c.tail = blk.prev
	}
	blk.prev, blk.next = -1, -1
	c.nfree--
}
