// Batches: the lookups of many chunks of one prompt, grouped by shard, one lock per shard.

package index

import "sync"

// A long prompt's chunks are looked up in batches of up to batchChunks, each batch grouped by
// shard so that every shard it touches is locked once. Why: on x86 a lock's acquire and its
// release are each a locked instruction, a full fence, so that chunk by chunk every table
// probe (a cache miss once the index outgrows the CPU's caches) must finish before the next
// one starts. Within one read lock the probes of a shard's chunks are independent loads that
// the core overlaps. A 1 MB coding-agent prompt is ~3,500 chunks: one lock each made Match
// and Record's lookups most of the routing decision (BenchmarkRoutingDecision/body=1MB-agent).
//
// Short prompts gain nothing from it and would pay the grouping (a batch of n chunks over 64
// shards saves locks only once n is well above 64): Match looks up the first seqChunks
// chunks one at a time, and Record batches only more than seqChunks held chunks. The
// thresholds are set with BenchmarkRoutingDecision (./proxy/) at 16 KB and 1 MB bodies.
// Past those, Match cannot know how far a prompt is held before it looks, so it looks up
// growing batches, firstBatch chunks, then batchGrowth times more each time up to
// batchChunks: a prompt held for n chunks costs at most about batchGrowth × n lookups.
const (
	seqChunks   = 128
	batchChunks = 512
	firstBatch  = 256
	batchGrowth = 8
	// maxShards bounds the shards an Index has, so that a batch's per-shard counts fit on
	// the stack.
	maxShards = 64
)

// scratch is the working memory of one batched Match or Record (about 30 KiB), pooled so
// that neither allocates nor clears it per call.
type scratch struct {
	masks  [batchChunks]uint32
	nodes  [batchChunks]int32
	addH   [batchChunks]uint64 // a batch's new chunks (recordBatched)
	addN   [batchChunks]int32  // their nodes
	remH   [batchChunks]uint64 // the chunks evicted for them
	batch  batch
	rbatch batch
	seen   seenSet
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// batch groups the positions of up to batchChunks chunk hashes by shard. Its zero value is
// ready.
type batch struct {
	order [batchChunks]uint16 // positions in the batch, shard by shard
	start [maxShards + 1]uint16
}

// group fills b with the positions of hs (len(hs) ≤ batchChunks) grouped by x's shard.
// After it, shard i's positions are b.order[b.start[i]:b.start[i+1]], in the order of hs.
func (b *batch) group(x *Index, hs []uint64) {
	n := len(x.shards)
	clear(b.start[:n+1])
	for _, h := range hs {
		b.start[x.shardOf(norm(h))+1]++
	}
	for i := 1; i <= n; i++ {
		b.start[i] += b.start[i-1]
	}
	// Fill from the end, each shard's run back to front, so that start[i] ends where shard
	// i's run begins and every run keeps the order of hs.
	for p := len(hs) - 1; p >= 0; p-- {
		si := x.shardOf(norm(hs[p])) + 1
		b.start[si]--
		b.order[b.start[si]] = uint16(p)
	}
	// start[i+1] now holds where shard i's run begins; shift down by one.
	copy(b.start[:n], b.start[1:n+1])
	b.start[n] = uint16(len(hs))
}

// masksOf sets masks[p] to the holder mask of hs[p] (0: no backend holds it), locking each
// shard once. len(masks) == len(hs) ≤ batchChunks.
func (x *Index) masksOf(hs []uint64, masks []uint32, b *batch) {
	b.group(x, hs)
	for si := range x.shards {
		run := b.order[b.start[si]:b.start[si+1]]
		if len(run) == 0 {
			continue
		}
		x.shards[si].masks(hs, run, masks)
	}
}

// masks sets masks[p] for the positions p of run (masksOf), under sh's read lock.
func (sh *shard) masks(hs []uint64, run []uint16, masks []uint32) {
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	for _, p := range run {
		var m uint32
		if ch := sh.chunks.get(norm(hs[p])); ch != nil {
			m = ch.mask
		}
		masks[p] = m
	}
}

// nodes sets nodes[p] for the positions p of run still nilIdx to slot num's node of hs[p]
// (nodesOf), under sh's read lock.
func (sh *shard) nodes(hs []uint64, run []uint16, num uint16, nodes []int32) {
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	for _, p := range run {
		if nodes[p] == nilIdx {
			nodes[p] = sh.find(norm(hs[p]), num)
		}
	}
}

// nodesOf sets nodes[p] to s's LRU node of hs[p], or nilIdx when s does not hold it: from
// the recent cache where it remembers one, else looked up with each shard locked once (and
// then remembered). len(nodes) == len(hs) ≤ batchChunks. Called with s.mu held: only this
// slot adds or removes its own holders, so what the lookups find stays true until s changes
// its own entries.
func (x *Index) nodesOf(s *slot, hs []uint64, nodes []int32, b *batch) {
	missing := false
	for p, h := range hs {
		nodes[p] = s.recalled(norm(h))
		missing = missing || nodes[p] == nilIdx
	}
	if !missing {
		return
	}
	b.group(x, hs)
	for si := range x.shards {
		run := b.order[b.start[si]:b.start[si+1]]
		if len(run) == 0 {
			continue
		}
		for _, p := range run {
			if nodes[p] == nilIdx {
				x.shards[si].nodes(hs, run, s.num, nodes)
				break
			}
		}
	}
	for p, ni := range nodes {
		if ni != nilIdx {
			s.remember(norm(hs[p]), ni)
		}
	}
}

// seenSet maps the chunks one batch claimed to their nodes (recordBatched: a chunk a batch
// holds twice is claimed once): open addressing over twice a batch's chunks, emptied by
// deleting what was put.
type seenSet struct {
	keys  [2 * batchChunks]uint64 // 0: empty (hashes are normalised, never 0)
	nodes [2 * batchChunks]int32
}

const seenBits = 10 // log2(2 × batchChunks)

func (t *seenSet) slot(h uint64) int { return int((h * fibonacci) >> (64 - seenBits)) }

func (t *seenSet) get(h uint64) int32 {
	for i := t.slot(h); t.keys[i] != 0; i = (i + 1) & (len(t.keys) - 1) {
		if t.keys[i] == h {
			return t.nodes[i]
		}
	}
	return nilIdx
}

func (t *seenSet) put(h uint64, ni int32) {
	i := t.slot(h)
	for t.keys[i] != 0 && t.keys[i] != h {
		i = (i + 1) & (len(t.keys) - 1)
	}
	t.keys[i], t.nodes[i] = h, ni
}

// del removes h, which must be the most recently put key still in the set: deleting keys in
// the reverse order of their puts keeps every remaining key's probe run whole (its run holds
// only keys put before it), so the set ends empty without a clear.
func (t *seenSet) del(h uint64) {
	for i := t.slot(h); t.keys[i] != 0; i = (i + 1) & (len(t.keys) - 1) {
		if t.keys[i] == h {
			t.keys[i] = 0
			return
		}
	}
}
