package workload

import (
	"fmt"
	"time"
)

// SharedPrefixParams are the shared-prefix groups workload's parameters. The defaults are
// llm-d-benchmark's shared_prefix_synthetic profile: 32 groups × 32 prompts, 2048-token
// system prompt, 256-token question, 256 output tokens.
type SharedPrefixParams struct {
	Groups          int
	PromptsPerGroup int
	SystemTokens    int
	QuestionTokens  int
	OutputTokens    int
	// Rate is the open-loop Poisson rate (requests/s); 0 means closed loop with Users.
	Rate  float64
	Users int
	Seed  uint64
}

// DefaultSharedPrefix returns llm-d's 32×32, 2048/256/256 profile at 20 requests/s (the top
// of its 2→20 QPS ramp).
func DefaultSharedPrefix() SharedPrefixParams {
	return SharedPrefixParams{Groups: 32, PromptsPerGroup: 32, SystemTokens: 2048, QuestionTokens: 256,
		OutputTokens: 256, Rate: 20, Users: 16, Seed: 1}
}

// SharedPrefix builds the groups workload: every prompt of group g starts with g's system
// prompt and ends with its own question. Requests are sent in a seeded random order.
func SharedPrefix(p SharedPrefixParams) (*Workload, error) {
	if p.Groups < 1 || p.PromptsPerGroup < 1 || p.SystemTokens < 0 || p.QuestionTokens < 1 || p.OutputTokens < 1 {
		return nil, fmt.Errorf("shared-prefix: groups, prompts per group, question and output tokens must be >= 1")
	}
	systems := make([]string, p.Groups)
	for g := range systems {
		systems[g] = Words(Seed(p.Seed, "system", g), p.SystemTokens)
	}
	convs := make([]*Conversation, 0, p.Groups*p.PromptsPerGroup)
	for g := 0; g < p.Groups; g++ {
		for i := 0; i < p.PromptsPerGroup; i++ {
			q := Words(Seed(p.Seed, "question", g, i), p.QuestionTokens)
			convs = append(convs, &Conversation{System: systems[g],
				Turns: []Turn{{User: q, MaxTokens: p.OutputTokens}}})
		}
	}
	r := NewRand(Seed(p.Seed, "order"))
	r.Shuffle(len(convs), func(i, j int) { convs[i], convs[j] = convs[j], convs[i] })
	for i, c := range convs {
		c.ID = i
	}
	w := &Workload{Name: "shared-prefix", API: Chat, Conversations: convs,
		Params: map[string]any{"groups": p.Groups, "prompts_per_group": p.PromptsPerGroup,
			"system_tokens": p.SystemTokens, "question_tokens": p.QuestionTokens,
			"output_tokens": p.OutputTokens, "seed": p.Seed}}
	if p.Rate > 0 {
		w.Loop = Open
		AssignPoisson(convs, p.Rate, p.Seed)
		w.Params["rate"] = p.Rate
	} else {
		w.Loop, w.Users = Closed, p.Users
		w.Params["users"] = p.Users
	}
	return w, nil
}

// MultiTurnParams shape multi-turn chats over long documents, after the public measurement
// (11 conversations over 4000+-token documents, 10 turns, max_tokens 150, 4 parallel users,
// 0.5–2 s think time before every turn).
type MultiTurnParams struct {
	Conversations  int
	Turns          int
	DocTokens      int
	QuestionTokens int
	OutputTokens   int
	Users          int
	ThinkMin       time.Duration
	ThinkMax       time.Duration
	Seed           uint64
}

// PublicMultiTurn returns the shape of the public measurement itself.
func PublicMultiTurn() MultiTurnParams {
	return MultiTurnParams{Conversations: 11, Turns: 10, DocTokens: 4000, QuestionTokens: 16,
		OutputTokens: 150, Users: 4, ThinkMin: 500 * time.Millisecond, ThinkMax: 2 * time.Second, Seed: 1}
}

var (
	docInstructions = []string{
		"Read the document below and list the problems you find in it:",
		"Give me a short summary of the following document:",
		"Explain the main ideas of the text below to a new team member:",
		"Point out anything unclear or inconsistent in this document:",
		"Write a list of questions a reviewer would ask about this text:",
		"Describe how the parts of the following document fit together:",
	}
	followUps = []string{
		"Please go into more detail on that.",
		"Make the answer shorter, please.",
		"What did you leave out?",
		"Can you give a concrete example?",
		"Which point matters most, and why?",
		"Rewrite that for a non-expert reader.",
		"What would you change first?",
		"Are there any risks you see here?",
		"How would you test this?",
		"Summarize our discussion so far.",
	}
)

// MultiTurn builds the multi-turn workload. Conversation c's first user message is an
// instruction followed by its own document; later turns are short follow-up questions. The load
// generator sends each turn with all previous user turns and the replies actually received.
func MultiTurn(p MultiTurnParams) (*Workload, error) {
	if p.Conversations < 1 || p.Turns < 1 || p.DocTokens < 1 || p.OutputTokens < 1 || p.Users < 1 {
		return nil, fmt.Errorf("multi-turn: conversations, turns, doc tokens, output tokens and users must be >= 1")
	}
	if p.ThinkMax < p.ThinkMin || p.ThinkMin < 0 {
		return nil, fmt.Errorf("multi-turn: think time range %s..%s is invalid", p.ThinkMin, p.ThinkMax)
	}
	convs := make([]*Conversation, p.Conversations)
	for c := range convs {
		r := NewRand(Seed(p.Seed, "conversation", c))
		doc := Words(Seed(p.Seed, "document", c), p.DocTokens)
		turns := make([]Turn, p.Turns)
		for t := range turns {
			var u string
			if t == 0 {
				u = docInstructions[c%len(docInstructions)] + "\n\n" + doc
			} else {
				u = followUps[r.IntN(len(followUps))]
				if p.QuestionTokens > 0 {
					u += " " + Words(Seed(p.Seed, "question", c, t), p.QuestionTokens)
				}
			}
			turns[t] = Turn{User: u, MaxTokens: p.OutputTokens, Think: uniformDur(r, p.ThinkMin, p.ThinkMax)}
		}
		convs[c] = &Conversation{ID: c, Turns: turns}
	}
	return &Workload{Name: "multi-turn", API: Chat, Loop: Closed, Users: p.Users, Conversations: convs,
		Params: map[string]any{"conversations": p.Conversations, "turns": p.Turns, "doc_tokens": p.DocTokens,
			"question_tokens": p.QuestionTokens, "output_tokens": p.OutputTokens, "users": p.Users,
			"think_min_s": p.ThinkMin.Seconds(), "think_max_s": p.ThinkMax.Seconds(), "seed": p.Seed}}, nil
}
