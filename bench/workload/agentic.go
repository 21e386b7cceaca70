package workload

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/prefixlb/prefixlb/bench/sim"
)

// Agentic sessions: coding-agent conversations as Claude Code sends them.
//
// Where the numbers come from (nothing here is fitted to a trace by this project):
//   - prefixlb issue 14, item 3, which states the shape of real Claude Code traces: a shared
//     tools + system prompt of ~17k tokens per client version, a context that grows by tool
//     results to ~100k tokens over ~45 requests, think time median ~10 s, outputs median ~200
//     tokens with a long tail to ~1.5k, sub-agents that share the parent's prefix;
//   - ../shared/research/peers-2026.md §3: Dynamo's "agentic inference" digest (2026-03):
//     Claude Code sessions hit 85–97% of their prompt in cache per worker after the first call,
//     which is what a session that only appends (this generator) gives on a replica that keeps
//     its history;
//   - the same notes §7: the WEKA/AgentX Claude Code traces (HF semianalysisai/cc-traces-weka-*,
//     391 traces, via the llm-d blog 2026-10-06) carry sub-agents and tool calls, the structure
//     reproduced here; inference-perf's conversation_replay models the same session as a shared
//     system prompt, turns and a tool_call_latency_sec between them.
//
// The spreads (sigmas), the number of client versions, the share of the prefix that is the
// system message, the first user message's size, the sub-agent fraction and size, and the tool
// mix are the bench's own assumptions, marked as such below.

// AgenticParams shape the agentic workload. Token counts are the sim's tokens (one pseudo-word
// is one token, see text.go).
type AgenticParams struct {
	// Sessions is the number of top-level sessions (sub-agents come on top).
	Sessions int
	// Rate is the Poisson arrival rate of sessions per second (open loop).
	Rate float64
	// Versions is the number of client versions; each session uses one, drawn uniformly, and
	// sessions of one version share its tools + system prompt. Assumption: 3.
	Versions int
	// PrefixTokens is the median size of a version's tools + system prompt (published: ~17k).
	// Each version's own size is within ±PrefixJitter of it.
	PrefixTokens int
	PrefixJitter float64
	// SystemShare is the part of the prefix that is the system message; the rest is the tools'
	// JSON schemas. Assumption: 0.2.
	SystemShare float64
	// FirstUserTokens is the median size of a session's first user message (the task and the
	// project context the agent attaches). Assumption: 1000, lognormal sigma 0.5.
	FirstUserTokens int
	// Requests is the median number of requests per session (published: ~45), lognormal with
	// RequestsSigma (assumption: 0.35), within [MinRequests, 3 × Requests].
	Requests      int
	RequestsSigma float64
	// ContextTokens is the median prompt size of a session's last request (published: ~100k),
	// lognormal with ContextSigma (assumption: 0.2). Tool results fill the growth.
	ContextTokens int
	ContextSigma  float64
	// ToolResultSigma spreads the tool results of one session around their mean (lognormal;
	// assumption: 1.0, a few large file reads among many short shell outputs).
	ToolResultSigma float64
	// Think is the median wait between a reply and the next request (the tool running and the
	// agent deciding; published: ~10 s), lognormal with ThinkSigma (assumption: 0.6), within
	// [ThinkMin, ThinkMax].
	Think              time.Duration
	ThinkSigma         float64
	ThinkMin, ThinkMax time.Duration
	// OutputTokens is the median max_tokens of a request (published: ~200), lognormal with
	// OutputSigma, capped at MaxOutput (published: the tail reaches ~1.5k). OutputSigma 0.87
	// puts the 99th percentile at 1.5k: ln(1500/200)/2.326.
	OutputTokens int
	OutputSigma  float64
	MaxOutput    int
	// SubAgentFraction of sessions spawn one sub-agent (assumption: 0.25) of SubAgentRequests
	// median requests (assumption: 12, sigma 0.5).
	SubAgentFraction float64
	SubAgentRequests int
	// MaxModelLen caps every request's prompt + max_tokens (0: no cap); sessions are sized
	// below it with a margin for the chat template.
	MaxModelLen int
	Seed        uint64
}

// DefaultAgentic returns the published shape (the sources at the top of this file) with the
// bench's assumptions for the spreads, for 12 sessions at 0.1 sessions/s, sized under the
// sim's MaxModelLen.
func DefaultAgentic() AgenticParams {
	return AgenticParams{Sessions: 12, Rate: 0.1, Versions: 3, PrefixTokens: 17_000, PrefixJitter: 0.05,
		SystemShare: 0.2, FirstUserTokens: 1000, Requests: 45, RequestsSigma: 0.35,
		ContextTokens: 100_000, ContextSigma: 0.2, ToolResultSigma: 1.0,
		Think: 10 * time.Second, ThinkSigma: 0.6, ThinkMin: time.Second, ThinkMax: time.Minute,
		OutputTokens: 200, OutputSigma: 0.87, MaxOutput: 1500,
		SubAgentFraction: 0.25, SubAgentRequests: 12, MaxModelLen: sim.DefaultConfig().MaxModelLen, Seed: 1}
}

// Fixed sizes of the generator.
const (
	// MinRequests is the fewest requests a session makes.
	MinRequests    = 4
	minSubRequests = 2
	minOutput      = 16
	minToolResult  = 8
	// firstUserSigma spreads the first user message (assumption).
	firstUserSigma = 0.5
	// subAgentSigma spreads the sub-agents' request counts (assumption).
	subAgentSigma = 0.5
	// taskPromptWords is the sub-agent's task (its first user message); taskResultWords is
	// what the parent's Task call returns (the sub-agent's summary).
	taskPromptWords = 200
	taskResultWords = 400
	// modelLenMargin is kept free under MaxModelLen for the chat template and for replies whose
	// text retokenizes to a few more tokens than were generated.
	modelLenMargin = 0.03
)

// lognormal draws median × e^(sigma·N(0,1)).
func lognormal(r interface{ NormFloat64() float64 }, median, sigma float64) float64 {
	return median * math.Exp(sigma*r.NormFloat64())
}

func clampInt(v float64, lo, hi int) int {
	return max(lo, min(hi, int(math.Round(v))))
}

// turnOverhead is the sim-template tokens a tool turn adds besides the reply and the tool
// result: the tool call after the reply, the tool message's tags (bench/sim/request.go).
func turnOverhead(c ToolCall) int {
	return sim.CountTokens("<|end|>\n<|tool_call|>"+c.Function.Name+" "+c.Function.Arguments+"\n<|end|>\n<|tool id="+
		c.ID+"|>\n<|end|>\n<|assistant|>\n") - 1
}

type version struct {
	tools  json.RawMessage
	system string
	tokens int // tools + system, in sim tokens
}

// Agentic builds the agentic workload: Sessions top-level sessions arriving as a Poisson
// process, each on one client version's tools + system prompt, a first user message, then tool
// turns (the previous reply's tool call and its result); a SubAgentFraction of them fork a
// sub-agent from their history (Conversation.Fork), whose result comes back to the parent as
// the Task call's tool result. Errors: non-positive sizes or counts, a MaxModelLen that leaves
// no room for a session.
func Agentic(p AgenticParams) (*Workload, error) {
	if p.Sessions < 1 || p.Versions < 1 || p.PrefixTokens < 1 || p.Requests < 1 || p.ContextTokens < 1 ||
		p.OutputTokens < 1 || p.MaxOutput < 1 || p.FirstUserTokens < 1 || p.SubAgentRequests < 1 {
		return nil, fmt.Errorf("agentic: sessions, versions, prefix, requests, context, output and first-user tokens must be >= 1")
	}
	if p.Rate <= 0 || math.IsInf(p.Rate, 0) || math.IsNaN(p.Rate) {
		return nil, fmt.Errorf("agentic: rate must be > 0 sessions/s")
	}
	if p.ThinkMin < 0 || p.ThinkMax < p.ThinkMin || p.SubAgentFraction < 0 || p.SubAgentFraction > 1 {
		return nil, fmt.Errorf("agentic: think range %s..%s or sub-agent fraction %g is invalid", p.ThinkMin, p.ThinkMax, p.SubAgentFraction)
	}
	maxOut := max(minOutput, min(p.MaxOutput, p.OutputTokens*100))
	maxPrompt := math.MaxInt
	if p.MaxModelLen > 0 {
		maxPrompt = int(float64(p.MaxModelLen)*(1-modelLenMargin)) - maxOut
	}
	vr := NewRand(Seed(p.Seed, "agentic", "versions"))
	versions := make([]version, p.Versions)
	for v := range versions {
		size := int(float64(p.PrefixTokens) * (1 + p.PrefixJitter*(2*vr.Float64()-1)))
		sysWords := max(1, int(float64(size)*p.SystemShare))
		sys := fmt.Sprintf("You are a coding agent, client version 2.%d. ", v) + Words(Seed(p.Seed, "agentic-system", v), sysWords)
		tools := toolsJSON(p.Seed, v, max(1, size-sim.CountTokens(sys)))
		versions[v] = version{tools: tools, system: sys, tokens: sim.CountTokens(tools) + sim.CountTokens(sys)}
		if versions[v].tokens+p.FirstUserTokens >= maxPrompt {
			return nil, fmt.Errorf("agentic: a %d-token prefix does not fit a %d-token model length", versions[v].tokens, p.MaxModelLen)
		}
	}
	g := &agenticGen{p: p, versions: versions, maxOut: maxOut, maxPrompt: maxPrompt}
	var convs, subs []*Conversation
	for i := 0; i < p.Sessions; i++ {
		c, sub := g.session(i)
		convs = append(convs, c)
		if sub != nil {
			subs = append(subs, sub)
		}
	}
	AssignPoisson(convs, p.Rate, p.Seed)
	for j, s := range subs {
		s.ID = p.Sessions + j
		s.At = convs[s.Fork.Parent].At
	}
	convs = append(convs, subs...)
	w := &Workload{Name: "agentic", API: Chat, Loop: Open, Conversations: convs,
		Params: map[string]any{"sessions": p.Sessions, "sub_agents": len(subs), "rate": p.Rate, "versions": p.Versions,
			"prefix_tokens": p.PrefixTokens, "requests_median": p.Requests, "context_tokens": p.ContextTokens,
			"think_median_s": p.Think.Seconds(), "output_tokens": p.OutputTokens, "max_output": maxOut,
			"sub_agent_fraction": p.SubAgentFraction, "seed": p.Seed}}
	return w, w.Validate()
}

type agenticGen struct {
	p         AgenticParams
	versions  []version
	maxOut    int
	maxPrompt int
}

func (g *agenticGen) think(r interface{ NormFloat64() float64 }) time.Duration {
	d := time.Duration(lognormal(r, float64(g.p.Think), g.p.ThinkSigma))
	return max(g.p.ThinkMin, min(g.p.ThinkMax, d))
}

func (g *agenticGen) output(r interface{ NormFloat64() float64 }) int {
	return clampInt(lognormal(r, float64(g.p.OutputTokens), g.p.OutputSigma), minOutput, g.maxOut)
}

// session draws top-level session i and, maybe, its sub-agent (ID set by the caller).
func (g *agenticGen) session(i int) (*Conversation, *Conversation) {
	p := g.p
	r := NewRand(Seed(p.Seed, "agentic", "session", i))
	v := g.versions[r.IntN(len(g.versions))]
	n := clampInt(lognormal(r, float64(p.Requests), p.RequestsSigma), MinRequests, 3*p.Requests)
	first := clampInt(lognormal(r, float64(p.FirstUserTokens), firstUserSigma), 1, 4*p.FirstUserTokens)
	target := clampInt(lognormal(r, float64(p.ContextTokens), p.ContextSigma), v.tokens+first, g.maxPrompt)
	turns := make([]Turn, n)
	turns[0] = Turn{User: Words(Seed(p.Seed, "agentic-task", i), first), MaxTokens: g.output(r)}
	fork := -1
	if n >= 3 && r.Float64() < p.SubAgentFraction {
		fork = 1 + r.IntN(n-2) // the reply of turn fork calls Task; turn fork+1 carries its result
	}
	fixed := v.tokens + first // prompt tokens that are not tool results
	var weights []float64
	sum := 0.0
	for t := 1; t < n; t++ {
		tool := pickTool(r)
		if t == fork+1 {
			tool = taskTool
		}
		call := toolCall(p.Seed, i, t, tool)
		turns[t] = Turn{ToolCall: &call, MaxTokens: g.output(r), Think: g.think(r)}
		fixed += turns[t-1].MaxTokens + turnOverhead(call)
		wt := lognormal(r, 1, p.ToolResultSigma)
		if tool == taskTool {
			wt = 0 // the Task call returns the sub-agent's summary, not a file
		}
		weights = append(weights, wt)
		sum += wt
	}
	// Tool results fill what is left of the target context, in proportion to their weights.
	budget := max(0, target-fixed-taskResultWords)
	ctx := make([]int, n) // prompt tokens of each request
	ctx[0] = v.tokens + first
	for t := 1; t < n; t++ {
		words := taskResultWords
		if weights[t-1] > 0 {
			words = max(minToolResult, int(float64(budget)*weights[t-1]/sum))
		}
		seed := Seed(p.Seed, "agentic-result", i, t)
		turns[t].ToolResultFunc = func() string { return Words(seed, words) }
		ctx[t] = ctx[t-1] + turns[t-1].MaxTokens + turnOverhead(*turns[t].ToolCall) + words
	}
	// Sizes are estimates (tool-call tags merge across boundaries): drop trailing turns that
	// would not fit the model length.
	for n > MinRequests && ctx[n-1]+turns[n-1].MaxTokens > g.maxPrompt {
		n--
	}
	c := &Conversation{ID: i, System: v.system, Tools: v.tools, Turns: turns[:n]}
	var sub *Conversation
	if fork >= 0 && fork < n-1 {
		sub = g.subAgent(r, c, fork, ctx[fork], (ctx[n-1]-ctx[0])/max(1, n-1), i)
	}
	if sub == nil && fork >= 0 && fork < n-1 {
		// No room for the sub-agent: the reply calls another tool instead of Task.
		call := toolCall(p.Seed, i, fork+1, pickTool(r))
		c.Turns[fork+1].ToolCall = &call
	}
	return c, sub
}

// subAgent draws the sub-agent forked after parent turn fork, whose prompt there was base
// tokens: its first user message is its own task, then tool turns that grow by the parent's
// mean growth per request (growth tokens), within the model length (nil when even
// minSubRequests would not fit).
func (g *agenticGen) subAgent(r interface {
	NormFloat64() float64
	IntN(int) int
}, parent *Conversation, fork, base, growth, i int) *Conversation {
	p := g.p
	growth = max(1, growth)
	n := clampInt(lognormal(r, float64(p.SubAgentRequests), subAgentSigma), minSubRequests, 3*p.SubAgentRequests)
	n = min(n, (g.maxPrompt-base-taskPromptWords-g.maxOut)/growth)
	if n < minSubRequests {
		return nil
	}
	task := Words(Seed(p.Seed, "agentic-subtask", i), taskPromptWords)
	turns := make([]Turn, n)
	turns[0] = Turn{User: task, MaxTokens: g.output(r)} // sent as soon as the Task call arrives
	for t := 1; t < n; t++ {
		call := toolCall(p.Seed, p.Sessions+i, t, pickTool(r))
		words := max(minToolResult, growth-turns[t-1].MaxTokens-turnOverhead(call))
		seed := Seed(p.Seed, "agentic-subresult", i, t)
		turns[t] = Turn{ToolCall: &call, MaxTokens: g.output(r), Think: g.think(r),
			ToolResultFunc: func() string { return Words(seed, words) }}
	}
	return &Conversation{System: parent.System, Tools: parent.Tools, Turns: turns, Fork: &Fork{Parent: parent.ID, After: fork}}
}
