// Package workload builds the request streams that prefixlb's bench replays: shared-prefix
// groups, multi-turn chats over long documents, the Mooncake conversation trace, and real
// conversations from OpenAssistant and MT-Bench. A Workload is pure data, fully determined by
// its parameters and seed; the load generator (bench/loadgen) sends it and, for multi-turn
// conversations, appends the replies actually received before the next turn.
package workload

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// API is the OpenAI endpoint a workload uses.
type API string

const (
	// Chat is /v1/chat/completions.
	Chat API = "chat"
	// Completions is /v1/completions (single-turn prompts only).
	Completions API = "completions"
)

// Loop is how requests are scheduled.
type Loop string

const (
	// Closed: Users workers take conversations from a FIFO queue, wait the turn's think time,
	// send the turn, and put the conversation back at the end of the queue if it has more
	// turns (the interleaving of the public multi-turn measurement).
	Closed Loop = "closed"
	// Open: each conversation's first turn is sent at its At offset regardless of how many
	// requests are outstanding (no coordinated omission); later turns follow after the reply
	// and the turn's think time.
	Open Loop = "open"
)

// Turn is one request of a conversation.
type Turn struct {
	// User is the new user message of this turn. The request carries every earlier user
	// message and the replies actually received.
	User string
	// MaxTokens is the request's max_tokens.
	MaxTokens int
	// Think is the wait before this turn is sent (closed loop: before every turn; open loop:
	// before turns after the first).
	Think time.Duration
	// UserFunc, when set, makes User lazily (long trace prompts are built at send time so a
	// whole trace is never held in memory at once).
	UserFunc func() string
	// ToolCall, when set, is the tool call the previous reply makes: the load generator adds it
	// to the assistant message it received and sends a "tool" message answering it, with the
	// text of ToolResult (or ToolResultFunc, built lazily), before this turn's user message. A
	// tool turn usually has no user message (User and UserFunc empty).
	ToolCall       *ToolCall
	ToolResult     string
	ToolResultFunc func() string
}

// ToolResultText is the turn's tool result ("" without a tool call).
func (t *Turn) ToolResultText() string {
	if t.ToolResultFunc != nil {
		return t.ToolResultFunc()
	}
	return t.ToolResult
}

// Text is the turn's user message.
func (t *Turn) Text() string {
	if t.UserFunc != nil {
		return t.UserFunc()
	}
	return t.User
}

// Conversation is a sequence of turns sent one after another.
type Conversation struct {
	ID int
	// System is an optional system message sent first in every turn.
	System string
	Turns  []Turn
	// At is the open-loop arrival offset of the first turn from the start of the run.
	At time.Duration
	// Tools, when set, is the request's "tools" field (a JSON list of function schemas), sent
	// with every turn.
	Tools json.RawMessage
	// Fork, when set, makes this a sub-agent of another conversation: it is not started at At
	// but when its parent's turn Fork.After has its reply, and its history starts as a copy of
	// the messages that parent turn sent (open loop only).
	Fork *Fork
	// Tenant, when set, is the client sending this conversation (one of Workload.Tenants):
	// its requests carry the tenant's headers and its patience.
	Tenant *Tenant
}

// Fork places a sub-agent conversation in its parent's history.
type Fork struct {
	// Parent is the parent conversation's ID; After is the parent turn whose sent messages the
	// sub-agent's first request starts with. The parent's next turn waits for the sub-agent to
	// finish (the parent's tool call that spawned it returns when it does).
	Parent, After int
}

// Workload is a replayable set of conversations and how to schedule them.
type Workload struct {
	// Name: shared-prefix | multi-turn | mooncake | oasst | mt-bench.
	Name          string
	API           API
	Loop          Loop
	Conversations []*Conversation
	// Users is the number of closed-loop workers.
	Users int
	// Params are the generator's parameters, for the report.
	Params map[string]any
	// Oracle, when set, is the best cached-token ratio the request stream allows (mooncake).
	Oracle *Oracle
	// Tenants, when set, are the clients of a multi-tenant workload (overload); every
	// conversation then names its Tenant, and the report has a row per tenant.
	Tenants []*Tenant
}

// Requests is the total number of requests (turns).
func (w *Workload) Requests() int {
	n := 0
	for _, c := range w.Conversations {
		n += len(c.Turns)
	}
	return n
}

// Validate checks a workload before it is run.
func (w *Workload) Validate() error {
	if len(w.Conversations) == 0 {
		return fmt.Errorf("workload %s: no requests", w.Name)
	}
	if w.Loop == Closed && w.Users < 1 {
		return fmt.Errorf("workload %s: closed loop needs users >= 1", w.Name)
	}
	ids := make(map[int]*Conversation, len(w.Conversations))
	for _, c := range w.Conversations {
		ids[c.ID] = c
	}
	for _, c := range w.Conversations {
		if len(c.Turns) == 0 {
			return fmt.Errorf("workload %s: conversation %d has no turns", w.Name, c.ID)
		}
		if w.API == Completions && len(c.Turns) > 1 {
			return fmt.Errorf("workload %s: the completions API takes single-turn conversations only", w.Name)
		}
		if c.Fork != nil {
			p, ok := ids[c.Fork.Parent]
			switch {
			case w.Loop != Open:
				return fmt.Errorf("workload %s: sub-agent conversation %d needs the open loop", w.Name, c.ID)
			case !ok || p.Fork != nil:
				return fmt.Errorf("workload %s: sub-agent conversation %d: parent %d is not a top-level conversation", w.Name, c.ID, c.Fork.Parent)
			case c.Fork.After < 0 || c.Fork.After >= len(p.Turns)-1:
				return fmt.Errorf("workload %s: sub-agent conversation %d forks after turn %d of %d", w.Name, c.ID, c.Fork.After, len(p.Turns))
			}
		}
	}
	return nil
}

// thinkTimes draws a uniform think time in [lo, hi] for every turn from r.
func uniformDur(rnd interface{ Float64() float64 }, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rnd.Float64()*float64(hi-lo))
}

// AssignPoisson sets open-loop arrival offsets of a Poisson process at rate per second, in the
// conversations' order, seeded by seed.
func AssignPoisson(convs []*Conversation, rate float64, seed uint64) {
	if rate <= 0 {
		return
	}
	r := NewRand(Seed(seed, "poisson"))
	t := 0.0
	for i, c := range convs {
		if i > 0 {
			t += -math.Log(1-r.Float64()) / rate
		}
		c.At = time.Duration(t * float64(time.Second))
	}
}
