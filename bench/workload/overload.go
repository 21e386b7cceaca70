package workload

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// The overload workload: three tenants of one model pool, marked as a gateway marks them
// (Tenant.Headers), with the batch tenant's rate setting the fleet's load.
//
//   - chat: an interactive chat product. Sessions of ChatTurns turns arrive as a Poisson
//     process; every turn resends the history (the tenant's ChatSystemTokens system prompt,
//     the earlier questions and the replies received), a first question of ChatFirstTokens
//     words, follow-ups of ChatFollowTokens, ChatOutputTokens-token replies, ChatThinkMin–Max
//     between a reply and the next question. TTFT SLO ChatSLO, patience ChatPatience.
//     Priority ChatPriority. It offers ChatShare of the fleet's capacity.
//   - noisy: a second tenant of the same shape and priority (its own system prompt and
//     questions) sending NoisyFactor × chat's request rate.
//   - batch: document jobs. Single requests, Poisson, each a shared BatchInstructionTokens
//     instruction and its own document of BatchDocMin–BatchDocMax words, BatchOutputTokens
//     tokens out. Priority BatchPriority (lower), TTFT SLO BatchSLO, patience BatchPatience.
//     It offers the rest of the load: (Load − chat's and noisy's shares) of the capacity.
//
// Capacity is derived from the sims' step-cost model (StepCost.RequestCost): one replica does
// one second of model time per second, so a tenant offering share s of a fleet of R replicas
// sends s × R ÷ cost requests per second. With bench's sims (8B on an H100: StepBase 6 ms,
// 54 µs per prefill token + 1.5 µs per token per 1k of context, 40 µs per decoding sequence +
// 40 ns per context token, 8192-token steps) a batch request (6000-word document after a
// 200-word instruction, 256 out) costs ≈357 ms of prefill + ≈75 ms of decode = 433 ms, a chat
// turn 12.7 ms (mostly its 127 decode slots). So 2 replicas at --load 2 get chat 3.15, noisy
// 31.5 and batch 8.2 requests/s (0.02, 0.20 and 1.78 of the capacity). Overload's Params give
// the figures of a run (tenant_cost_ms, tenant_rate, tenant_share); the sims' engine, driven
// in model time over this mix, takes 1.08× the predicted time (TestOverloadCostMatchesEngine
// in bench).
//
// Sessions arrive open-loop, so overload builds queues instead of slowing the clients; within
// a chat session the next question waits for the reply (a person reads it), so the chat
// tenants' request rate falls a little when their replies are slow. A turn that expired or was
// refused leaves no reply in the history, and the session goes on.
const (
	ChatTurns        = 4
	ChatSystemTokens = 150
	ChatFirstTokens  = 120
	ChatFollowTokens = 40
	ChatOutputTokens = 128
	ChatThinkMin     = 2 * time.Second
	ChatThinkMax     = 6 * time.Second
	// ChatSLO: 500 ms of model time to the first token, the usual bar for a chat reply to
	// feel immediate; an unloaded replica answers a chat turn in one or two steps (≈20 ms).
	ChatSLO = 500 * time.Millisecond
	// ChatPatience: an interactive user who sees nothing for 10 s leaves (20 × the SLO).
	ChatPatience = 10 * time.Second
	ChatPriority = 1
	// ChatShare: chat offers 2% of the fleet's capacity and noisy, at 10× its rate, 20%:
	// together 22%, so the equal-priority band alone fits the fleet at any --load, and what
	// overloads it is the batch flood.
	ChatShare   = 0.02
	NoisyFactor = 10

	BatchInstructionTokens = 200
	BatchDocMin            = 4000
	BatchDocMax            = 8000
	BatchOutputTokens      = 256
	// BatchSLO: a document job is fine with its first token within 30 s of model time; its
	// client gives up after BatchPatience (60 s) without one.
	BatchSLO      = 30 * time.Second
	BatchPatience = 60 * time.Second
	BatchPriority = 0

	// msgTokens is the sim's chat template per message (role tags, newlines), in its tokens.
	msgTokens = 6
)

// Load presets of --load, as multiples of the fleet's capacity in offered GPU work: overload is
// the 2× saturation with the batch tenant flooding; light the flow-control-off-vs-on
// comparison, where flow control must cost nothing (the batch tenant then offers 0.28).
var LoadPresets = map[string]float64{"light": 0.5, "overload": 2}

// TenantNames are the overload workload's tenants, in report order.
var TenantNames = []string{"chat", "noisy", "batch"}

// OverloadParams are the overload workload's parameters.
type OverloadParams struct {
	// Replicas is the fleet size the rates are set for.
	Replicas int
	// Load is the offered GPU work ÷ the fleet's capacity (LoadPresets, FairLoad); in the
	// three-tenant mix at least chat's and noisy's shares together (0.22), the batch tenant
	// offering the rest.
	Load float64
	// Duration is the arrival window: sessions and batch jobs arrive in [0, Duration); the run
	// ends when the last of them has finished or expired.
	Duration time.Duration
	// Cost is the replicas' step-cost model.
	Cost StepCost
	// BlockSize is the replicas' KV-cache block size (a follow-up turn recomputes about half
	// a block of its history).
	BlockSize int
	// Mix picks the tenants: "" the three above (chat, noisy, batch), MixFair the fairness
	// scenario (light, heavy; fair.go), where Load is what both offer together.
	Mix string
	// Tenants limits the run to these tenants of the mix (nil: all); a tenant keeps its rate
	// and requests whichever others run, so "chat" alone measures chat's TTFT without the
	// others.
	Tenants []string
	Seed    uint64
}

// DefaultOverload is 2× saturation of 4 replicas for 60 s of model time.
func DefaultOverload() OverloadParams {
	return OverloadParams{Replicas: 4, Load: LoadPresets["overload"], Duration: time.Minute, BlockSize: 16, Seed: 1}
}

// chatCost is the mean model time of a chat turn on a saturated replica: turn 1 prefills the
// question after the cached system prompt; a later turn finds the earlier turns and the reply
// (generated tokens are cached too) and prefills its question and about half a block.
func chatCost(c StepCost, block int) float64 {
	ctx := ChatSystemTokens + msgTokens
	total := c.RequestCost(ctx, ChatFirstTokens+2*msgTokens, ChatOutputTokens)
	ctx += ChatFirstTokens + 2*msgTokens + ChatOutputTokens
	for t := 1; t < ChatTurns; t++ {
		u := ChatFollowTokens + 2*msgTokens + block/2
		total += c.RequestCost(ctx, u, ChatOutputTokens)
		ctx += ChatFollowTokens + 2*msgTokens + ChatOutputTokens
	}
	return float64(total) / float64(time.Millisecond) / ChatTurns
}

// batchCost is the model time of a batch job with a mean-sized document after the cached
// instruction.
func batchCost(c StepCost) float64 {
	doc := (BatchDocMin + BatchDocMax) / 2
	return float64(c.RequestCost(BatchInstructionTokens+msgTokens, doc+2*msgTokens, BatchOutputTokens)) / float64(time.Millisecond)
}

// OverloadTenants are the three tenants with their rates for p (all of them, whatever
// p.Tenants says).
func OverloadTenants(p OverloadParams) ([]*Tenant, error) {
	if p.Replicas < 1 {
		return nil, fmt.Errorf("overload: replicas must be >= 1")
	}
	band := ChatShare * (1 + NoisyFactor)
	if !(p.Load >= band) || math.IsInf(p.Load, 0) {
		return nil, fmt.Errorf("overload: --load %g is below what chat and noisy offer alone (%.2f of the capacity)", p.Load, band)
	}
	cc, bc := chatCost(p.Cost, p.BlockSize), batchCost(p.Cost)
	if cc <= 0 || bc <= 0 {
		return nil, fmt.Errorf("overload: the step-cost model gives no cost per request")
	}
	r := float64(p.Replicas)
	chatRate := ChatShare * r / (cc / 1000)
	chat := &Tenant{Name: "chat", APIKey: "sk-bench-chat-0001", FairnessID: "tenant-chat", Objective: "interactive",
		Priority: ChatPriority, SLO: ChatSLO, Patience: ChatPatience, Rate: chatRate, CostMs: cc, Share: ChatShare}
	noisy := *chat
	noisy.Name, noisy.APIKey, noisy.FairnessID = "noisy", "sk-bench-noisy-0002", "tenant-noisy"
	noisy.Rate, noisy.Share = NoisyFactor*chatRate, NoisyFactor*ChatShare
	bs := p.Load - band
	batch := &Tenant{Name: "batch", APIKey: "sk-bench-batch-0003", FairnessID: "tenant-batch", Objective: "batch",
		Priority: BatchPriority, SLO: BatchSLO, Patience: BatchPatience, Rate: bs * r / (bc / 1000), CostMs: bc, Share: bs}
	return []*Tenant{chat, &noisy, batch}, nil
}

// Overload builds the overload workload (see the constants above): every tenant's arrivals
// are its own seeded Poisson process over [0, Duration), its texts its own seeded words, so
// a tenant's requests are the same whichever others run.
func Overload(p OverloadParams) (*Workload, error) {
	if p.Duration <= 0 {
		return nil, fmt.Errorf("overload: duration must be > 0")
	}
	if p.BlockSize < 1 {
		return nil, fmt.Errorf("overload: block size must be >= 1")
	}
	all, names := []*Tenant(nil), TenantNames
	var err error
	switch p.Mix {
	case "":
		all, err = OverloadTenants(p)
	case MixFair:
		all, err = fairTenants(p)
		names = FairTenantNames
	default:
		err = fmt.Errorf("overload: unknown mix %q (want \"\" or %s)", p.Mix, MixFair)
	}
	if err != nil {
		return nil, err
	}
	var tenants []*Tenant
	for _, t := range all {
		if p.Tenants == nil || slices.Contains(p.Tenants, t.Name) {
			tenants = append(tenants, t)
		}
	}
	for _, n := range p.Tenants {
		if !slices.Contains(names, n) {
			return nil, fmt.Errorf("overload: unknown tenant %q (want some of %v)", n, names)
		}
	}
	if len(tenants) == 0 {
		return nil, fmt.Errorf("overload: no tenants")
	}
	var convs []*Conversation
	params := map[string]any{"load": p.Load, "duration_s": p.Duration.Seconds(), "seed": p.Seed,
		"capacity_replicas": p.Replicas}
	if p.Mix == MixFair {
		params["mix"], params["fair_factor"] = MixFair, FairFactor
		params["fair_system_tokens"], params["fair_question_tokens"], params["fair_output_tokens"] = FairSystemTokens, FairQuestionTokens, FairOutputTokens
	} else {
		params["chat_turns"], params["chat_output_tokens"] = ChatTurns, ChatOutputTokens
		params["batch_doc_tokens"], params["batch_output_tokens"] = fmt.Sprintf("%d-%d", BatchDocMin, BatchDocMax), BatchOutputTokens
	}
	rates, costs, shares := map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, t := range tenants {
		rates[t.Name], costs[t.Name], shares[t.Name] = t.Rate, t.CostMs, t.Share
		switch {
		case p.Mix == MixFair:
			convs = append(convs, fairRequests(t, p)...)
		case t.Name == "batch":
			convs = append(convs, batchJobs(t, p)...)
		default:
			convs = append(convs, chatSessions(t, p)...)
		}
	}
	params["tenant_rate"], params["tenant_cost_ms"], params["tenant_share"] = rates, costs, shares
	slices.SortStableFunc(convs, func(a, b *Conversation) int { return int(a.At - b.At) })
	for i, c := range convs {
		c.ID = i
	}
	if len(convs) == 0 {
		return nil, fmt.Errorf("overload: no arrivals in %s", p.Duration)
	}
	return &Workload{Name: "overload", API: Chat, Loop: Open, Conversations: convs, Tenants: tenants, Params: params}, nil
}

// poissonTimes are the arrival offsets in [0, d) of a Poisson process at rate per second.
func poissonTimes(rate float64, d time.Duration, seed uint64) []time.Duration {
	if rate <= 0 {
		return nil
	}
	r := NewRand(seed)
	var out []time.Duration
	for t := -math.Log(1-r.Float64()) / rate; t < d.Seconds(); t += -math.Log(1-r.Float64()) / rate {
		out = append(out, time.Duration(t*float64(time.Second)))
	}
	return out
}

func chatSessions(t *Tenant, p OverloadParams) []*Conversation {
	system := Words(Seed(p.Seed, "overload-system", t.Name), ChatSystemTokens)
	times := poissonTimes(t.Rate/ChatTurns, p.Duration, Seed(p.Seed, "overload-arrivals", t.Name))
	out := make([]*Conversation, len(times))
	for i, at := range times {
		r := NewRand(Seed(p.Seed, "overload-session", t.Name, i))
		turns := make([]Turn, ChatTurns)
		for k := range turns {
			n := ChatFollowTokens
			if k == 0 {
				n = ChatFirstTokens
			}
			turns[k] = Turn{User: Words(Seed(p.Seed, "overload-question", t.Name, i, k), n), MaxTokens: ChatOutputTokens}
			if k > 0 {
				turns[k].Think = uniformDur(r, ChatThinkMin, ChatThinkMax)
			}
		}
		out[i] = &Conversation{System: system, Turns: turns, At: at, Tenant: t}
	}
	return out
}

func batchJobs(t *Tenant, p OverloadParams) []*Conversation {
	instruction := "Summarize the document below for the weekly report. " + Words(Seed(p.Seed, "overload-instruction"), BatchInstructionTokens-8)
	times := poissonTimes(t.Rate, p.Duration, Seed(p.Seed, "overload-arrivals", t.Name))
	out := make([]*Conversation, len(times))
	for i, at := range times {
		r := NewRand(Seed(p.Seed, "overload-doc-size", i))
		n := BatchDocMin + r.IntN(BatchDocMax-BatchDocMin+1)
		out[i] = &Conversation{System: instruction, At: at, Tenant: t,
			Turns: []Turn{{User: Words(Seed(p.Seed, "overload-doc", i), n), MaxTokens: BatchOutputTokens}}}
	}
	return out
}
