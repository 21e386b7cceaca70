package kvevents

import (
	"encoding/binary"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Index is the exact per-replica index of cached blocks a KV-event router keeps, after
// Dynamo's KV indexer (lib/kv-router/src/indexer: a radix tree of block hashes, each node
// listing the workers that hold it). Like Dynamo, it does not trust the engine's hashes as
// content names: it re-hashes every stored block from its token ids with its own chained hash
// (SequenceHashes), and keeps the engine's hash only to apply the removal events that name it.
// A worker's overlap with a request is the longest run of the request's leading blocks it
// holds, which is the depth at which a walk of Dynamo's tree from the root drops the worker.
// Safe for concurrent use.
type Index struct {
	mu      sync.RWMutex
	workers map[string]*workerBlocks
}

type workerBlocks struct {
	byEngine map[uint64]uint64 // engine block hash → sequence hash
	held     map[uint64]int32  // sequence hash → engine blocks holding it
	stats    IndexStats
}

// IndexStats counts, per worker, what the index applied and what it refused.
type IndexStats struct {
	Stored, Removed, Cleared uint64
	// UnknownParent counts BlockStored events whose parent the index does not hold (its
	// store was missed): dropped, as Dynamo drops them.
	UnknownParent uint64
	// UnknownRemoved counts removals of blocks the index does not hold.
	UnknownRemoved uint64
	// Malformed counts events whose token ids do not fill their blocks.
	Malformed uint64
}

// NewIndex returns an empty index.
func NewIndex() *Index { return &Index{workers: map[string]*workerBlocks{}} }

// SequenceHashes appends to dst the chained hash of each full block of tokens (blockSize
// tokens each; a partial tail has none): block i's is xxhash64 of block i−1's (0 for the
// first) and its token ids, little endian. The index names blocks by these; a router hashes a
// request's prompt with it to look the prompt up.
func SequenceHashes(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	var parent uint64
	buf := make([]byte, 8+4*blockSize)
	for i := 0; (i+1)*blockSize <= len(tokens); i++ {
		parent = chainHash(buf, parent, tokens[i*blockSize:(i+1)*blockSize])
		dst = append(dst, parent)
	}
	return dst
}

func chainHash(buf []byte, parent uint64, ids []uint32) uint64 {
	binary.LittleEndian.PutUint64(buf, parent)
	for i, id := range ids {
		binary.LittleEndian.PutUint32(buf[8+4*i:], id)
	}
	return xxhash.Sum64(buf[:8+4*len(ids)])
}

func (x *Index) worker(name string) *workerBlocks {
	w := x.workers[name]
	if w == nil {
		w = &workerBlocks{byEngine: map[uint64]uint64{}, held: map[uint64]int32{}}
		x.workers[name] = w
	}
	return w
}

// Apply applies one batch of worker's events, in order.
func (x *Index) Apply(worker string, b *Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	w := x.worker(worker)
	for i := range b.Events {
		w.apply(&b.Events[i])
	}
}

func (w *workerBlocks) apply(e *Event) {
	switch e.Kind {
	case KindBlockStored:
		bs := e.BlockSize
		if bs <= 0 || len(e.TokenIDs) < bs*len(e.BlockHashes) {
			w.stats.Malformed++
			return
		}
		var parent uint64
		if e.HasParent {
			p, ok := w.byEngine[e.Parent]
			if !ok {
				w.stats.UnknownParent++
				return
			}
			parent = p
		}
		buf := make([]byte, 8+4*bs)
		for i, h := range e.BlockHashes {
			parent = chainHash(buf, parent, e.TokenIDs[i*bs:(i+1)*bs])
			if old, ok := w.byEngine[h]; ok { // stored again without a removal: replace
				w.drop(old)
			}
			w.byEngine[h] = parent
			w.held[parent]++
			w.stats.Stored++
		}
	case KindBlockRemoved:
		for _, h := range e.BlockHashes {
			seq, ok := w.byEngine[h]
			if !ok {
				w.stats.UnknownRemoved++
				continue
			}
			delete(w.byEngine, h)
			w.drop(seq)
			w.stats.Removed++
		}
	case KindAllBlocksCleared:
		clear(w.byEngine)
		clear(w.held)
		w.stats.Cleared++
	}
}

func (w *workerBlocks) drop(seq uint64) {
	if w.held[seq] <= 1 {
		delete(w.held, seq)
	} else {
		w.held[seq]--
	}
}

// Overlap returns how many of seqs' leading blocks worker holds.
func (x *Index) Overlap(worker string, seqs []uint64) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	w := x.workers[worker]
	if w == nil {
		return 0
	}
	n := 0
	for _, h := range seqs {
		if w.held[h] == 0 {
			break
		}
		n++
	}
	return n
}

// Blocks returns how many distinct blocks worker holds.
func (x *Index) Blocks(worker string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if w := x.workers[worker]; w != nil {
		return len(w.held)
	}
	return 0
}

// Holds reports whether worker holds the block with sequence hash seq.
func (x *Index) Holds(worker string, seq uint64) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	w := x.workers[worker]
	return w != nil && w.held[seq] > 0
}

// Stats returns worker's counts.
func (x *Index) Stats(worker string) IndexStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if w := x.workers[worker]; w != nil {
		return w.stats
	}
	return IndexStats{}
}

// EngineHashes returns the engine hashes of the blocks worker holds, sorted.
func (x *Index) EngineHashes(worker string) []uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	w := x.workers[worker]
	if w == nil {
		return nil
	}
	out := make([]uint64, 0, len(w.byEngine))
	for h := range w.byEngine {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}
