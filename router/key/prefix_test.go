package key

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sharedFile returns the path of a file under the shared data folder ($PREFIXLB_SHARED, else
// ../../../shared from this package), or skips the test when it is absent. The data is read in
// place and never copied into the repository.
func sharedFile(t *testing.T, rel string) string {
	t.Helper()
	dir := os.Getenv("PREFIXLB_SHARED")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared")
	}
	p := filepath.Join(dir, rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("optional extra: shared data file %s not available (%v); set PREFIXLB_SHARED to the shared folder to run it (the committed %s covers the same properties)", p, err, fixtureThreads)
	}
	return p
}

// fixtureThreads is a small hand-written set of multi-turn conversations (OpenAssistant's
// thread format: {"messages": [{"role", "content"}...]}), committed so that the prefix
// properties are checked on every checkout; the shared datasets add volume where present.
// Threads hold system messages, long documents, code with quotes, backslashes and tabs,
// non-ASCII text and emoji, and turns as short as "ok".
const fixtureThreads = "testdata/threads.jsonl"

// thread is one conversation of fixtureThreads or of the shared OASST file.
type thread struct {
	Messages []msg `json:"messages"`
}

// readLines decodes every JSON line of a shared file into T.
func readLines[T any](t *testing.T, rel string) []T {
	t.Helper()
	return readJSONL[T](t, sharedFile(t, rel))
}

// readJSONL decodes every JSON line of the file at path into T; an empty file fails t.
func readJSONL[T any](t *testing.T, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no lines", path)
	}
	return out
}

var systemPrompt = "You are a careful assistant. " + strings.Repeat("Answer precisely, cite sources, keep the user's formatting, and never invent facts. ", 20)

var testTools = []any{map[string]any{"type": "function", "function": map[string]any{
	"name": "search", "description": "Search the web",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}},
}}}

// variant builds request bodies for one conversation prefix in one API shape.
type variant struct {
	name  string
	path  string
	chunk int
	body  func(msgs []msg) any
}

func chatVariant(name string, chunk int, system bool, extra map[string]any) variant {
	return variant{name, pathChat, chunk, func(msgs []msg) any {
		if system {
			msgs = append([]msg{{"system", systemPrompt}}, msgs...)
		}
		m := map[string]any{"model": "m", "stream": true, "messages": msgs}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}}
}

var variants = []variant{
	chatVariant("chat", 64, false, nil),
	chatVariant("chat+system", 64, true, nil),
	chatVariant("chat+system+tools+salt", 64, true, map[string]any{"tools": testTools, "cache_salt": "t1"}),
	chatVariant("chat+system chunk16", 16, true, nil),
	{"responses+instructions", pathResp, 64, func(msgs []msg) any {
		items := make([]any, len(msgs))
		for i, m := range msgs {
			typ := "input_text"
			if m.Role == "assistant" {
				typ = "output_text"
			}
			items[i] = map[string]any{"type": "message", "role": m.Role, "content": []any{map[string]any{"type": typ, "text": m.Content}}}
		}
		return map[string]any{"model": "m", "instructions": systemPrompt, "input": items}
	}},
	{"chat multimodal parts", pathChat, 16, func(msgs []msg) any {
		out := []any{map[string]any{"role": "system", "content": systemPrompt}}
		for i, m := range msgs {
			out = append(out, map[string]any{"role": m.Role, "content": []any{
				map[string]any{"type": "text", "text": m.Content},
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": fmt.Sprintf("https://img.example/%d.png", i)}},
			}})
		}
		return map[string]any{"model": "m", "messages": out}
	}},
}

// checkPrefix builds every prefix msgs[:1], msgs[:2], ... and checks that the chunk hashes of
// each are a prefix of the next's. It returns the number of chunks of the full conversation.
func checkPrefix(t *testing.T, v variant, conv string, msgs []msg) int {
	t.Helper()
	b := NewBuilder(v.chunk)
	var prev Key
	for n := 1; n <= len(msgs); n++ {
		body, err := json.Marshal(v.body(msgs[:n]))
		if err != nil {
			t.Fatal(err)
		}
		k := build(b, v.path, string(body))
		if !k.OK {
			t.Fatalf("%s turn %d: OK = false, want true", conv, n)
		}
		if n > 1 {
			if len(k.Chunks) < len(prev.Chunks) || !slices.Equal(k.Chunks[:len(prev.Chunks)], prev.Chunks) {
				t.Fatalf("%s: chunks of turn %d (%d) are not a prefix of turn %d's (%d)", conv, n-1, len(prev.Chunks), n, len(k.Chunks))
			}
			if k.PromptTokens <= prev.PromptTokens {
				t.Fatalf("%s: PromptTokens turn %d = %d, turn %d = %d; want growth", conv, n-1, prev.PromptTokens, n, k.PromptTokens)
			}
		}
		prev = k
	}
	return len(prev.Chunks)
}

// checkPrefixThreads runs checkPrefix for every variant over every thread. Each variant must
// give some thread more than one chunk, or it would check nothing.
func checkPrefixThreads(t *testing.T, threads []thread) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			total, multi := 0, 0
			for i, th := range threads {
				c := checkPrefix(t, v, fmt.Sprintf("thread %d", i), th.Messages)
				total += c
				if c > 1 {
					multi++
				}
			}
			if multi == 0 {
				t.Errorf("no thread produced more than one chunk; the test checks nothing")
			}
			t.Logf("%d threads, %d chunks, %d threads with >1 chunk", len(threads), total, multi)
		})
	}
}

// TestPrefixPropertyFixture: turn n's chunks are a prefix of turn n+1's in every API shape
// (chat with and without a system prompt, tools and cache_salt, 16-token chunks, the
// Responses API, multimodal parts), on the committed conversations.
func TestPrefixPropertyFixture(t *testing.T) {
	threads := readJSONL[thread](t, fixtureThreads)
	for i, th := range threads {
		if len(th.Messages) < 3 {
			t.Fatalf("%s thread %d: %d messages, want a multi-turn conversation", fixtureThreads, i, len(th.Messages))
		}
	}
	checkPrefixThreads(t, threads)
}

// TestPrefixPropertyOASST is TestPrefixPropertyFixture over the 100 OpenAssistant threads of
// the shared datasets (an optional extra).
func TestPrefixPropertyOASST(t *testing.T) {
	checkPrefixThreads(t, readLines[thread](t, "datasets/oasst_en_100_threads.jsonl"))
}

func TestPrefixPropertyMTBench(t *testing.T) {
	qs := readLines[struct {
		ID    int      `json:"question_id"`
		Turns []string `json:"turns"`
	}](t, "datasets/question.jsonl")
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			multi := 0
			for _, q := range qs {
				if len(q.Turns) < 2 {
					t.Fatalf("question %d: %d turns, want 2", q.ID, len(q.Turns))
				}
				msgs := []msg{{"user", q.Turns[0]}, {"assistant", "some reply"}, {"user", q.Turns[1]}}
				if checkPrefix(t, v, fmt.Sprintf("question %d", q.ID), msgs) > 1 {
					multi++
				}
			}
			if multi == 0 && v.name != "chat" {
				t.Errorf("no conversation produced more than one chunk; the test checks nothing")
			}
		})
	}
}

// checkCompletionsPrefix renders each thread as a growing completions prompt ("role:
// content" lines) and checks that turn n's chunks are a prefix of turn n+1's. Some thread must
// span more than one chunk.
func checkCompletionsPrefix(t *testing.T, threads []thread) {
	b := NewBuilder(16)
	multi := 0
	for i, th := range threads {
		var prompt strings.Builder
		var prev Key
		for n, m := range th.Messages {
			prompt.WriteString(m.Role + ": " + m.Content + "\n")
			body, err := json.Marshal(map[string]any{"model": "m", "prompt": prompt.String()})
			if err != nil {
				t.Fatal(err)
			}
			k := build(b, pathCompl, string(body))
			if !k.OK {
				t.Fatalf("thread %d turn %d: OK = false", i, n)
			}
			if n > 0 && (len(k.Chunks) < len(prev.Chunks) || !slices.Equal(k.Chunks[:len(prev.Chunks)], prev.Chunks)) {
				t.Fatalf("thread %d: chunks of turn %d are not a prefix of turn %d's", i, n-1, n)
			}
			prev = k
		}
		if len(prev.Chunks) > 1 {
			multi++
		}
	}
	if multi == 0 {
		t.Errorf("no completions prompt produced more than one chunk; the test checks nothing")
	}
}

// TestPrefixPropertyCompletionsFixture: a text prompt that extends another shares its chunks,
// on the committed conversations.
func TestPrefixPropertyCompletionsFixture(t *testing.T) {
	checkCompletionsPrefix(t, readJSONL[thread](t, fixtureThreads))
}

// TestPrefixPropertyCompletions is TestPrefixPropertyCompletionsFixture over 50 shared
// OpenAssistant threads (an optional extra).
func TestPrefixPropertyCompletions(t *testing.T) {
	checkCompletionsPrefix(t, readLines[thread](t, "datasets/oasst_en_100_threads.jsonl")[:50])
}
