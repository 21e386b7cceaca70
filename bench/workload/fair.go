package workload

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The fair10x mix of the overload workload (OverloadParams.Mix = MixFair): the fairness
// scenario of two tenants of one priority with the same request shape, "light" and "heavy",
// heavy sending FairFactor × light's request rate. OverloadParams.Load is the offered GPU work
// of both together, so light offers Load ÷ (1 + FairFactor) of the fleet's capacity and heavy
// the rest; the preset (FairLoad "fair10x") gives light FairLightShare (0.6) and heavy 6.
//
// With light asking for more than half the capacity, a router that shares the fleet equally
// by GPU work keeps both tenants backlogged (each gets half, both ask for more), so their
// shares of work while both are backlogged can reach equal and Jain's index 1; under FCFS
// engines light gets about its part of the offered work, 1 ÷ (1 + FairFactor). The same run
// cannot show light's TTFT kept near its value alone: light asks 0.6 and a fair router serves
// it 0.5, so its queue grows for the whole window. That target wants a light share below one
// half (e.g. "fair10x:0.4"), where a fair router serves all light asks.
//
// A request is one turn, arriving as its tenant's Poisson process: the tenant's system prompt
// of FairSystemTokens words (the same for all its requests, cached after the first), its own
// question of FairQuestionTokens words, FairOutputTokens tokens out. Prefill-heavy on
// purpose: at 6.6× the capacity the rates stay within what a small machine's load generator
// sends (bench's sims: 132 ms of model time a request; 2 replicas at the preset get light 9.1
// and heavy 91 requests/s of model time). Both
// tenants have chat's TTFT SLO and patience.
const (
	MixFair            = "fair10x"
	FairFactor         = 10
	FairLightShare     = 0.6
	FairSystemTokens   = 400
	FairQuestionTokens = 2000
	FairOutputTokens   = 128
)

// FairTenantNames are the fair10x mix's tenants, in report order.
var FairTenantNames = []string{"light", "heavy"}

// FairLoad reads a --load value naming the fair10x mix: "fair10x" (light at FairLightShare of
// the capacity) or "fair10x:S" (light at S > 0). It returns the offered load of both tenants,
// (1 + FairFactor) × light's share; ok is false for a value that does not name the mix.
func FairLoad(s string) (load float64, ok bool, err error) {
	rest, found := strings.CutPrefix(s, MixFair)
	if !found {
		return 0, false, nil
	}
	light := FairLightShare
	if rest != "" {
		v, cut := strings.CutPrefix(rest, ":")
		f, perr := strconv.ParseFloat(v, 64)
		if !cut || perr != nil || !(f > 0) || math.IsInf(f, 0) {
			return 0, true, fmt.Errorf("--load %q: want %s or %s:S, S the light tenant's share of the capacity (> 0)", s, MixFair, MixFair)
		}
		light = f
	}
	return light * (1 + FairFactor), true, nil
}

// fairCost is the model time of a fair10x request on a saturated replica, its system prompt
// cached.
func fairCost(c StepCost) float64 {
	return float64(c.RequestCost(FairSystemTokens+msgTokens, FairQuestionTokens+2*msgTokens, FairOutputTokens)) / float64(time.Millisecond)
}

// fairTenants are light and heavy with their rates for p.
func fairTenants(p OverloadParams) ([]*Tenant, error) {
	if !(p.Load > 0) || math.IsInf(p.Load, 0) {
		return nil, fmt.Errorf("overload %s: load must be > 0", MixFair)
	}
	cost := fairCost(p.Cost)
	if cost <= 0 {
		return nil, fmt.Errorf("overload: the step-cost model gives no cost per request")
	}
	share := p.Load / (1 + FairFactor)
	light := &Tenant{Name: "light", APIKey: "sk-bench-light-0004", FairnessID: "tenant-light", Objective: "interactive",
		Priority: ChatPriority, SLO: ChatSLO, Patience: ChatPatience, Rate: share * float64(p.Replicas) / (cost / 1000), CostMs: cost, Share: share}
	heavy := *light
	heavy.Name, heavy.APIKey, heavy.FairnessID = "heavy", "sk-bench-heavy-0005", "tenant-heavy"
	heavy.Rate, heavy.Share = FairFactor*light.Rate, FairFactor*share
	return []*Tenant{light, &heavy}, nil
}

// fairRequests are t's requests: one-turn conversations at its Poisson arrivals.
func fairRequests(t *Tenant, p OverloadParams) []*Conversation {
	system := Words(Seed(p.Seed, "fair-system", t.Name), FairSystemTokens)
	times := poissonTimes(t.Rate, p.Duration, Seed(p.Seed, "fair-arrivals", t.Name))
	out := make([]*Conversation, len(times))
	for i, at := range times {
		out[i] = &Conversation{System: system, At: at, Tenant: t,
			Turns: []Turn{{User: Words(Seed(p.Seed, "fair-question", t.Name, i), FairQuestionTokens), MaxTokens: FairOutputTokens}}}
	}
	return out
}
