package workload

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/bench/sim"
)

// agenticSample is a large enough default-shaped workload for its medians to be stable.
func agenticSample(t *testing.T, seed uint64) *Workload {
	t.Helper()
	p := DefaultAgentic()
	p.Sessions, p.Seed = 120, seed
	w, err := Agentic(p)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func median[T int | float64 | time.Duration](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// agenticSizes are a conversation's prompt sizes per request in sim tokens, counted from the
// texts as the sim tokenizes them: the prefix (tools JSON + system), the user and tool-result
// words and the previous replies (max_tokens each: the sim generates exactly that many). The
// chat template's tags are left out (a few tokens per message). base is what a sub-agent's
// first request carries from its parent.
func agenticSizes(c *Conversation, base int) []int {
	out := make([]int, len(c.Turns))
	ctx := base
	if c.Fork == nil {
		ctx = sim.CountTokens(string(c.Tools)) + sim.CountTokens(c.System)
	}
	for i := range c.Turns {
		tr := &c.Turns[i]
		if i > 0 {
			ctx += c.Turns[i-1].MaxTokens + sim.CountTokens(tr.ToolResultText()) + sim.CountTokens(tr.ToolCall.Function.Arguments)
		}
		ctx += sim.CountTokens(tr.Text())
		out[i] = ctx
	}
	return out
}

func TestAgenticStatistics(t *testing.T) {
	w := agenticSample(t, 1)
	p := DefaultAgentic()
	byID := map[int]*Conversation{}
	var prefixes, requests, finals, outputs []int
	var thinks []time.Duration
	sizes := map[int][]int{}
	subs := 0
	for _, c := range w.Conversations {
		byID[c.ID] = c
		for i, tr := range c.Turns {
			outputs = append(outputs, tr.MaxTokens)
			if i > 0 {
				thinks = append(thinks, tr.Think)
			}
		}
		if c.Fork != nil {
			subs++
			continue
		}
		prefixes = append(prefixes, sim.CountTokens(string(c.Tools))+sim.CountTokens(c.System))
		requests = append(requests, len(c.Turns))
		sizes[c.ID] = agenticSizes(c, 0)
		finals = append(finals, sizes[c.ID][len(c.Turns)-1])
	}
	maxOut := slices.Max(outputs)
	slices.Sort(outputs)
	p99 := outputs[len(outputs)*99/100]
	for _, tc := range []struct {
		name      string
		got, want float64
		tol       float64 // relative
	}{
		{"median tools+system tokens", float64(median(prefixes)), float64(p.PrefixTokens), 0.05},
		{"median requests per session", float64(median(requests)), float64(p.Requests), 0.15},
		{"median last-request prompt tokens", float64(median(finals)), float64(p.ContextTokens), 0.15},
		{"median think seconds", median(thinks).Seconds(), p.Think.Seconds(), 0.1},
		{"median max_tokens", float64(median(outputs)), float64(p.OutputTokens), 0.1},
		{"99th percentile max_tokens (the tail toward MaxOutput)", float64(p99), 1200, 0.3},
		{"sessions with a sub-agent", float64(subs) / float64(len(requests)), p.SubAgentFraction, 0.4},
	} {
		t.Logf("%s = %.4g (want %.4g ± %.0f%%)", tc.name, tc.got, tc.want, tc.tol*100)
		if math.Abs(tc.got-tc.want) > tc.tol*tc.want {
			t.Errorf("%s = %.3g, want %.3g ± %.0f%%", tc.name, tc.got, tc.want, tc.tol*100)
		}
	}
	if maxOut > p.MaxOutput {
		t.Errorf("max_tokens %d over MaxOutput %d", maxOut, p.MaxOutput)
	}
	// The first request carries the prefix and the task; every later one only appends.
	for _, c := range w.Conversations {
		if c.Fork == nil {
			if c.Turns[0].ToolCall != nil || c.Turns[0].Text() == "" {
				t.Fatalf("session %d: first turn must be a user message without a tool call", c.ID)
			}
			for i, tr := range c.Turns[1:] {
				if tr.ToolCall == nil || tr.Text() != "" || tr.ToolResultText() == "" || !json.Valid([]byte(tr.ToolCall.Function.Arguments)) {
					t.Fatalf("session %d turn %d: want a tool turn with JSON arguments and a result, got %+v", c.ID, i+1, tr)
				}
			}
			continue
		}
		// Sub-agents: same tools and system as the parent, forked where the parent's reply
		// calls Task, and the whole sub-agent fits the model length on top of the parent's
		// history there.
		par := byID[c.Fork.Parent]
		if par == nil || par.Fork != nil || !reflect.DeepEqual(par.Tools, c.Tools) || par.System != c.System {
			t.Fatalf("sub-agent %d: parent %d missing or with another prefix", c.ID, c.Fork.Parent)
		}
		if got := par.Turns[c.Fork.After+1].ToolCall.Function.Name; got != "Task" {
			t.Fatalf("sub-agent %d: parent's turn %d calls %s, want Task", c.ID, c.Fork.After+1, got)
		}
		if c.At != par.At {
			t.Fatalf("sub-agent %d: At %v, parent's %v", c.ID, c.At, par.At)
		}
		sz := agenticSizes(c, sizes[par.ID][c.Fork.After])
		sizes[c.ID] = sz
	}
	// Every Task call has the sub-agent it spawns.
	forked := map[[2]int]bool{}
	for _, c := range w.Conversations {
		if c.Fork != nil {
			forked[[2]int{c.Fork.Parent, c.Fork.After + 1}] = true
		}
	}
	for _, c := range w.Conversations {
		for i, tr := range c.Turns {
			if tr.ToolCall != nil && tr.ToolCall.Function.Name == "Task" && !forked[[2]int{c.ID, i}] {
				t.Fatalf("conversation %d turn %d answers a Task call that spawned no sub-agent", c.ID, i)
			}
		}
	}
	for _, c := range w.Conversations {
		for i, s := range sizes[c.ID] {
			if s+c.Turns[i].MaxTokens > p.MaxModelLen {
				t.Fatalf("conversation %d turn %d: %d prompt + %d output tokens over the model length %d", c.ID, i, s, c.Turns[i].MaxTokens, p.MaxModelLen)
			}
		}
	}
}

// agenticDump is everything a workload sends, lazy texts included, for comparing builds.
func agenticDump(w *Workload) []any {
	var out []any
	for _, c := range w.Conversations {
		out = append(out, c.ID, c.At, string(c.Tools), c.System, c.Fork)
		for _, tr := range c.Turns {
			out = append(out, tr.Text(), tr.MaxTokens, tr.Think, tr.ToolCall, tr.ToolResultText())
		}
	}
	return out
}

func TestAgenticDeterministic(t *testing.T) {
	p := DefaultAgentic()
	p.Sessions = 8
	build := func(seed uint64) []any {
		q := p
		q.Seed = seed
		w, err := Agentic(q)
		if err != nil {
			t.Fatal(err)
		}
		return agenticDump(w)
	}
	a := build(7)
	if !reflect.DeepEqual(a, build(7)) {
		t.Fatal("two builds with the same seed differ")
	}
	if reflect.DeepEqual(a, build(8)) {
		t.Fatal("builds with different seeds are equal")
	}
}

func TestAgenticRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*AgenticParams)
	}{
		{"no sessions", func(p *AgenticParams) { p.Sessions = 0 }},
		{"no rate", func(p *AgenticParams) { p.Rate = 0 }},
		{"no requests", func(p *AgenticParams) { p.Requests = 0 }},
		{"no output", func(p *AgenticParams) { p.OutputTokens = 0 }},
		{"think range", func(p *AgenticParams) { p.ThinkMin, p.ThinkMax = 2*time.Second, time.Second }},
		{"sub-agent fraction", func(p *AgenticParams) { p.SubAgentFraction = 1.5 }},
		{"prefix over the model length", func(p *AgenticParams) { p.MaxModelLen = 8192 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultAgentic()
			p.Sessions = 2
			tc.set(&p)
			if _, err := Agentic(p); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestValidateRejectsBadForks(t *testing.T) {
	parent := func() *Conversation {
		return &Conversation{ID: 0, Turns: []Turn{{User: "a", MaxTokens: 1}, {User: "b", MaxTokens: 1}, {User: "c", MaxTokens: 1}}}
	}
	for _, tc := range []struct {
		name string
		loop Loop
		fork Fork
		ok   bool
	}{
		{"fork mid-session", Open, Fork{Parent: 0, After: 1}, true},
		{"closed loop", Closed, Fork{Parent: 0, After: 1}, false},
		{"no such parent", Open, Fork{Parent: 5, After: 1}, false},
		{"after the last turn", Open, Fork{Parent: 0, After: 2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Workload{Name: "x", API: Chat, Loop: tc.loop, Users: 1, Conversations: []*Conversation{parent(),
				{ID: 1, Turns: []Turn{{User: "s", MaxTokens: 1}}, Fork: &tc.fork}}}
			if err := w.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
