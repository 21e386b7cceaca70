package workload

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/prefixlb/prefixlb/bench/sim"
)

// The coding agent's tool set. The names and parameter names are those of the tools a coding
// agent such as Claude Code declares (file reading and editing, shell, search, sub-agent
// dispatch, to-do list, web access); the descriptions are the bench's pseudo-words, sized so
// that the tools and the system prompt together reach the client version's prefix size. Weight
// is how often the agent calls the tool: the bench's own assumption (file reads and shell
// commands dominate a coding session), not a published statistic.
type agentTool struct {
	name   string
	params []string
	weight int
}

var agentTools = []agentTool{
	{"Task", []string{"description", "prompt", "subagent_type"}, 0}, // called only to spawn a sub-agent
	{"Bash", []string{"command", "description", "timeout"}, 25},
	{"Glob", []string{"pattern", "path"}, 5},
	{"Grep", []string{"pattern", "path", "glob", "output_mode"}, 10},
	{"LS", []string{"path", "ignore"}, 3},
	{"Read", []string{"file_path", "offset", "limit"}, 30},
	{"Edit", []string{"file_path", "old_string", "new_string", "replace_all"}, 14},
	{"MultiEdit", []string{"file_path", "edits"}, 2},
	{"Write", []string{"file_path", "content"}, 4},
	{"NotebookEdit", []string{"notebook_path", "cell_id", "new_source"}, 0},
	{"WebFetch", []string{"url", "prompt"}, 1},
	{"WebSearch", []string{"query", "allowed_domains"}, 1},
	{"TodoWrite", []string{"todos"}, 5},
	{"BashOutput", []string{"bash_id", "filter"}, 0},
	{"KillShell", []string{"shell_id"}, 0},
	{"ExitPlanMode", []string{"plan"}, 0},
}

// taskTool is the index of the sub-agent dispatch tool in agentTools.
const taskTool = 0

// Word counts of the generated texts inside a tool call's arguments.
const (
	argWordsMin = 3
	argWordsMax = 12
)

type fnSchema struct {
	Name        string    `json:"name"`
	Description string    `json:"description"`
	Parameters  objSchema `json:"parameters"`
}

type objSchema struct {
	Type       string                `json:"type"`
	Properties map[string]propSchema `json:"properties"`
	Required   []string              `json:"required"`
}

type propSchema struct {
	Type        string `json:"type"`
	Description string `json:"description"`
}

type toolSchema struct {
	Type     string   `json:"type"`
	Function fnSchema `json:"function"`
}

// toolsJSON returns version v's "tools" list (JSON function schemas) of about tokens sim
// tokens, counted as the sim renders it (the compact JSON after <|tools|>). Every tool's
// description and each parameter's description are pseudo-words; the tool descriptions take
// the words left after the structure, in equal shares.
func toolsJSON(seed uint64, v, tokens int) json.RawMessage {
	build := func(descWords int) json.RawMessage {
		list := make([]toolSchema, len(agentTools))
		for i, t := range agentTools {
			props := make(map[string]propSchema, len(t.params))
			for j, p := range t.params {
				props[p] = propSchema{Type: "string", Description: Words(Seed(seed, "tool-param", v, i, j), paramDescWords)}
			}
			list[i] = toolSchema{Type: "function", Function: fnSchema{Name: t.name,
				Description: Words(Seed(seed, "tool", v, i), descWords),
				Parameters:  objSchema{Type: "object", Properties: props, Required: t.params[:1]}}}
		}
		b, err := json.Marshal(list)
		if err != nil {
			panic(err) // strings and maps of strings always encode
		}
		return b
	}
	structure := sim.CountTokens(build(0))
	per := max(1, (tokens-structure)/len(agentTools))
	b := build(per)
	// One correction: a description word is about one token, so this lands within a few.
	if got := sim.CountTokens(b); got != tokens {
		per = max(1, per+(tokens-got)/len(agentTools))
		b = build(per)
	}
	return b
}

// paramDescWords is the length of each parameter's description.
const paramDescWords = 24

// toolCall returns the deterministic call of tool i with generated arguments.
func toolCall(seed uint64, conv, turn, i int) ToolCall {
	t := agentTools[i]
	r := NewRand(Seed(seed, "tool-args", conv, turn))
	args := make(map[string]string, len(t.params))
	for j, p := range t.params[:min(2, len(t.params))] {
		w := Words(Seed(seed, "tool-arg", conv, turn, j), argWordsMin+r.IntN(argWordsMax-argWordsMin+1))
		if strings.HasSuffix(p, "path") {
			w = "/" + strings.ReplaceAll(w, " ", "/")
		}
		args[p] = w
	}
	b, err := json.Marshal(args)
	if err != nil {
		panic(err)
	}
	return ToolCall{ID: fmt.Sprintf("toolu_%016x", Seed(seed, "tool-id", conv, turn)), Type: "function",
		Function: FunctionCall{Name: t.name, Arguments: string(b)}}
}

// pickTool draws a tool index by weight.
func pickTool(r interface{ IntN(int) int }) int {
	total := 0
	for _, t := range agentTools {
		total += t.weight
	}
	x := r.IntN(total)
	for i, t := range agentTools {
		if x < t.weight {
			return i
		}
		x -= t.weight
	}
	return len(agentTools) - 1
}
