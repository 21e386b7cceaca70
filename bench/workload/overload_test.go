package workload

import (
	"math"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"
)

// simCost is bench's sims' step-cost model (sim.DefaultConfig), written out: this package
// does not import the sim.
var simCost = StepCost{StepBase: 6 * time.Millisecond, PrefillPerToken: 54 * time.Microsecond,
	PrefillPerTokenPerKContext: 1500 * time.Nanosecond, DecodePerSeq: 40 * time.Microsecond,
	DecodePerContextToken: 40 * time.Nanosecond, BudgetTokens: 8192}

func TestRequestCostByHand(t *testing.T) {
	c := StepCost{StepBase: 8 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond,
		PrefillPerTokenPerKContext: 2 * time.Microsecond, DecodePerSeq: 30 * time.Microsecond,
		DecodePerContextToken: 100 * time.Nanosecond, BudgetTokens: 8000}
	// base per token 1 µs. Prefill 1000 tokens after 2000 cached: 1000 × 51 µs + 2 µs × 1000 ×
	// (2000 + 500)/1000 = 51 ms + 5 ms. Decode 10 out: 9 × (30 + 1 + 0.1 × (3000 + 5)) µs =
	// 9 × 331.5 µs = 2.9835 ms.
	got := c.RequestCost(2000, 1000, 10)
	want := 56*time.Millisecond + 2983500*time.Nanosecond
	if got != want {
		t.Fatalf("RequestCost = %v, want %v", got, want)
	}
	if got := c.RequestCost(0, 0, 1); got != 0 {
		t.Fatalf("nothing to prefill or decode costs %v", got)
	}
}

func overloadParams(replicas int, load float64) OverloadParams {
	p := DefaultOverload()
	p.Replicas, p.Load, p.Cost = replicas, load, simCost
	return p
}

func TestOverloadTenantRates(t *testing.T) {
	for _, c := range []struct {
		replicas int
		load     float64
	}{{2, 2}, {4, 2}, {2, 0.5}, {3, 1}} {
		ts, err := OverloadTenants(overloadParams(c.replicas, c.load))
		if err != nil {
			t.Fatal(err)
		}
		chat, noisy, batch := ts[0], ts[1], ts[2]
		if chat.Name != "chat" || noisy.Name != "noisy" || batch.Name != "batch" {
			t.Fatalf("tenants %s, %s, %s", chat.Name, noisy.Name, batch.Name)
		}
		var offered float64
		for _, tn := range ts {
			// rate × GPU time per request = share of replicas' capacity
			if got := tn.Rate * tn.CostMs / 1000 / float64(c.replicas); math.Abs(got-tn.Share) > 1e-9 {
				t.Errorf("%s: rate %.3f × %.2f ms on %d replicas = %.4f of the capacity, share says %.4f", tn.Name, tn.Rate, tn.CostMs, c.replicas, got, tn.Share)
			}
			offered += tn.Share
		}
		if math.Abs(offered-c.load) > 1e-9 {
			t.Errorf("load %g: tenants offer %g", c.load, offered)
		}
		if noisy.Rate != NoisyFactor*chat.Rate || noisy.Priority != chat.Priority || batch.Priority >= chat.Priority {
			t.Errorf("noisy %.2f req/s prio %d, chat %.2f prio %d, batch prio %d", noisy.Rate, noisy.Priority, chat.Rate, chat.Priority, batch.Priority)
		}
		if math.Abs(chat.Share-ChatShare) > 1e-12 || chat.Rate <= 0 {
			t.Errorf("chat share %g rate %g", chat.Share, chat.Rate)
		}
	}
	// The figures the docs quote: 2 replicas at 2×.
	ts, _ := OverloadTenants(overloadParams(2, 2))
	for i, want := range []float64{3.15, 31.5, 8.22} {
		if math.Abs(ts[i].Rate-want)/want > 0.01 {
			t.Errorf("%s: %.3f req/s, the docs say %g", ts[i].Name, ts[i].Rate, want)
		}
	}
	if _, err := OverloadTenants(overloadParams(2, 0.2)); err == nil {
		t.Error("a load below chat's and noisy's own shares was accepted")
	}
	if _, err := OverloadTenants(overloadParams(0, 2)); err == nil {
		t.Error("0 replicas accepted")
	}
}

func TestOverloadArrivals(t *testing.T) {
	p := overloadParams(2, 2)
	p.Duration = 2 * time.Minute
	w, err := Overload(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Validate(); err != nil || w.Loop != Open || w.API != Chat {
		t.Fatalf("workload %v, loop %s, api %s", err, w.Loop, w.API)
	}
	perTenant := map[string]int{}
	firsts := map[string][]time.Duration{}
	for i, c := range w.Conversations {
		if c.ID != i || c.Tenant == nil {
			t.Fatalf("conversation %d: id %d, tenant %v", i, c.ID, c.Tenant)
		}
		if i > 0 && c.At < w.Conversations[i-1].At {
			t.Fatal("arrivals out of order: the open loop sends them in slice order")
		}
		if c.At < 0 || c.At >= p.Duration {
			t.Fatalf("arrival %s outside [0, %s)", c.At, p.Duration)
		}
		perTenant[c.Tenant.Name] += len(c.Turns)
		firsts[c.Tenant.Name] = append(firsts[c.Tenant.Name], c.At)
		switch c.Tenant.Name {
		case "batch":
			n := CountWords(c.Turns[0].User)
			if len(c.Turns) != 1 || n < BatchDocMin || n > BatchDocMax || c.Turns[0].MaxTokens != BatchOutputTokens {
				t.Fatalf("batch job: %d turns, %d words, max_tokens %d", len(c.Turns), n, c.Turns[0].MaxTokens)
			}
		default:
			if len(c.Turns) != ChatTurns || CountWords(c.System) != ChatSystemTokens || c.Turns[0].MaxTokens != ChatOutputTokens {
				t.Fatalf("%s session: %d turns, %d system words", c.Tenant.Name, len(c.Turns), CountWords(c.System))
			}
		}
	}
	// Each tenant's requests over the window match its rate (Poisson: within 4 standard
	// deviations of the session count), and the arrivals' gaps look exponential (coefficient
	// of variation ≈ 1).
	for _, tn := range w.Tenants {
		turns := ChatTurns
		if tn.Name == "batch" {
			turns = 1
		}
		mean := tn.Rate / float64(turns) * p.Duration.Seconds()
		got := float64(perTenant[tn.Name] / turns)
		if math.Abs(got-mean) > 4*math.Sqrt(mean) {
			t.Errorf("%s: %g arrivals in %s, expected %.1f", tn.Name, got, p.Duration, mean)
		}
		if cv := gapCV(firsts[tn.Name]); cv < 0.8 || cv > 1.2 {
			t.Errorf("%s: arrival gaps' coefficient of variation %.2f, a Poisson process has 1", tn.Name, cv)
		}
	}
}

func gapCV(at []time.Duration) float64 {
	var xs []float64
	for i := 1; i < len(at); i++ {
		xs = append(xs, (at[i] - at[i-1]).Seconds())
	}
	var sum, sq float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	for _, x := range xs {
		sq += (x - mean) * (x - mean)
	}
	return math.Sqrt(sq/float64(len(xs))) / mean
}

func TestOverloadTenantMarks(t *testing.T) {
	ts, err := OverloadTenants(overloadParams(2, 2))
	if err != nil {
		t.Fatal(err)
	}
	keys, flows := map[string]bool{}, map[string]bool{}
	for _, tn := range ts {
		h := tn.Headers()
		want := [][2]string{{"Authorization", "Bearer " + tn.APIKey}, {"x-llm-d-inference-fairness-id", tn.FairnessID},
			{"x-llm-d-inference-objective", tn.Objective}, {"x-prefixlb-flow", tn.FairnessID},
			{"x-prefixlb-priority", strconv.Itoa(tn.Priority)}}
		if !reflect.DeepEqual(h, want) {
			t.Errorf("%s headers %v, want %v", tn.Name, h, want)
		}
		if tn.APIKey == "" || tn.FairnessID == "" || tn.Objective == "" || keys[tn.APIKey] || flows[tn.FairnessID] {
			t.Errorf("%s: key %q, flow %q must be set and its own", tn.Name, tn.APIKey, tn.FairnessID)
		}
		keys[tn.APIKey], flows[tn.FairnessID] = true, true
		if tn.SLO <= 0 || tn.Patience <= tn.SLO {
			t.Errorf("%s: SLO %s, patience %s", tn.Name, tn.SLO, tn.Patience)
		}
	}
	if ts[0].Objective != ts[1].Objective || ts[0].Objective == ts[2].Objective {
		t.Error("chat and noisy share an objective (their priority), batch has its own")
	}
}

// digest is what the loadgen would send: each conversation's tenant, arrival, system and turns.
func digest(w *Workload) []string {
	var out []string
	for _, c := range w.Conversations {
		s := c.Tenant.Name + "|" + c.At.String() + "|" + c.System
		for _, t := range c.Turns {
			s += "|" + t.User + "|" + t.Think.String() + "|" + strconv.Itoa(t.MaxTokens)
		}
		out = append(out, s)
	}
	return out
}

func TestOverloadDeterministicBySeed(t *testing.T) {
	p := overloadParams(2, 2)
	p.Duration = 20 * time.Second
	checkSeedAndAlone(t, p, "chat")
	p.Tenants = []string{"chat", "nobody"}
	if _, err := Overload(p); err == nil {
		t.Fatal("an unknown tenant was accepted")
	}
}

// checkSeedAndAlone checks that p's workload is the same for the same seed and another for
// another, and that tenant run alone (--tenants) sends exactly its requests of the mix, at
// its rate: a tenant's requests do not depend on which others run.
func checkSeedAndAlone(t *testing.T, p OverloadParams, tenant string) {
	t.Helper()
	a, err := Overload(p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Overload(p)
	if !reflect.DeepEqual(digest(a), digest(b)) {
		t.Fatal("the same seed gave different workloads")
	}
	q := p
	q.Seed++
	if c, _ := Overload(q); reflect.DeepEqual(digest(a), digest(c)) {
		t.Fatal("another seed gave the same workload")
	}
	q = p
	q.Tenants = []string{tenant}
	alone, err := Overload(q)
	if err != nil {
		t.Fatal(err)
	}
	var inAll []string
	for i, s := range digest(a) {
		if a.Conversations[i].Tenant.Name == tenant {
			inAll = append(inAll, s)
		}
	}
	if got := digest(alone); len(got) == 0 || !slices.Equal(got, inAll) {
		t.Fatalf("%s alone sent %d requests, different from its %d with the others", tenant, len(got), len(inAll))
	}
	if len(alone.Tenants) != 1 || alone.Tenants[0].Rate != a.Tenants[0].Rate {
		t.Fatalf("%s alone must keep its rate", tenant)
	}
}
