package workload

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrNoShared is returned (wrapped) when a data file under the shared directory is absent.
var ErrNoShared = errors.New("shared data not found (set PREFIXLB_SHARED)")

// SharedDir is where traces and datasets are read from: $PREFIXLB_SHARED, else ../shared next
// to the repository root (the directory holding go.mod, found from the working directory up),
// else ../shared relative to the working directory. Data is never copied into the repository.
func SharedDir() string {
	if d := os.Getenv("PREFIXLB_SHARED"); d != "" {
		return d
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				return filepath.Join(filepath.Dir(d), "shared")
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return filepath.Join("..", "shared")
}

// SharedFile resolves a file under the shared directory and checks it exists.
func SharedFile(rel string) (string, error) {
	p := filepath.Join(SharedDir(), rel)
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return p, fmt.Errorf("%s: %w", p, ErrNoShared)
		}
		return p, err
	}
	return p, nil
}

// Default locations under the shared directory.
const (
	MooncakeTrace = "traces/conversation_trace.jsonl"
	OASSTThreads  = "datasets/oasst_en_100_threads.jsonl"
	MTBench       = "datasets/question.jsonl"
)

// Message is an OpenAI chat message. ToolCalls (an assistant message's function calls) and
// ToolCallID (a "tool" message's answer to one) are omitted when empty, so messages without
// them encode exactly as before they existed.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// ToolCall is one OpenAI function call of an assistant message:
// {"id", "type": "function", "function": {"name", "arguments"}}.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is a tool call's function: its name and its arguments as a JSON text.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// OASSTThread is one root-to-leaf path of an OpenAssistant tree.
type OASSTThread struct {
	TreeID   string    `json:"tree_id"`
	Index    int       `json:"thread_index"`
	Messages []Message `json:"messages"`
}

// MTBenchQuestion is one MT-Bench question with its two user turns.
type MTBenchQuestion struct {
	ID       int      `json:"question_id"`
	Category string   `json:"category"`
	Turns    []string `json:"turns"`
}

func readJSONL[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", path, ErrNoShared)
		}
		return nil, err
	}
	defer f.Close()
	var out []T
	br := bufio.NewReaderSize(f, 1<<16)
	for line := 1; ; line++ {
		b, rerr := br.ReadBytes('\n')
		if s := strings.TrimSpace(string(b)); s != "" {
			var v T
			if err := json.Unmarshal([]byte(s), &v); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, line, err)
			}
			out = append(out, v)
		}
		if rerr != nil {
			break
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	return out, nil
}

// LoadOASST reads oasst_en_100_threads.jsonl.
func LoadOASST(path string) ([]OASSTThread, error) { return readJSONL[OASSTThread](path) }

// LoadMTBench reads MT-Bench's question.jsonl.
func LoadMTBench(path string) ([]MTBenchQuestion, error) { return readJSONL[MTBenchQuestion](path) }

// ConversationParams shape the real-conversation workloads (oasst, mt-bench).
type ConversationParams struct {
	// Conversations caps how many are used (0: all).
	Conversations int
	// OutputTokens is max_tokens where the data gives no reply length (mt-bench always; oasst
	// for a thread's final user turn).
	OutputTokens int
	// MaxOutput caps any turn's max_tokens.
	MaxOutput int
	// Rate > 0: open loop, conversations start as a Poisson process; else closed loop.
	Rate               float64
	Users              int
	ThinkMin, ThinkMax time.Duration
	Shuffle            bool
	Seed               uint64
}

// DefaultConversationParams: 4 users, 0.5–2 s think (as multi-turn), 256 output tokens.
func DefaultConversationParams() ConversationParams {
	return ConversationParams{OutputTokens: 256, MaxOutput: 512, Users: 4,
		ThinkMin: 500 * time.Millisecond, ThinkMax: 2 * time.Second, Shuffle: true, Seed: 1}
}

// OASST builds the OpenAssistant workload: the user turns come from the data; the assistant
// turns are the replies actually received, each asked for about as many tokens as the data's
// own reply had (bytes/4, within [16, MaxOutput]). A trailing assistant message is dropped.
// Threads of one tree share their opening turns, so they share prefixes.
func OASST(threads []OASSTThread, p ConversationParams) (*Workload, error) {
	var convs []*Conversation
	for _, th := range threads {
		var turns []Turn
		var sys string
		for i, m := range th.Messages {
			switch m.Role {
			case "system":
				if i == 0 {
					sys = m.Content
				}
			case "user":
				out := p.OutputTokens
				if i+1 < len(th.Messages) && th.Messages[i+1].Role == "assistant" {
					out = max(16, len(th.Messages[i+1].Content)/4)
				}
				if p.MaxOutput > 0 {
					out = min(out, p.MaxOutput)
				}
				turns = append(turns, Turn{User: m.Content, MaxTokens: out})
			}
		}
		if len(turns) > 0 {
			convs = append(convs, &Conversation{System: sys, Turns: turns})
		}
	}
	return conversations("oasst", convs, p)
}

// MTBenchWorkload builds the MT-Bench workload: each question's two user turns, the second sent
// with the first reply actually received.
func MTBenchWorkload(qs []MTBenchQuestion, p ConversationParams) (*Workload, error) {
	var convs []*Conversation
	for _, q := range qs {
		var turns []Turn
		for _, t := range q.Turns {
			turns = append(turns, Turn{User: t, MaxTokens: p.OutputTokens})
		}
		if len(turns) > 0 {
			convs = append(convs, &Conversation{Turns: turns})
		}
	}
	return conversations("mt-bench", convs, p)
}

func conversations(name string, convs []*Conversation, p ConversationParams) (*Workload, error) {
	if p.OutputTokens < 1 {
		return nil, fmt.Errorf("%s: output tokens must be >= 1", name)
	}
	if p.Shuffle {
		r := NewRand(Seed(p.Seed, name, "order"))
		r.Shuffle(len(convs), func(i, j int) { convs[i], convs[j] = convs[j], convs[i] })
	}
	if p.Conversations > 0 && len(convs) > p.Conversations {
		convs = convs[:p.Conversations]
	}
	if len(convs) == 0 {
		return nil, fmt.Errorf("%s: no conversations", name)
	}
	for i, c := range convs {
		c.ID = i
		r := NewRand(Seed(p.Seed, name, "think", i))
		for t := range c.Turns {
			c.Turns[t].Think = uniformDur(r, p.ThinkMin, p.ThinkMax)
		}
	}
	w := &Workload{Name: name, API: Chat, Conversations: convs,
		Params: map[string]any{"conversations": len(convs), "output_tokens": p.OutputTokens,
			"max_output": p.MaxOutput, "think_min_s": p.ThinkMin.Seconds(), "think_max_s": p.ThinkMax.Seconds(),
			"seed": p.Seed}}
	if p.Rate > 0 {
		w.Loop = Open
		AssignPoisson(convs, p.Rate, p.Seed)
		w.Params["rate"] = p.Rate
	} else {
		if p.Users < 1 {
			return nil, fmt.Errorf("%s: users must be >= 1", name)
		}
		w.Loop, w.Users = Closed, p.Users
		w.Params["users"] = p.Users
	}
	return w, nil
}
