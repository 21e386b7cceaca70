package report

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/loadgen"
	"github.com/prefixlb/prefixlb/bench/workload"
)

func TestJain(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{1, 1}, 1},
		{[]float64{3, 3, 3}, 1},
		{[]float64{1, 0}, 0.5},
		{[]float64{5, 0, 0, 0}, 0.25},
		{[]float64{1, 10}, 121.0 / 202},
		{[]float64{1, 2, 3}, 36.0 / 42},
	} {
		if got := Jain(c.xs); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Jain(%v) = %g, want %g", c.xs, got, c.want)
		}
	}
	for _, xs := range [][]float64{nil, {0, 0}} {
		if got := Jain(xs); !math.IsNaN(got) {
			t.Errorf("Jain(%v) = %g, want NaN", xs, got)
		}
	}
}

func TestSpans(t *testing.T) {
	m := merge([]span{{6, 8}, {0, 2}, {1, 3}, {3, 4}, {9, 9}})
	if want := []span{{0, 4}, {6, 8}}; !reflect.DeepEqual(m, want) {
		t.Fatalf("merge = %v, want %v", m, want)
	}
	if got, want := intersect(m, []span{{2, 7}}), []span{{2, 4}, {6, 7}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("intersect = %v, want %v", got, want)
	}
	if intersect(m, nil) != nil {
		t.Fatal("intersection with nothing is not empty")
	}
	for _, c := range []struct {
		t  time.Duration
		in bool
	}{{0, true}, {4, true}, {5, false}, {6, true}, {8, true}, {9, false}, {-1, false}} {
		if contains(m, c.t) != c.in {
			t.Errorf("contains(%v, %d) = %v", m, c.t, !c.in)
		}
	}
}

const ms = time.Millisecond

func gaps(n int, d time.Duration) []time.Duration {
	g := make([]time.Duration, n)
	for i := range g {
		g[i] = d
	}
	return g
}

func TestSummarizeTenants(t *testing.T) {
	a := &workload.Tenant{Name: "a", Priority: 1, SLO: 100 * ms}
	b := &workload.Tenant{Name: "b", Priority: 1, SLO: 100 * ms}
	c := &workload.Tenant{Name: "c", Priority: 0, SLO: time.Second}
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	out := &loadgen.Outcome{Start: t0, End: at(time.Second), Results: []loadgen.Result{
		// a: within its SLO (50 ms wall at speedup 2), work 60 + 3
		{Tenant: "a", Scheduled: at(0), TTFT: 40 * ms, ITL: gaps(2, 10*ms), E2E: 60 * ms, Status: 200,
			UsageSeen: true, PromptTokens: 100, CachedTokens: 40, OutputTokens: 3},
		// a: completed over its SLO, work 10 + 1
		{Tenant: "a", Scheduled: at(100 * ms), TTFT: 80 * ms, E2E: 80 * ms, Status: 200,
			UsageSeen: true, PromptTokens: 10, OutputTokens: 1},
		// a: its client gave up
		{Tenant: "a", Scheduled: at(200 * ms), E2E: 500 * ms, Err: loadgen.ExpiredReason, Expired: true},
		// b: two refusals by reason, a broken stream, one completed (work 5 + 2)
		{Tenant: "b", Scheduled: at(0), E2E: ms, Status: 429, Err: "status 429", ErrorCode: "queue_full"},
		{Tenant: "b", Scheduled: at(0), E2E: ms, Status: 503, Err: "status 503", ErrorCode: "prefixlb_503"},
		{Tenant: "b", Scheduled: at(0), E2E: ms, Status: 502, Err: "status 502"},
		{Tenant: "b", Scheduled: at(0), E2E: 30 * ms, Status: 200, Err: "truncated stream"},
		{Tenant: "b", Scheduled: at(0), TTFT: 20 * ms, ITL: gaps(1, 5*ms), E2E: 25 * ms, Status: 200,
			UsageSeen: true, PromptTokens: 5, OutputTokens: 2},
		// c: completed within 500 ms wall, work 900 + 19 (uncached unknown: no usage → 0 + 19)
		{Tenant: "c", Scheduled: at(0), TTFT: 400 * ms, ITL: gaps(18, ms), E2E: 420 * ms, Status: 200,
			UsageSeen: true, PromptTokens: 1000, CachedTokens: 100, OutputTokens: 19},
		{Tenant: "c", Scheduled: at(0), TTFT: 450 * ms, E2E: 450 * ms, Status: 200, OutputTokens: 1},
		// not a tenant of the workload: ignored
		{Tenant: "", Scheduled: at(0), TTFT: ms, E2E: ms, Status: 200, OutputTokens: 1000},
	}}
	rows, fair := SummarizeTenants(out, []*workload.Tenant{a, b, c}, 2)
	want := []Tenant{
		{Name: "a", Priority: 1, Requests: 3, Completed: 2, Expired: 1, SLOMs: 50, WithinSLO: 1, GoodputRPS: 1,
			GoodputShare: 1.0 / 3, UncachedPromptTokens: 70, OutputTokens: 4, GPUWorkTokens: 74},
		{Name: "b", Priority: 1, Requests: 5, Completed: 1, Refused: 2, Failed: 2,
			RefusedReasons: map[string]int{"429 queue_full": 1, "503 prefixlb_503": 1},
			FailedReasons:  map[string]int{"status 502": 1, "truncated stream": 1},
			SLOMs:          50, WithinSLO: 1, GoodputRPS: 1, GoodputShare: 0.2, UncachedPromptTokens: 5, OutputTokens: 2, GPUWorkTokens: 7},
		{Name: "c", Priority: 0, Requests: 2, Completed: 2, SLOMs: 500, WithinSLO: 2, GoodputRPS: 2, GoodputShare: 1,
			UncachedPromptTokens: 900, OutputTokens: 20, GPUWorkTokens: 920},
	}
	for i := range rows {
		if rows[i].TTFT.Count != int64(rows[i].Completed) {
			t.Errorf("%s: TTFT over %d requests, %d completed", rows[i].Name, rows[i].TTFT.Count, rows[i].Completed)
		}
		rows[i].TTFT = Latency{}
		want[i].GPUWorkShare = float64(want[i].GPUWorkTokens) / (74 + 7 + 920)
		if math.Abs(rows[i].GPUWorkShare-want[i].GPUWorkShare) < 1e-12 {
			rows[i].GPUWorkShare = want[i].GPUWorkShare
		}
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("rows\n%+v\nwant\n%+v", rows, want)
	}
	if len(fair) != 1 || fair[0].Priority != 1 || !reflect.DeepEqual(fair[0].Tenants, []string{"a", "b"}) {
		t.Fatalf("fairness %+v: want one group, priority 1, a and b", fair)
	}
}

// Two tenants of one priority on a hand-made timeline (ms from the start), backlogged while a
// request is sent and not yet at its first token:
//
//	x1 due 0, first token 200, tokens 200…600 (5 of 5 out, 40 uncached): waits [0, 200)
//	x2 due 300, client gives up at 1000:                                   waits [300, 1000)
//	y1 due 100, sent 150, first token 550, tokens 550, 650, 750 (30 uncached): waits [150, 550)
//	y2 due 800, refused at 850:                                           waits [800, 850)
//
// Both backlogged [150, 200) ∪ [300, 550) ∪ [800, 850): 350 ms (the send lag counts: y1 is not
// at the router before 150). x's work there: x1's prefill and first token at 200 (41) and its
// tokens at 300, 400, 500 (3): 44; y's: y1's prefill and first token at 550 (31), its later
// tokens outside: 31. Jain 75² ÷ (2 × (44² + 31²)) = 5625/5794. z, alone at its priority, has
// no group. Under the client's view (due to end of stream) the answer would differ: x and y
// would be outstanding together over [100, 1000).
func TestFairnessWhileBacklogged(t *testing.T) {
	x := &workload.Tenant{Name: "x", Priority: 3, SLO: time.Second}
	y := &workload.Tenant{Name: "y", Priority: 3, SLO: time.Second}
	z := &workload.Tenant{Name: "z", Priority: 0, SLO: time.Second}
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	out := &loadgen.Outcome{Start: t0, End: t0.Add(2 * time.Second), Results: []loadgen.Result{
		{Tenant: "x", Scheduled: t0, TTFT: 200 * ms, ITL: gaps(4, 100*ms), E2E: 600 * ms, Status: 200,
			UsageSeen: true, PromptTokens: 100, CachedTokens: 60, OutputTokens: 5},
		{Tenant: "x", Scheduled: at(300 * ms), E2E: 700 * ms, Err: loadgen.ExpiredReason, Expired: true},
		{Tenant: "y", Scheduled: at(100 * ms), SendLag: 50 * ms, TTFT: 450 * ms, ITL: gaps(2, 100*ms), E2E: 650 * ms, Status: 200,
			UsageSeen: true, PromptTokens: 30, OutputTokens: 3},
		{Tenant: "y", Scheduled: at(800 * ms), E2E: 50 * ms, Status: 429, Err: "status 429", ErrorCode: "queue_full"},
		{Tenant: "z", Scheduled: t0, TTFT: 10 * ms, E2E: 2 * time.Second, Status: 200, UsageSeen: true, PromptTokens: 9000, OutputTokens: 1},
	}}
	_, fair := SummarizeTenants(out, []*workload.Tenant{x, y, z}, 1)
	if len(fair) != 1 {
		t.Fatalf("%d fairness groups, want 1 (z's priority has one tenant)", len(fair))
	}
	f := fair[0]
	if f.Backlog != BacklogWaiting || math.Abs(f.BackloggedS-0.35) > 1e-9 {
		t.Errorf("backlogged (%s) %.3f s, want 0.35", f.Backlog, f.BackloggedS)
	}
	if math.Abs(f.WorkTokens["x"]-44) > 1e-9 || math.Abs(f.WorkTokens["y"]-31) > 1e-9 {
		t.Errorf("work %v, want x 44, y 31", f.WorkTokens)
	}
	if f.Jain == nil || math.Abs(*f.Jain-5625.0/5794) > 1e-9 {
		t.Errorf("Jain %v, want %g", f.Jain, 5625.0/5794)
	}
	if math.Abs(f.Shares["x"]-44.0/75) > 1e-9 || math.Abs(f.Shares["y"]-31.0/75) > 1e-9 {
		t.Errorf("shares %v", f.Shares)
	}
	// Never both waiting (y's requests moved to after x's last wait): no work, no index.
	out.Results[2].Scheduled, out.Results[3].Scheduled = at(1100*ms), at(1200*ms)
	_, fair = SummarizeTenants(out, []*workload.Tenant{x, y}, 1)
	if fair[0].BackloggedS != 0 || fair[0].Jain != nil {
		t.Errorf("disjoint tenants: backlogged %.3f s, Jain %v", fair[0].BackloggedS, fair[0].Jain)
	}
}

// served is a request of tenant n due at the start (ms) that waited wait ms for its first token
// and streamed out tokens 10 ms apart, with uncached prompt tokens.
func served(n string, t0 time.Time, due, wait time.Duration, uncached, out int) loadgen.Result {
	return loadgen.Result{Tenant: n, Scheduled: t0.Add(due * ms), TTFT: wait * ms, ITL: gaps(out-1, 10*ms),
		E2E: wait*ms + time.Duration(out-1)*10*ms, Status: 200, UsageSeen: true, PromptTokens: uncached, OutputTokens: out}
}

// Timelines of a light and a heavy tenant of one priority, each keeping a request waiting over
// [0, 2000 ms) (a long wait whose reply brings no work: no usage, no tokens), with the work
// served to each inside that window known: what a fair router gives (equal), what FCFS gives a
// 10× sender (proportional to the offered work), and three tenants of one band. Work of the
// first tenant's request after the window does not count.
func TestFairnessSharesKnownAnswers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name  string
		work  map[string]int // requests of 100 uncached + 10 out served inside the window
		jain  float64
		share map[string]float64
	}{
		{"equal", map[string]int{"light": 5, "heavy": 5}, 1, map[string]float64{"light": 0.5, "heavy": 0.5}},
		{"proportional to 10× the rate", map[string]int{"light": 1, "heavy": 10}, 121.0 / 202, map[string]float64{"light": 1.0 / 11, "heavy": 10.0 / 11}},
		{"within 10% of equal", map[string]int{"light": 9, "heavy": 11}, 400.0 / 404, map[string]float64{"light": 0.45, "heavy": 0.55}},
		{"three tenants, one starved", map[string]int{"a": 2, "b": 2, "c": 0}, 2.0 / 3, map[string]float64{"a": 0.5, "b": 0.5, "c": 0}},
	} {
		var tenants []*workload.Tenant
		out := &loadgen.Outcome{Start: t0, End: t0.Add(3 * time.Second)}
		names := make([]string, 0, len(c.work))
		for n := range c.work {
			names = append(names, n)
		}
		slices.Sort(names)
		for i, n := range names {
			tenants = append(tenants, &workload.Tenant{Name: n, Priority: 1, SLO: time.Second})
			out.Results = append(out.Results, loadgen.Result{Tenant: n, Scheduled: t0, TTFT: 2 * time.Second, E2E: 2 * time.Second, Status: 200})
			for k := range c.work[n] {
				out.Results = append(out.Results, served(n, t0, time.Duration(100*k), 50, 100, 10))
			}
			if i == 0 {
				out.Results = append(out.Results, served(n, t0, 2100, 50, 5000, 10))
			}
		}
		_, fair := SummarizeTenants(out, tenants, 1)
		if len(fair) != 1 {
			t.Fatalf("%s: %d groups", c.name, len(fair))
		}
		f := fair[0]
		if math.Abs(f.BackloggedS-2) > 1e-9 {
			t.Errorf("%s: backlogged %.3f s, want 2", c.name, f.BackloggedS)
		}
		for _, n := range names {
			if want := float64(110 * c.work[n]); math.Abs(f.WorkTokens[n]-want) > 1e-9 {
				t.Errorf("%s: %s work %g, want %g", c.name, n, f.WorkTokens[n], want)
			}
			if math.Abs(f.Shares[n]-c.share[n]) > 1e-9 {
				t.Errorf("%s: %s share %g, want %g", c.name, n, f.Shares[n], c.share[n])
			}
		}
		if f.Jain == nil || math.Abs(*f.Jain-c.jain) > 1e-9 {
			t.Errorf("%s: Jain %v, want %g", c.name, f.Jain, c.jain)
		}
	}
}

func TestTenantTable(t *testing.T) {
	j := 0.5
	modes := []Mode{{Mode: "prefix", OutputTPS: 1234, Tenants: []Tenant{
		{Name: "chat", Priority: 1, Requests: 10, Completed: 7, Refused: 1, Expired: 2, RefusedReasons: map[string]int{"429 queue_full": 1},
			TTFT: Latency{P50: 10, P95: 20, P99: 30}, SLOMs: 62.5, WithinSLO: 5, GoodputRPS: 0.5, GoodputShare: 0.5, GPUWorkTokens: 100, GPUWorkShare: 0.25},
		{Name: "batch", Requests: 3, Expired: 3}},
		Fairness: []Fairness{{Priority: 1, Tenants: []string{"chat", "noisy"}, BackloggedS: 3, Shares: map[string]float64{"chat": 0, "noisy": 1}, Jain: &j}}}}
	s := TenantTable(modes)
	for _, want := range []string{
		"| prefix | chat | 1 | 10 | 7 | 1 | 2 | 0 | 10.0 | 20.0 | 30.0 | 62.5 | 0.50 | 0.500 | 100 | 0.250 |",
		"| prefix | batch | 0 | 3 | 0 | 0 | 3 | 0 | - | - | - |",
		"prefix, chat refused: 429 queue_full: 1.",
		"Jain's index over priority 1 (chat, noisy) while all were backlogged (3.0 s, each with a request sent and not yet at its first token): 0.500; GPU-work shares chat 0.000, noisy 1.000; output 1234 tok/s",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	if TenantTable([]Mode{{Mode: "prefix"}}) != "" {
		t.Error("a table for arms without tenants")
	}
}
