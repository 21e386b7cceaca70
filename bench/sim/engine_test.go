package sim

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// testConfig is a small, round-numbered model so expected times can be computed by hand.
func testConfig() Config {
	c := DefaultConfig()
	c.NumGPUBlocks = 1000
	c.MaxNumBatchedTokens = 1000
	c.MaxNumSeqs = 8
	c.StepBase = time.Millisecond
	c.PrefillPerToken = time.Microsecond
	c.PrefillPerTokenPerKContext = 0
	c.DecodePerSeq = 100 * time.Microsecond
	c.DecodePerContextToken = 0
	return c
}

// clock drives an engine in model time, one step at a time: the injected clock of the tests.
type clock struct {
	t     *testing.T
	e     *Engine
	now   time.Duration
	steps int
}

// step runs one step; false if the engine had nothing to do.
func (c *clock) step() bool {
	d, ok := c.e.Schedule()
	if !ok {
		return false
	}
	c.now += d
	c.steps++
	c.e.Complete(c.now)
	checkInvariants(c.t, c.e)
	return true
}

// until steps until cond holds; it fails the test after limit steps.
func (c *clock) until(cond func() bool, limit int) {
	c.t.Helper()
	for i := 0; !cond(); i++ {
		if i == limit || !c.step() {
			c.t.Fatalf("condition not reached after %d steps", i)
		}
	}
}

func (c *clock) add(r *Request) {
	c.t.Helper()
	if err := c.e.Add(r, c.now); err != nil {
		c.t.Fatal(err)
	}
}

// checkInvariants: every block is either free or pinned exactly by the running requests, the
// cache never holds more than its capacity, and the hash index points at registered blocks.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	kv := e.kv
	refs := make(map[int32]int32)
	where := make(map[*Request]string)
	for _, r := range e.running {
		if where[r] != "" || r.state != stateRunning || len(r.blocks) < e.blocksFor(r.computed) || r.computed > r.seqLen() {
			t.Fatalf("running request: listed %q, state %d, %d blocks for %d computed of %d", where[r], r.state, len(r.blocks), r.computed, r.seqLen())
		}
		where[r] = "running"
		for _, b := range r.blocks {
			refs[b]++
		}
	}
	nwait := 0
	for _, r := range e.waiting[e.whead:] {
		if r == nil || r.state != stateWaiting {
			continue
		}
		if where[r] != "" || len(r.blocks) != 0 || r.computed != 0 {
			t.Fatalf("waiting request: listed %q, %d blocks, %d computed", where[r], len(r.blocks), r.computed)
		}
		where[r] = "waiting"
		nwait++
	}
	if nwait != e.nwait {
		t.Fatalf("%d requests waiting, nwait %d", nwait, e.nwait)
	}
	free := 0
	for i := kv.head; i >= 0; i = kv.blocks[i].next {
		if kv.blocks[i].ref != 0 {
			t.Fatalf("block %d in the free list has ref %d", i, kv.blocks[i].ref)
		}
		free++
	}
	if free != kv.nfree || free+len(refs) != kv.numBlocks() {
		t.Fatalf("free list %d, nfree %d, pinned %d, total %d", free, kv.nfree, len(refs), kv.numBlocks())
	}
	for b, n := range refs {
		if kv.blocks[b].ref != n {
			t.Fatalf("block %d: ref %d, pinned by %d requests", b, kv.blocks[b].ref, n)
		}
	}
	for h, b := range kv.byHash {
		if !kv.blocks[b].hashed || kv.blocks[b].hash != h {
			t.Fatalf("index entry %x -> block %d that does not hold it", h, b)
		}
	}
}

func prompt(start, n int) []uint32 { return seq(start, n) }

func TestPrefillTakesCeilPOverBSteps(t *testing.T) {
	for _, tt := range []struct{ p, budget int }{{1, 1000}, {999, 1000}, {1000, 1000}, {1001, 1000}, {8000, 1000}, {8001, 1000}, {5000, 2048}} {
		cfg := testConfig()
		cfg.MaxNumBatchedTokens = tt.budget
		cfg.NumGPUBlocks = 1000
		c := &clock{t: t, e: NewEngine(cfg)}
		r := NewRequest(prompt(0, tt.p), 1, 1, false, false)
		c.add(r)
		c.until(func() bool { return r.Generated() > 0 }, 100)
		want := (tt.p + tt.budget - 1) / tt.budget
		if c.steps != want {
			t.Errorf("P=%d B=%d: first token after %d steps, want %d", tt.p, tt.budget, c.steps, want)
		}
		// Step times: base per step + 1µs per prompt token.
		if wantT := time.Duration(want)*cfg.StepBase + time.Duration(tt.p)*cfg.PrefillPerToken; r.TTFT() != wantT {
			t.Errorf("P=%d B=%d: TTFT %v, want %v", tt.p, tt.budget, r.TTFT(), wantT)
		}
	}
}

func TestDecodeProducesExactlyMaxTokens(t *testing.T) {
	for _, maxTokens := range []int{1, 2, 17, 300} {
		c := &clock{t: t, e: NewEngine(testConfig())}
		r := NewRequest(prompt(0, 100), maxTokens, 1, false, true)
		c.add(r)
		c.until(r.Done, 1000)
		if r.Generated() != maxTokens {
			t.Errorf("max_tokens %d: generated %d", maxTokens, r.Generated())
		}
		if c.steps != maxTokens { // one prefill step yields token 1, then one step per token
			t.Errorf("max_tokens %d: %d steps, want %d", maxTokens, c.steps, maxTokens)
		}
		if c.step() {
			t.Error("engine not idle after the request finished")
		}
		s := c.e.Stats()
		if s.GenerationTokens != uint64(maxTokens) || s.RequestsFinished != 1 || s.Running != 0 || s.UsedBlocks != 0 {
			t.Errorf("stats after finish: %+v", s)
		}
	}
}

func TestCachedPrefixSkipsPrefill(t *testing.T) {
	cfg := testConfig()
	c := &clock{t: t, e: NewEngine(cfg)}
	p := prompt(0, 4000)
	a := NewRequest(append([]uint32(nil), p...), 4, 7, false, false)
	c.add(a)
	c.until(a.Done, 100)
	before := c.e.Stats()

	b := NewRequest(append(append([]uint32(nil), p...), 1, 2, 3), 4, 7, false, false) // same prefix, 3 more tokens
	c.add(b)
	c.until(b.Done, 100)
	after := c.e.Stats()

	if a.CachedTokens() != 0 {
		t.Errorf("first request cached %d tokens, want 0", a.CachedTokens())
	}
	if want := 4000 / 16 * 16; b.CachedTokens() != want {
		t.Errorf("second request cached %d tokens, want %d", b.CachedTokens(), want)
	}
	if b.TTFT() >= a.TTFT() {
		t.Errorf("TTFT cached %v, uncached %v: cached must be faster", b.TTFT(), a.TTFT())
	}
	if got := after.BatchedPrefillTokens - before.BatchedPrefillTokens; got != 3 {
		t.Errorf("second request prefilled %d tokens, want 3", got)
	}
	if after.PrefixQueries != 4000+4003 || after.PrefixHits != 4000 {
		t.Errorf("prefix queries %d hits %d, want 8003, 4000", after.PrefixQueries, after.PrefixHits)
	}

	// Same prompt under another seed (cache_salt) shares nothing.
	s := NewRequest(append([]uint32(nil), p...), 1, 8, false, false)
	c.add(s)
	c.until(s.Done, 100)
	if s.CachedTokens() != 0 {
		t.Errorf("salted request cached %d tokens, want 0", s.CachedTokens())
	}

	// An identical prompt recomputes at least its last token, as vLLM does.
	d := NewRequest(append([]uint32(nil), p...), 1, 7, false, false)
	c.add(d)
	c.until(d.Done, 100)
	if want := (4000 - 1) / 16 * 16; d.CachedTokens() != want {
		t.Errorf("identical request cached %d tokens, want %d", d.CachedTokens(), want)
	}
}

func TestGeneratedTokensAreCached(t *testing.T) {
	c := &clock{t: t, e: NewEngine(testConfig())}
	a := NewRequest(prompt(0, 40), 50, 7, false, false)
	c.add(a)
	c.until(a.Done, 100)
	next := append([]uint32(nil), a.tokens...) // prompt + generated, as the next turn echoes them
	next = append(next, prompt(500, 20)...)
	b := NewRequest(next, 1, 7, false, false)
	c.add(b)
	c.until(b.Done, 100)
	// KV exists for the prompt and all generated tokens but the last: 40+49 = 89 → 5 blocks.
	if b.CachedTokens() != 80 {
		t.Errorf("next turn cached %d tokens, want 80", b.CachedTokens())
	}
}

func TestMaxNumSeqsRespected(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 2
	c := &clock{t: t, e: NewEngine(cfg)}
	var rs []*Request
	for i := range 5 {
		r := NewRequest(prompt(i*1000, 50), 10, 1, false, false)
		c.add(r)
		rs = append(rs, r)
	}
	maxRunning := 0
	for c.step() {
		s := c.e.Stats()
		maxRunning = max(maxRunning, s.Running)
		if s.Running+s.Waiting+int(s.RequestsFinished) != 5 {
			t.Fatalf("requests lost: %+v", s)
		}
	}
	if maxRunning != 2 {
		t.Errorf("max running %d, want 2", maxRunning)
	}
	for i, r := range rs {
		if !r.Done() || r.Generated() != 10 {
			t.Errorf("request %d: done %v generated %d", i, r.Done(), r.Generated())
		}
	}
	// FCFS: the third request starts only when the first two finish.
	if rs[2].TTFT() <= rs[0].Latency() {
		t.Errorf("request 2 first token at %v, before request 0 finished at %v", rs[2].TTFT(), rs[0].Latency())
	}
}

func TestWaitsForKVBlocks(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 10 // 160 tokens
	c := &clock{t: t, e: NewEngine(cfg)}
	a := NewRequest(prompt(0, 100), 20, 1, false, false)    // 7 blocks for its prompt, 8 at the end
	b := NewRequest(prompt(1000, 60), 10, 1, false, false)  // 4 blocks for its prompt: must wait for a
	tiny := NewRequest(prompt(2000, 8), 8, 1, false, false) // 1 block, but FCFS keeps it behind b
	c.add(a)
	c.add(b)
	c.add(tiny)
	c.step()
	if s := c.e.Stats(); s.Running != 1 || s.Waiting != 2 || s.UsedBlocks != 7 {
		t.Fatalf("after step 1: %+v", s)
	}
	c.until(a.Done, 100)
	c.until(tiny.Done, 100)
	if b.TTFT() < a.Latency() || tiny.TTFT() < a.Latency() {
		t.Errorf("b or tiny started before a finished")
	}
	if s := c.e.Stats(); s.Preemptions != 0 {
		t.Errorf("%d preemptions, want none: nothing was admitted that could not grow", s.Preemptions)
	}
	if err := c.e.Add(NewRequest(prompt(0, 150), 20, 1, false, false), c.now); err == nil {
		t.Error("a request larger than the whole cache must be refused")
	}
}

// TestPreemption: admission checks only that a request's sequence fits now, so a running
// request that later needs a block preempts the most recently admitted running request, which
// goes back to the front of the queue, recomputes (finding what of it is still cached) and
// finishes with all its tokens, each produced once.
func TestPreemption(t *testing.T) {
	type req struct {
		p, max int
		at     int // step before which it is added
	}
	for _, tc := range []struct {
		name    string
		blocks  int
		budget  int
		reqs    []req
		victims []int // requests in the order of their first preemption
		count   uint64
		// recompute: request index → prefill tokens its first readmission computes (-1: not checked)
		recompute map[int]int
	}{
		{
			// a's first decode token needs a 7th block when b holds the other 4: b goes.
			name: "decode preempts the last admitted", blocks: 10, budget: 1000,
			reqs:    []req{{96, 10, 0}, {64, 10, 0}},
			victims: []int{1}, count: 1,
			// b computed 64 prompt tokens and emitted one; the block a took evicted b's deepest
			// block (the LRU head), so 3 blocks hit and 65-48 tokens are recomputed.
			recompute: map[int]int{1: 17},
		},
		{
			// a's decode takes c's blocks; later b's decode runs out while c still waits, and
			// b is then the last running request.
			name: "the last of three goes first", blocks: 12, budget: 1000,
			reqs:    []req{{96, 40, 0}, {48, 30, 0}, {48, 30, 0}},
			victims: []int{2, 1}, count: 2,
		},
		{
			// b is the last running request and its own decode runs out: it preempts itself.
			name: "the last admitted preempts itself", blocks: 10, budget: 1000,
			reqs:    []req{{100, 20, 0}, {40, 10, 0}},
			victims: []int{1},
		},
		{
			name: "a chunked prefill admitted beside later arrivals", blocks: 12, budget: 64,
			reqs:    []req{{160, 2, 0}, {30, 4, 2}},
			victims: []int{1}, count: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.NumGPUBlocks, cfg.MaxNumBatchedTokens = tc.blocks, tc.budget
			c := &clock{t: t, e: NewEngine(cfg)}
			rs := make([]*Request, len(tc.reqs))
			seen := make([]int, len(tc.reqs))
			var victims []int
			readmitPrefill := map[int]int{}
			for step := 0; ; step++ {
				for i, q := range tc.reqs {
					if q.at == step {
						rs[i] = NewRequest(prompt(10000*i, q.p), q.max, 1, false, true)
						c.add(rs[i])
					}
				}
				before := c.e.Stats().BatchedPrefillTokens
				waitingBefore := make([]bool, len(rs))
				for i, r := range rs {
					waitingBefore[i] = r != nil && r.state == stateWaiting && r.preemptions > 0
				}
				if !c.step() {
					break
				}
				if step > 1000 {
					t.Fatal("not drained after 1000 steps")
				}
				for i, r := range rs {
					if r == nil {
						continue
					}
					if r.preemptions > 0 && seen[i] == 0 {
						victims = append(victims, i)
						// The victim waits at the queue's front.
						if r.state != stateWaiting || c.e.peekWaiting() != r && !waitingBefore[i] {
							t.Errorf("step %d: victim %d not at the front of the waiting queue (state %d)", step, i, r.state)
						}
					}
					if waitingBefore[i] && r.state == stateRunning {
						if _, done := readmitPrefill[i]; !done {
							readmitPrefill[i] = int(c.e.Stats().BatchedPrefillTokens - before)
						}
					}
					seen[i] = r.preemptions
				}
			}
			if !slices.Equal(victims, tc.victims) {
				t.Errorf("victims %v, want %v", victims, tc.victims)
			}
			s := c.e.Stats()
			if s.Preemptions == 0 || tc.count != 0 && s.Preemptions != tc.count {
				t.Errorf("%d preemptions, want %d (>0)", s.Preemptions, tc.count)
			}
			var sum uint64
			for i, r := range rs {
				sum += uint64(r.preemptions)
				checkOutput(t, i, r)
			}
			if sum != s.Preemptions {
				t.Errorf("requests counted %d preemptions, engine %d", sum, s.Preemptions)
			}
			if !c.e.Idle() || s.UsedBlocks != 0 || s.RequestsFinished != uint64(len(rs)) {
				t.Errorf("not drained: %+v", s)
			}
			for i, want := range tc.recompute {
				if got := readmitPrefill[i]; got != want {
					t.Errorf("request %d recomputed %d tokens in its readmission step, want %d", i, got, want)
				}
			}
		})
	}
}

// checkOutput: r finished with exactly max_tokens tokens, the i-th being the i-th output token
// (none lost, none produced twice across preemptions).
func checkOutput(t *testing.T, i int, r *Request) {
	t.Helper()
	if !r.Done() || r.state != stateFinished || r.Generated() != r.maxTokens || len(r.tokens) != r.promptLen+r.maxTokens {
		t.Errorf("request %d: done %v state %d generated %d of %d, %d tokens", i, r.Done(), r.state, r.Generated(), r.maxTokens, len(r.tokens))
		return
	}
	for k := range r.maxTokens {
		if r.tokens[r.promptLen+k] != r.outputID(k) {
			t.Errorf("request %d: token %d is %d, want %d", i, k, r.tokens[r.promptLen+k], r.outputID(k))
			return
		}
	}
}

func TestAbortFreesSlotAndBlocks(t *testing.T) {
	c := &clock{t: t, e: NewEngine(testConfig())}
	r := NewRequest(prompt(0, 100), 1000, 1, false, false)
	w := NewRequest(prompt(0, 100), 10, 1, false, false)
	c.add(r)
	c.step()
	c.step()
	if _, ok := c.e.Schedule(); !ok {
		t.Fatal("nothing scheduled")
	}
	c.e.Abort(r) // between Schedule and Complete, as a disconnect in the middle of a step
	c.now += time.Millisecond
	c.e.Complete(c.now)
	checkInvariants(t, c.e)
	if s := c.e.Stats(); s.Running != 0 || s.UsedBlocks != 0 || s.RequestsAborted != 1 {
		t.Fatalf("after abort: %+v", s)
	}
	if !r.Done() || r.Generated() != 2 {
		t.Errorf("aborted request: done %v generated %d", r.Done(), r.Generated())
	}
	c.add(w)
	c.e.Abort(w) // waiting
	if c.step() || !c.e.Idle() {
		t.Error("aborted waiting request still scheduled")
	}
	// The aborted request's computed prompt blocks stay cached.
	x := NewRequest(prompt(0, 100), 1, 1, false, false)
	c.add(x)
	c.until(x.Done, 10)
	if x.CachedTokens() != 96 {
		t.Errorf("cached %d after abort, want 96", x.CachedTokens())
	}
}

func TestStepDurationModel(t *testing.T) {
	cfg := DefaultConfig()
	e := NewEngine(cfg)
	// 4 decoding sequences with 1000-token contexts and one 2000-token prefill in one step.
	for i := range 4 {
		r := NewRequest(prompt(i*10000, 999), 100, 1, false, false)
		if err := e.Add(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	d, _ := e.Schedule()
	e.Complete(d) // all four prefilled, first tokens out
	p := NewRequest(prompt(90000, 2000), 1, 1, false, false)
	if err := e.Add(p, d); err != nil {
		t.Fatal(err)
	}
	got, _ := e.Schedule()
	want := cfg.StepBase + 2000*cfg.PrefillPerToken +
		time.Duration(2000*1000.0/1000*float64(cfg.PrefillPerTokenPerKContext)) +
		4*cfg.DecodePerSeq + 4*1000*cfg.DecodePerContextToken
	if got != want {
		t.Errorf("step duration %v, want %v", got, want)
	}
	t.Logf("default model: this step takes %v", got)
}

// A random workload keeps every invariant at every step and finishes every request.
func TestRandomWorkloadInvariants(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 200
	cfg.MaxNumBatchedTokens = 256
	rng := rand.New(rand.NewPCG(1, 2))
	c := &clock{t: t, e: NewEngine(cfg)}
	var all []*Request
	for i := range 300 {
		if i%3 == 0 {
			c.step()
		}
		shared := prompt(0, rng.IntN(600))                                         // a shared system prompt of random length
		tail := prompt(10000+rng.IntN(50)*100, 1+rng.IntN(300))                    // one of 50 documents
		r := NewRequest(append(shared, tail...), 1+rng.IntN(400), 1, false, false) // long outputs: decodes outgrow the cache
		if err := c.e.Add(r, c.now); err != nil {
			continue // larger than the cache
		}
		all = append(all, r)
		if rng.IntN(10) == 0 {
			c.e.Abort(all[rng.IntN(len(all))])
		}
	}
	for c.step() {
	}
	s := c.e.Stats()
	if !c.e.Idle() || s.UsedBlocks != 0 {
		t.Fatalf("not drained: %+v", s)
	}
	if int(s.RequestsFinished+s.RequestsAborted) != len(all) {
		t.Fatalf("finished %d + aborted %d != %d", s.RequestsFinished, s.RequestsAborted, len(all))
	}
	var preempted uint64
	for i, r := range all {
		preempted += uint64(r.preemptions)
		if r.state != stateAborted {
			checkOutput(t, i, r)
		}
	}
	if s.Preemptions == 0 || preempted != s.Preemptions {
		t.Errorf("engine counted %d preemptions, requests %d (want > 0: the cache is small)", s.Preemptions, preempted)
	}
	if s.PrefixHits == 0 || s.CachedBlocks > cfg.NumGPUBlocks {
		t.Errorf("hits %d, cached blocks %d", s.PrefixHits, s.CachedBlocks)
	}
	t.Logf("%d requests, %d steps, %d preemptions, hit ratio %.2f", len(all), c.steps, s.Preemptions, float64(s.PrefixHits)/float64(s.PrefixQueries))
}

// TestHashAheadMatchesGenerated: hashing a request's blocks before it generated their tokens
// (as Predict does) gives the hashes of the tokens it then generates, so the blocks it
// registers are the ones a next turn finds.
func TestHashAheadMatchesGenerated(t *testing.T) {
	cfg := testConfig()
	for _, p := range []int{1, 15, 16, 40, 100} {
		c := &clock{t: t, e: NewEngine(cfg)}
		ahead := NewRequest(prompt(0, p), 70, 7, false, false)
		c.add(ahead)
		c.step()
		for k := range (p + 70) / 16 {
			c.e.hashOf(ahead, k) // before the tokens exist
		}
		early := append([]uint64(nil), ahead.hashes...)
		c.until(ahead.Done, 200)
		fresh := &Request{tokens: ahead.tokens, promptLen: p, seed: 7}
		for k, h := range early {
			if h != c.e.hashOf(fresh, k) {
				t.Fatalf("prompt %d: block %d hashed ahead differs from the generated one", p, k)
			}
		}
		next := NewRequest(append(append([]uint32(nil), ahead.tokens...), prompt(900, 5)...), 1, 7, false, false)
		c.add(next)
		c.until(next.Done, 200)
		if want := (p + 69) / 16 * 16; next.CachedTokens() != want {
			t.Errorf("prompt %d: next turn cached %d tokens, want %d", p, next.CachedTokens(), want)
		}
	}
}

// TestPreemptionsInMetrics: the engine's preemption count is exported under vLLM's name.
func TestPreemptionsInMetrics(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 10
	c := &clock{t: t, e: NewEngine(cfg)}
	a, b := NewRequest(prompt(0, 96), 10, 1, false, false), NewRequest(prompt(5000, 64), 10, 1, false, false)
	c.add(a)
	c.add(b)
	c.until(func() bool { return a.Done() && b.Done() }, 100)
	s := c.e.Stats()
	if s.Preemptions != 1 {
		t.Fatalf("%d preemptions, want 1", s.Preemptions)
	}
	var buf bytes.Buffer
	writeMetrics(&buf, &s, &cfg, 0)
	if want := "vllm:num_preemptions_total{engine=\"0\",model_name=\"" + cfg.Model + "\"} 1\n"; !strings.Contains(buf.String(), want) {
		t.Errorf("/metrics lacks %q", want)
	}
}
