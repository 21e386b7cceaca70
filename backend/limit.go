// The concurrency limit a replica shows through its scrapes (HealthReport.LearnedLimit).

package backend

import "math"

// PersistentQueueScrapes is how many scrapes in a row must show a replica's waiting queue
// before what it runs is taken as its limit. vLLM V1 admits a request that arrives during a
// step at the next one, or a few steps later behind a long prompt's prefill chunks, so a
// scrape often catches a queue one engine step long at any load; two scrapes an interval
// apart (1 s by default) do not catch the same one, while a queue behind max_num_seqs or an
// exhausted KV cache persists across both (prefix+fc against prefix at light load: `bench
// compare --workload overload --load light --modes prefix,prefix+fc`).
const PersistentQueueScrapes = 2

// limitGrowth is how much a learned limit grows at a scrape that shows the replica running
// all of it with nothing waiting: it had room for what it ran, maybe for more. Each step past
// the real limit is a queue in the engine for two scrapes: at 2× overload a quarter gave the
// chat tenant a TTFT p95 of 1,288 ms wall, a sixteenth 432 ms, one request 469 ms (one run
// each, `bench compare --workload overload --modes prefix+fc --replicas 2 --speedup 4`). A limit kept
// from a moment of long prompts would otherwise hold short ones the replica could start,
// and under flow control, which holds requests at the limit, the replica would never show
// more; a limit grown too far shows a queue again within two scrapes and is learned anew.
const limitGrowth = 1.0625

// nextLimit is the learned concurrency limit after a scrape that showed running and waiting
// requests, the queue seen in queuedScrapes scrapes in a row (this one included), given the
// limit before (0: none). Pure:
//   - a persistent queue (PersistentQueueScrapes): the replica runs running at once and no
//     more now; that is the limit;
//   - a queue in this scrape only: unchanged (it may be one engine step's);
//   - no queue, the replica running at least the limit: it had room; the limit grows by
//     limitGrowth (at least 1);
//   - no queue, the replica running under half the limit: the load fell away from it, and
//     what it could run then says little of what it runs now; forgotten;
//   - otherwise unchanged.
func nextLimit(limit, running, waiting, queuedScrapes int64) int64 {
	switch {
	case waiting > 0 && queuedScrapes >= PersistentQueueScrapes:
		return max(running, 1)
	case waiting > 0, limit == 0:
		return limit
	case running >= limit:
		return max(limit+1, int64(math.Ceil(float64(limit)*limitGrowth)))
	case 2*running < limit:
		return 0
	}
	return limit
}
