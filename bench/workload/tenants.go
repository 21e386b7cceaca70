package workload

import (
	"strconv"
	"time"
)

// Request headers that mark a tenant the way a gateway in front of prefixlb marks it: llm-d's
// names (an InferenceObjective's name, whose priority the objective sets, and the fairness ID
// that groups requests into a flow) and prefixlb's own. prefixlb does not read them yet; its
// flow control will, where the operator says a gateway sets them.
const (
	HeaderFairnessID = "x-llm-d-inference-fairness-id"
	HeaderObjective  = "x-llm-d-inference-objective"
	HeaderFlow       = "x-prefixlb-flow"
	HeaderPriority   = "x-prefixlb-priority"
)

// Tenant is one client of a multi-tenant workload: how its requests are marked, what it
// expects of them, and what it offers. Times are model time (the sims' GPU time): the load
// generator divides Patience by --speedup, and the report compares TTFT × speedup with SLO.
type Tenant struct {
	// Name labels the tenant in the report ("chat", "noisy", "batch").
	Name string
	// APIKey is sent as "Authorization: Bearer APIKey": a rule by API key is how an operator
	// without a gateway would tell tenants apart.
	APIKey string
	// FairnessID is sent as x-llm-d-inference-fairness-id and x-prefixlb-flow: the flow whose
	// fair share of GPU work the tenant's requests are charged to.
	FairnessID string
	// Objective is sent as x-llm-d-inference-objective: the InferenceObjective (in llm-d, the
	// thing that carries a priority) the requests belong to.
	Objective string
	// Priority is sent as x-prefixlb-priority: higher is served first; equal priorities share
	// by fair share; a negative one would be sheddable (none of the bench's tenants is).
	Priority int
	// SLO is the tenant's TTFT objective: a completed request with TTFT ≤ SLO counts toward
	// its goodput.
	SLO time.Duration
	// Patience is the client's deadline for the first token, from the request's due time: with
	// no first token by then the client gives up (cancels the request), and the request counts
	// as expired at the client. Once the first token arrives the client reads to the end. 0:
	// no deadline.
	Patience time.Duration
	// Rate is the tenant's offered request rate (requests per second; sessions arrive at Rate
	// ÷ turns per session). CostMs is the model time one of its requests adds to a saturated
	// replica (StepCost.RequestCost averaged over its turns) and Share the fleet's capacity it
	// offers: Rate × CostMs ÷ 1000 ÷ replicas.
	Rate   float64
	CostMs float64
	Share  float64
}

// Headers are the request headers that mark the tenant, in a fixed order.
func (t *Tenant) Headers() [][2]string {
	return [][2]string{
		{"Authorization", "Bearer " + t.APIKey},
		{HeaderFairnessID, t.FairnessID},
		{HeaderObjective, t.Objective},
		{HeaderFlow, t.FairnessID},
		{HeaderPriority, strconv.Itoa(t.Priority)},
	}
}

// StepCost is the simulated replicas' step-cost model (the fields of sim.Config of the same
// names; bench fills it from sim.DefaultConfig), from which the overload workload derives each
// tenant's GPU time per request and so the rates that put the fleet at a given load.
type StepCost struct {
	StepBase                   time.Duration
	PrefillPerToken            time.Duration
	PrefillPerTokenPerKContext time.Duration
	DecodePerSeq               time.Duration
	DecodePerContextToken      time.Duration
	// BudgetTokens is the token budget of one step (MaxNumBatchedTokens).
	BudgetTokens int
}

// RequestCost is the model time one request adds to a saturated engine: cached prompt tokens
// already in the replica's KV cache, uncached ones to prefill after them, output tokens to
// generate. A step costs StepBase + PrefillPerToken per prefill token + PrefillPerTokenPerKContext
// per prefill token per 1000 tokens of its context + DecodePerSeq per decoding sequence +
// DecodePerContextToken per context token of a decoding sequence; the first output token comes
// out of the step that ends the prefill, each later one takes a decode slot. Saturated, every
// step fills its token budget, so StepBase is shared by BudgetTokens tokens: each prefill or
// decode token carries StepBase ÷ BudgetTokens of it. So
//
//	prefill = uncached × (PrefillPerToken + StepBase/Budget)
//	        + PrefillPerTokenPerKContext × uncached × (cached + uncached/2) / 1000
//	decode  = (output−1) × (DecodePerSeq + StepBase/Budget
//	        + DecodePerContextToken × (cached + uncached + output/2))
//
// Below saturation steps are shorter than the budget and a request costs more StepBase per
// token; this is the cost at the load where capacity is decided.
func (c StepCost) RequestCost(cached, uncached, output int) time.Duration {
	base := 0.0
	if c.BudgetTokens > 0 {
		base = float64(c.StepBase) / float64(c.BudgetTokens)
	}
	u, ctx := float64(uncached), float64(cached)
	prefill := u*(float64(c.PrefillPerToken)+base) + float64(c.PrefillPerTokenPerKContext)*u*(ctx+u/2)/1000
	d := float64(max(output-1, 0))
	decode := d * (float64(c.DecodePerSeq) + base + float64(c.DecodePerContextToken)*(ctx+u+float64(output)/2))
	return time.Duration(prefill + decode)
}
