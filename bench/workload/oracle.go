package workload

import "container/list"

// Oracle is the best cached-token ratio a trace allows, computed from its 512-token block ids:
// an LRU prefix cache over blocks with the replicas' caches pooled into one (no router can do
// better than one cache of the same total size, give or take LRU's own choices), and one
// infinite cache.
type Oracle struct {
	BlockTokens   int     `json:"block_tokens"`
	Replicas      int     `json:"replicas"`
	ReplicaTokens int64   `json:"replica_kv_tokens"`
	Requests      int     `json:"requests"`
	InputTokens   int64   `json:"input_tokens"`
	PooledRatio   float64 `json:"pooled_lru_ratio"`
	InfiniteRatio float64 `json:"infinite_ratio"`
}

// ComputeOracle replays rows through a pooled LRU of replicas × replicaTokens tokens and an
// infinite cache. A request hits the longest run of leading blocks present in the cache (prefix
// caching); hit tokens count whole blocks, the last block only its own tokens.
func ComputeOracle(rows []TraceRow, replicas int, replicaTokens int64) Oracle {
	o := Oracle{BlockTokens: MooncakeBlockTokens, Replicas: replicas, ReplicaTokens: replicaTokens, Requests: len(rows)}
	capBlocks := int(int64(replicas) * replicaTokens / MooncakeBlockTokens)
	lru := newBlockLRU(capBlocks)
	seen := map[int]struct{}{}
	var hitLRU, hitInf int64
	for _, r := range rows {
		o.InputTokens += int64(r.InputLength)
		prefixLRU, prefixInf := true, true
		for i, id := range r.HashIDs {
			bt := int64(min(MooncakeBlockTokens, r.InputLength-i*MooncakeBlockTokens))
			if bt <= 0 {
				break
			}
			if _, ok := seen[id]; ok && prefixInf {
				hitInf += bt
			} else {
				prefixInf = false
			}
			if lru.has(id) && prefixLRU {
				hitLRU += bt
			} else {
				prefixLRU = false
			}
			seen[id] = struct{}{}
		}
		// Touch deepest first so that the first blocks are the most recently used: an engine
		// frees a request's blocks tail first, so its prefix outlives its tail.
		for i := len(r.HashIDs) - 1; i >= 0; i-- {
			lru.touch(r.HashIDs[i])
		}
	}
	if o.InputTokens > 0 {
		o.PooledRatio = float64(hitLRU) / float64(o.InputTokens)
		o.InfiniteRatio = float64(hitInf) / float64(o.InputTokens)
	}
	return o
}

type blockLRU struct {
	cap   int
	order *list.List // front = most recent
	at    map[int]*list.Element
}

func newBlockLRU(capBlocks int) *blockLRU {
	return &blockLRU{cap: capBlocks, order: list.New(), at: map[int]*list.Element{}}
}

func (l *blockLRU) has(id int) bool { _, ok := l.at[id]; return ok }

func (l *blockLRU) touch(id int) {
	if l.cap <= 0 {
		return
	}
	if e, ok := l.at[id]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.at[id] = l.order.PushFront(id)
	for l.order.Len() > l.cap {
		e := l.order.Back()
		delete(l.at, e.Value.(int))
		l.order.Remove(e)
	}
}
