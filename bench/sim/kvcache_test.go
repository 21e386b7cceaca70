package sim

import "testing"

func seq(start, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(start + i)
	}
	return s
}

func TestBlockHashChain(t *testing.T) {
	a := seq(0, 48)
	b := seq(0, 48)
	b[3] = 999 // differs in block 0 only
	c := seq(0, 48)
	c[40] = 999 // differs in block 2 only
	chain := func(seed uint64, toks []uint32) []uint64 {
		var hs []uint64
		parent := seed
		for k := 0; k+16 <= len(toks); k += 16 {
			parent = blockHash(parent, toks[k:k+16])
			hs = append(hs, parent)
		}
		return hs
	}
	ha, hb, hc := chain(1, a), chain(1, b), chain(1, c)
	hs := chain(2, a)
	for k := range 3 {
		if ha[k] == hb[k] {
			t.Errorf("block %d: a change in block 0 must change every later hash", k)
		}
		if ha[k] == hs[k] {
			t.Errorf("block %d: another seed (model/cache_salt) must change every hash", k)
		}
	}
	if ha[0] != hc[0] || ha[1] != hc[1] || ha[2] == hc[2] {
		t.Errorf("a change in block 2 must change only block 2: %x vs %x", ha, hc)
	}
	if again := chain(1, seq(0, 48)); again[2] != ha[2] {
		t.Error("hash is not deterministic")
	}
}

// fill allocates one block, registers it under h and releases it (a finished request's block).
func fill(c *kvCache, h uint64) int32 {
	b := c.allocate()
	c.register(b, h)
	c.release(b)
	return b
}

func TestKVCacheLRUEvictionOrder(t *testing.T) {
	c := newKVCache(4, 16)
	for h := uint64(1); h <= 4; h++ {
		fill(c, h)
	}
	// Use hash 1 again: it becomes the most recently used.
	b1, ok := c.lookup(1)
	if !ok {
		t.Fatal("hash 1 not cached")
	}
	c.touch(b1)
	c.release(b1)
	// Allocations now evict 2, 3, 4, then 1.
	for _, want := range []uint64{2, 3, 4, 1} {
		c.allocate()
		if _, ok := c.lookup(want); ok {
			t.Fatalf("hash %d should have been evicted next", want)
		}
	}
	if c.numFree() != 0 || len(c.byHash) != 0 {
		t.Fatalf("free=%d cached=%d, want 0, 0", c.numFree(), len(c.byHash))
	}
}

func TestKVCacheEmptyBlocksEvictedFirst(t *testing.T) {
	c := newKVCache(3, 16)
	fill(c, 10)
	b := c.allocate() // a block that never got a full hash (e.g. a partial last block)
	c.release(b)
	got := c.allocate()
	if got != b {
		t.Errorf("allocate took block %d, want the empty block %d before any cached one", got, b)
	}
	if _, ok := c.lookup(10); !ok {
		t.Error("cached block evicted while an empty one was free")
	}
}

func TestKVCachePinnedBlocksNotEvicted(t *testing.T) {
	c := newKVCache(3, 16)
	pinned := c.allocate()
	c.register(pinned, 7)
	for range 10 { // churn the other two blocks
		b := c.allocate()
		c.release(b)
	}
	if got, ok := c.lookup(7); !ok || got != pinned {
		t.Fatal("pinned block was evicted")
	}
	c.touch(pinned) // a second request shares it
	c.release(pinned)
	if c.numFree() != 2 {
		t.Fatalf("free = %d after one of two releases, want 2", c.numFree())
	}
	c.release(pinned)
	if c.numFree() != 3 {
		t.Fatalf("free = %d, want 3", c.numFree())
	}
}

func TestKVCacheDuplicateRegistration(t *testing.T) {
	c := newKVCache(2, 16)
	a, b := c.allocate(), c.allocate()
	c.register(a, 5)
	c.register(b, 5) // same prefix computed twice at once: first copy wins
	if got, _ := c.lookup(5); got != a {
		t.Fatalf("lookup(5) = %d, want %d", got, a)
	}
	c.release(a)
	c.release(b)
	if c.allocate() != b {
		t.Error("the unregistered duplicate should be reused first")
	}
}
