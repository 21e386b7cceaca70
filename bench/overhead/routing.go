package overhead

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/internal/splitmix"
	"github.com/prefixlb/prefixlb/router"
	"github.com/prefixlb/prefixlb/router/index"
	"github.com/prefixlb/prefixlb/router/key"
)

// RoutingResult is the cost of the whole routing decision of mode prefix for one body size,
// measured in the harness process while no load runs: key.Build (parse, render, chunk
// hashes) + Prefix.Pick + Prefix.Learn, on a policy whose index already holds the workload's
// system prompts. With agent bodies most builds resume from the session's previous request
// (key's prefix memo) and a session's first request (1 in agentbody.DefaultSteps) is built in
// full, so p50 is the former and p99 the latter. The decisions keep InFlight requests
// dispatched (each released InFlight decisions later, as the saturation phase's closed loop
// releases a connection's request when the next one goes), so that the policy's load caps
// spread the sessions over the backends as they do under load: decided one at a time with
// nothing in flight, every request would go where the shared tools prompt is held, and one
// backend's KV capacity would churn through the working set of all the sessions.
type RoutingResult struct {
	BodyBytes  int     `json:"body_bytes"`
	Shape      string  `json:"body_shape"`
	Chunks     int     `json:"chunks"`
	Decisions  int     `json:"decisions"`
	InFlight   int     `json:"in_flight"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	BuildP50us float64 `json:"build_p50_us"`
	PickP50us  float64 `json:"pick_p50_us"`
	LearnP50us float64 `json:"learn_p50_us"`
	// The parts of the decision at the p99 of the whole: the means of build, pick and learn
	// over the decisions at or above its p99 (a session's first request, built in full).
	BuildTailUs float64        `json:"build_tail_us"`
	PickTailUs  float64        `json:"pick_tail_us"`
	LearnTailUs float64        `json:"learn_tail_us"`
	Reasons     map[string]int `json:"reasons"`
	// WarmDecisions is the decisions made before the timed ones, IndexFill the index's
	// entries over its capacity when the timing began.
	WarmDecisions int     `json:"warm_decisions"`
	IndexFill     float64 `json:"index_fill"`
}

// measureRouting times n routing decisions on bodies of wl over nb backends, with inFlight
// requests dispatched at each decision.
func measureRouting(wl *Workload, nb, n, inFlight int) (RoutingResult, error) {
	bs := make([]*backend.Backend, nb)
	for i := range bs {
		b, err := backend.New(fmt.Sprintf("http://10.0.0.%d:8000", i+1), 0, 1)
		if err != nil {
			return RoutingResult{}, err
		}
		bs[i] = b
	}
	pol := router.NewPrefix(router.PrefixOptions{ChunkTokens: key.DefaultChunkTokens, DefaultKVCacheTokens: BenchKVCacheTokens}, nil)
	pol.SetBackends(bs)
	kb := key.NewBuilder(key.DefaultChunkTokens)
	path := []byte(chatPath)
	var k key.Key
	var buf []byte
	leases := make([]backend.Lease, max(inFlight, 1))
	decide := func(i uint64) (build, pick, learn time.Duration, d router.Decision) {
		buf, _ = wl.Body(buf, i)
		t0 := time.Now()
		kb.Build(path, buf, &k)
		t1 := time.Now()
		d = pol.Pick(&k, bs)
		t2 := time.Now()
		pol.Learn(&k, d.Backend, d.MatchedChunks)
		t3 := time.Now()
		if inFlight > 0 {
			l := &leases[i%uint64(len(leases))]
			l.Release() // the request this connection sent before
			l.Begin(d.Backend, d.PrefillWork, 0, false)
		}
		return t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), d
	}
	// Warm up: learn the system prompts and warm the pools, then go on until the index is in
	// its steady state, at capacity (or no longer growing, for a working set that fits), at
	// most maxWarm decisions: a filling index pays slab and table growth (and the GC assists
	// that go with it) that a running proxy pays once.
	const minWarm, maxWarm, every = 200, 20_000, 500
	var capacity int64
	for _, s := range pol.Index().Stats(nil) {
		capacity += s.Capacity
	}
	base := uint64(1) << 40
	warm := uint64(0)
	for last := int64(-1); warm < maxWarm; warm++ {
		decide(base + warm)
		if warm >= minWarm && warm%every == 0 {
			e := pol.Index().Entries()
			if e >= capacity*95/100 || e == last {
				break
			}
			last = e
		}
	}
	fill := float64(pol.Index().Entries()) / float64(max(capacity, 1))
	total := make([]time.Duration, n)
	build := make([]time.Duration, n)
	pick := make([]time.Duration, n)
	learn := make([]time.Duration, n)
	reasons := map[string]int{}
	for i := range n {
		var d router.Decision
		// Right after the warm-up: an agent session's next request follows its previous one.
		build[i], pick[i], learn[i], d = decide(base + warm + uint64(i))
		reasons[d.Reason.String()]++
		total[i] = build[i] + pick[i] + learn[i]
	}
	if !k.OK {
		return RoutingResult{}, fmt.Errorf("routing: the workload's body did not parse")
	}
	return RoutingResult{
		BodyBytes: wl.Size, Shape: wl.Shape(), Chunks: len(k.Chunks), Decisions: n, InFlight: inFlight,
		P50us: pctUs(total, 50), P99us: pctUs(total, 99),
		BuildP50us: pctUs(build, 50), PickP50us: pctUs(pick, 50), LearnP50us: pctUs(learn, 50),
		BuildTailUs: tailUs(total, build, 99), PickTailUs: tailUs(total, pick, 99), LearnTailUs: tailUs(total, learn, 99),
		WarmDecisions: int(warm), IndexFill: fill,
		Reasons: reasons,
	}, nil
}

// tailUs is the mean of part over the decisions whose total is at or above total's p-th
// percentile, µs.
func tailUs(total, part []time.Duration, p float64) float64 {
	cut := pctUs(total, p) * 1e3
	var sum time.Duration
	n := 0
	for i, d := range total {
		if float64(d) >= cut {
			sum += part[i]
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n) / 1e3
}

func pctUs(ds []time.Duration, p float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(int(float64(len(s))*p/100), len(s)-1)
	return float64(s[i]) / 1e3
}

// IndexMemory is the prefix index's memory with Entries (chunk, backend) entries.
type IndexMemory struct {
	Entries       int64   `json:"entries"`
	Chunks        int     `json:"chunks"`
	BytesPerEntry float64 `json:"heap_bytes_per_entry"`
	HeapBytes     int64   `json:"heap_bytes"`
	RSSBytes      int64   `json:"process_rss_bytes"`
	RSSDeltaBytes int64   `json:"rss_delta_bytes"`
}

// measureIndex fills an index with n entries (8 backends; each prompt of 25 chunks recorded
// on two backends, as a shared prefix would be) with random 64-bit chunk hashes, and
// measures the live heap it holds and the process RSS.
func measureIndex(n int) (IndexMemory, error) {
	const nb, perPrompt = 8, 25
	per := int64(max(n/nb, 1))
	bs := make([]*backend.Backend, nb)
	for i := range bs {
		b, err := backend.New(fmt.Sprintf("http://10.0.1.%d:8000", i+1), per*key.DefaultChunkTokens, 1)
		if err != nil {
			return IndexMemory{}, err
		}
		bs[i] = b
	}
	pid := fmt.Sprint(os.Getpid())
	var with, without runtime.MemStats
	runtime.GC()
	debug.FreeOSMemory()
	rss0, _ := procStatusKB(pid, "VmRSS")
	x := index.New(index.Options{ChunkTokens: key.DefaultChunkTokens, MaxEntries: -1})
	x.SetBackends(bs)
	chunks := make([]uint64, perPrompt)
	now := time.Now()
	for p := 0; x.Entries() < per*nb; p++ { // every backend full (n rounded down to a multiple of 8)
		for i := range chunks {
			chunks[i] = splitmix.Next(uint64(p)<<8 | uint64(i))
		}
		x.Record(chunks, bs[p%nb], now)
		x.Record(chunks, bs[(p+1)%nb], now)
	}
	runtime.GC()
	runtime.ReadMemStats(&with)
	rss1, err := procStatusKB(pid, "VmRSS")
	if err != nil {
		return IndexMemory{}, err
	}
	m := IndexMemory{Entries: x.Entries(), Chunks: x.Chunks(), RSSBytes: rss1, RSSDeltaBytes: rss1 - rss0}
	// The heap the index holds: live heap with it less live heap once it is dropped, two
	// collections apart, so that what the rest of the process (the harness's servers winding
	// down) frees meanwhile is not taken off it; a difference across the whole fill read
	// negative when an earlier target's buffers were freed during it.
	runtime.KeepAlive(x)
	x = nil
	runtime.GC()
	runtime.ReadMemStats(&without)
	m.HeapBytes = int64(with.HeapAlloc) - int64(without.HeapAlloc)
	m.BytesPerEntry = float64(m.HeapBytes) / float64(m.Entries)
	return m, nil
}
