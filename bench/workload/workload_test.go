package workload

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestWordsDeterministicAndSized(t *testing.T) {
	a, b := Words(7, 1000), Words(7, 1000)
	if a != b {
		t.Fatal("same seed gave different text")
	}
	if Words(8, 1000) == a {
		t.Fatal("different seeds gave the same text")
	}
	if got := CountWords(a); got != 1000 {
		t.Fatalf("words = %d, want 1000", got)
	}
	if !strings.HasPrefix(Words(7, 1500), a+" ") {
		t.Fatal("Words(seed, n) is not a prefix of Words(seed, m>n)")
	}
	for _, w := range strings.Fields(a) {
		if len(w) < minWordLetters || len(w) > maxWordLetters {
			t.Fatalf("word %q has %d letters", w, len(w))
		}
	}
	// The router's bytes/4 estimate must agree with the word count within 5%.
	if r := float64(ApproxTokens(a)) / 1000; r < 0.95 || r > 1.05 {
		t.Fatalf("approx tokens / words = %.3f", r)
	}
}

func TestTruncateWords(t *testing.T) {
	s := "ab cd ef gh"
	for n, want := range map[int]string{0: "", 1: "ab", 3: "ab cd ef", 4: s, 9: s} {
		if got := TruncateWords(s, n); got != want {
			t.Errorf("TruncateWords(%d) = %q, want %q", n, got, want)
		}
	}
}

// stripFuncs makes conversations comparable with reflect.DeepEqual (funcs never are).
func stripFuncs(w *Workload) []Conversation {
	out := make([]Conversation, len(w.Conversations))
	for i, c := range w.Conversations {
		out[i] = *c
		out[i].Turns = append([]Turn(nil), c.Turns...)
		for j := range out[i].Turns {
			out[i].Turns[j].User = out[i].Turns[j].Text()
			out[i].Turns[j].UserFunc = nil
		}
	}
	return out
}

func TestMultiTurnDeterministic(t *testing.T) {
	p := PublicMultiTurn()
	p.DocTokens = 500
	a, err := MultiTurn(p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := MultiTurn(p)
	if !reflect.DeepEqual(stripFuncs(a), stripFuncs(b)) {
		t.Fatal("same seed gave different workloads")
	}
	p.Seed++
	c, _ := MultiTurn(p)
	if reflect.DeepEqual(stripFuncs(a), stripFuncs(c)) {
		t.Fatal("different seeds gave the same workload")
	}
	if a.Loop != Closed || a.Users != 4 || a.Requests() != 110 {
		t.Fatalf("loop %s users %d requests %d", a.Loop, a.Users, a.Requests())
	}
	docs := map[string]bool{}
	for _, cv := range a.Conversations {
		first := cv.Turns[0].User
		if n := CountWords(first); n < 500 || n > 520 {
			t.Fatalf("first turn has %d words, want the 500-token document plus an instruction", n)
		}
		docs[first] = true
		for _, tr := range cv.Turns {
			if tr.MaxTokens != 150 || tr.Think < 500*time.Millisecond || tr.Think > 2*time.Second {
				t.Fatalf("turn %+v", tr)
			}
		}
	}
	if len(docs) != 11 {
		t.Fatalf("%d distinct documents, want 11", len(docs))
	}
}

func TestSharedPrefix(t *testing.T) {
	p := SharedPrefixParams{Groups: 3, PromptsPerGroup: 4, SystemTokens: 64, QuestionTokens: 8, OutputTokens: 5, Rate: 10, Seed: 3}
	a, err := SharedPrefix(p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := SharedPrefix(p)
	if !reflect.DeepEqual(stripFuncs(a), stripFuncs(b)) {
		t.Fatal("not deterministic")
	}
	if a.Requests() != 12 || a.Loop != Open {
		t.Fatalf("requests %d loop %s", a.Requests(), a.Loop)
	}
	systems := map[string]int{}
	for i, c := range a.Conversations {
		systems[c.System]++
		if i > 0 && c.At < a.Conversations[i-1].At {
			t.Fatal("arrivals not increasing")
		}
	}
	if len(systems) != 3 {
		t.Fatalf("%d system prompts, want 3", len(systems))
	}
	for s, n := range systems {
		if n != 4 || CountWords(s) != 64 {
			t.Fatalf("group of %d with %d-word system prompt", n, CountWords(s))
		}
	}
}

func TestAssignPoissonRate(t *testing.T) {
	cs := make([]*Conversation, 2001)
	for i := range cs {
		cs[i] = &Conversation{}
	}
	AssignPoisson(cs, 50, 1)
	span := cs[len(cs)-1].At.Seconds()
	if rate := 2000 / span; rate < 45 || rate > 55 {
		t.Fatalf("rate %.1f, want about 50", rate)
	}
}

var testTrace = []TraceRow{
	{Timestamp: 0, InputLength: 1100, OutputLength: 10, HashIDs: []int{0, 1, 2}},
	{Timestamp: 1000, InputLength: 1500, OutputLength: 20, HashIDs: []int{0, 1, 3}},
	{Timestamp: 3000, InputLength: 300, OutputLength: 0, HashIDs: []int{4}},
	{Timestamp: 7000, InputLength: 1024, OutputLength: 30, HashIDs: []int{0, 1}},
}

func TestMooncakeText(t *testing.T) {
	p0 := MooncakePrompt(1, testTrace[0])
	p1 := MooncakePrompt(1, testTrace[1])
	if n := CountWords(p0); n != 1100 {
		t.Fatalf("prompt 0 has %d words, want input_length 1100", n)
	}
	if n := CountWords(p1); n != 1500 {
		t.Fatalf("prompt 1 has %d words, want 1500", n)
	}
	// Equal ids 0,1 → equal first 1024 words; id 2 vs 3 → different third block.
	if TruncateWords(p0, 1024) != TruncateWords(p1, 1024) {
		t.Fatal("equal hash ids gave different text")
	}
	if TruncateWords(p0, 1030) == TruncateWords(p1, 1030) {
		t.Fatal("different hash ids gave equal text")
	}
	if MooncakePrompt(1, testTrace[3]) != TruncateWords(p0, 1024) {
		t.Fatal("a request made of blocks 0,1 is not the 1024-token prefix of one made of 0,1,2")
	}
	if BlockText(1, 4) != BlockText(1, 4) || BlockText(1, 4) == BlockText(2, 4) {
		t.Fatal("block text is not a function of (seed, id)")
	}
	if r := float64(ApproxTokens(p1)) / 1500; r < 0.95 || r > 1.05 {
		t.Fatalf("router estimate / input_length = %.3f", r)
	}
}

func TestMooncakeWindowAndScale(t *testing.T) {
	w, err := Mooncake(testTrace, MooncakeParams{Start: time.Second, Duration: 5 * time.Second, TimeScale: 0.5, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Conversations) != 2 {
		t.Fatalf("%d requests in window, want 2", len(w.Conversations))
	}
	if w.Conversations[0].At != 0 || w.Conversations[1].At != time.Second {
		t.Fatalf("arrivals %v %v, want 0 and 1s (2 s of trace at scale 0.5)", w.Conversations[0].At, w.Conversations[1].At)
	}
	if w.Conversations[1].Turns[0].MaxTokens != 1 {
		t.Fatal("output_length 0 must become max_tokens 1")
	}
	w2, _ := Mooncake(testTrace, MooncakeParams{Count: 3, Seed: 1})
	if len(w2.Conversations) != 3 {
		t.Fatalf("count window gave %d", len(w2.Conversations))
	}
	if _, err := Mooncake(testTrace, MooncakeParams{Start: time.Hour}); err == nil {
		t.Fatal("empty window must fail")
	}
}

func TestOracle(t *testing.T) {
	// Infinite: request 1 hits blocks 0,1 (1024); request 4 hits 0,1 (1024). Input 3924.
	o := ComputeOracle(testTrace, 1, 1<<20)
	if o.InputTokens != 3924 {
		t.Fatalf("input %d", o.InputTokens)
	}
	want := 2048.0 / 3924
	if diff := o.InfiniteRatio - want; diff > 1e-9 || diff < -1e-9 {
		t.Fatalf("infinite ratio %.4f, want %.4f", o.InfiniteRatio, want)
	}
	if o.PooledRatio != o.InfiniteRatio {
		t.Fatalf("a large pooled cache must equal the infinite one: %.4f", o.PooledRatio)
	}
	// Two blocks of capacity: after request 2 ({0,1,3}, touched 3,1,0) the cache holds {1,0};
	// request 3 ({4}) evicts 1, so request 4 hits block 0 only.
	o = ComputeOracle(testTrace, 1, 2*MooncakeBlockTokens)
	if want := (1024.0 + 512) / 3924; o.PooledRatio < want-1e-9 || o.PooledRatio > want+1e-9 {
		t.Fatalf("pooled ratio %.4f, want %.4f", o.PooledRatio, want)
	}
}

func TestSharedDirEnv(t *testing.T) {
	t.Setenv("PREFIXLB_SHARED", "/nonexistent/prefixlb-shared")
	if SharedDir() != "/nonexistent/prefixlb-shared" {
		t.Fatal("PREFIXLB_SHARED ignored")
	}
	if _, err := SharedFile(MooncakeTrace); !errors.Is(err, ErrNoShared) {
		t.Fatalf("err = %v, want ErrNoShared", err)
	}
	if _, err := LoadOASST(filepath.Join(SharedDir(), OASSTThreads)); !errors.Is(err, ErrNoShared) {
		t.Fatalf("err = %v, want ErrNoShared", err)
	}
}

// sharedOrSkip returns the path of a shared data file or skips the test: the shared runs are
// optional extras over the full datasets; the loaders and builders are tested on committed or
// hand-written data below.
func sharedOrSkip(t *testing.T, rel string) string {
	t.Helper()
	p, err := SharedFile(rel)
	if err != nil {
		t.Skipf("optional extra, shared data absent: %v (the loaders are tested on committed data without it)", err)
	}
	return p
}

// fixtureThreads is router/key's committed set of conversations, in OpenAssistant's thread
// format; nothing of ../shared is copied into the repository.
const fixtureThreads = "../../router/key/testdata/threads.jsonl"

// writeFile writes a hand-written data file into a temporary directory and returns its path.
func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// OASST on the committed threads: user turns in order, the thread's own system message, the
// reply length as max_tokens (within [16, MaxOutput]), OutputTokens for a final user turn.
func TestOASSTFixture(t *testing.T) {
	th, err := LoadOASST(fixtureThreads)
	if err != nil {
		t.Fatal(err)
	}
	if len(th) < 5 {
		t.Fatalf("%d threads, want the fixture's 8", len(th))
	}
	p := DefaultConversationParams()
	p.Shuffle = false
	w, err := OASST(th, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Conversations) != len(th) || w.Loop != Closed || w.Users != p.Users {
		t.Fatalf("%d conversations of %d threads, loop %s users %d", len(w.Conversations), len(th), w.Loop, w.Users)
	}
	for i, c := range w.Conversations {
		var users []Message
		var sys string
		for j, m := range th[i].Messages {
			switch {
			case m.Role == "system" && j == 0:
				sys = m.Content
			case m.Role == "user":
				users = append(users, m)
			}
		}
		if c.System != sys || len(c.Turns) != len(users) {
			t.Fatalf("thread %d: system %q, %d turns; want %q, %d", i, c.System, len(c.Turns), sys, len(users))
		}
		for j, tr := range c.Turns {
			if tr.User != users[j].Content {
				t.Fatalf("thread %d turn %d is not the thread's user message %d", i, j, j)
			}
		}
		// The fixture's threads end with a user turn: no reply length, so OutputTokens.
		if last := c.Turns[len(c.Turns)-1]; last.MaxTokens != min(p.OutputTokens, p.MaxOutput) {
			t.Fatalf("thread %d: final turn max_tokens %d, want %d", i, last.MaxTokens, p.OutputTokens)
		}
	}
	// Reply lengths: thread 4 ("hi" → "Hello! How can I help?", 22 bytes) asks for the floor of 16.
	if got := w.Conversations[4].Turns[0].MaxTokens; got != 16 {
		t.Errorf("a 22-byte reply gave max_tokens %d, want 16 (the floor)", got)
	}
	if got, want := w.Conversations[0].Turns[0].MaxTokens, max(16, len(th[0].Messages[1].Content)/4); got != want {
		t.Errorf("reply of %d bytes gave max_tokens %d, want %d", len(th[0].Messages[1].Content), got, want)
	}
}

func TestMTBenchFile(t *testing.T) {
	path := writeFile(t, "question.jsonl",
		`{"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post about Hawaii.", "Rewrite it starting every sentence with A."]}`+"\n\n"+
			`{"question_id": 101, "category": "reasoning", "turns": ["You overtake the second person in a race. What position are you in?", "And if you overtake the last person?"]}`+"\n")
	qs, err := LoadMTBench(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 2 || qs[1].ID != 101 || qs[0].Category != "writing" || len(qs[1].Turns) != 2 {
		t.Fatalf("questions %+v", qs)
	}
	p := DefaultConversationParams()
	p.Shuffle = false
	w, err := MTBenchWorkload(qs, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Conversations) != 2 || w.Requests() != 4 || w.Conversations[1].Turns[1].User != "And if you overtake the last person?" {
		t.Fatalf("%d conversations, %d requests: %+v", len(w.Conversations), w.Requests(), w.Conversations)
	}
	for _, c := range w.Conversations {
		for _, tr := range c.Turns {
			if tr.MaxTokens != p.OutputTokens || tr.Think < p.ThinkMin || tr.Think > p.ThinkMax {
				t.Fatalf("turn %+v", tr)
			}
		}
	}
	if _, err := LoadMTBench(writeFile(t, "empty.jsonl", "\n")); err == nil {
		t.Error("an empty file loaded")
	}
	if _, err := LoadMTBench(writeFile(t, "bad.jsonl", `{"question_id": 1}`+"\n{oops\n")); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Errorf("a malformed line 2: err = %v, want one naming line 2", err)
	}
}

func TestLoadMooncakeFile(t *testing.T) {
	var sb strings.Builder
	for _, r := range testTrace {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		sb.Write(append(b, '\n'))
	}
	rows, err := LoadMooncake(writeFile(t, "trace.jsonl", sb.String()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rows, testTrace) {
		t.Fatalf("rows %+v, want %+v", rows, testTrace)
	}
	bad := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}` + "\n" +
		`{"timestamp": 5, "input_length": -1, "output_length": 1, "hash_ids": [1]}` + "\n"
	if _, err := LoadMooncake(writeFile(t, "neg.jsonl", bad)); err == nil || !strings.Contains(err.Error(), ":2: negative length") {
		t.Errorf("negative input_length: err = %v, want line 2 named", err)
	}
	if _, err := LoadMooncake(writeFile(t, "none.jsonl", "")); err == nil {
		t.Error("an empty trace loaded")
	}
}

func TestLoadMooncakeShared(t *testing.T) {
	rows, err := LoadMooncake(sharedOrSkip(t, MooncakeTrace))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 12031 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows[:100] {
		if len(r.HashIDs) != (r.InputLength+511)/512 {
			t.Fatalf("row %+v: blocks != ceil(input/512)", r)
		}
	}
}

func TestOASSTShared(t *testing.T) {
	th, err := LoadOASST(sharedOrSkip(t, OASSTThreads))
	if err != nil {
		t.Fatal(err)
	}
	p := DefaultConversationParams()
	w, err := OASST(th, p)
	if err != nil {
		t.Fatal(err)
	}
	w2, _ := OASST(th, p)
	if !reflect.DeepEqual(stripFuncs(w), stripFuncs(w2)) {
		t.Fatal("not deterministic")
	}
	if len(w.Conversations) != 626 {
		t.Fatalf("%d conversations", len(w.Conversations))
	}
	users := map[string]bool{}
	for _, t := range th {
		for _, m := range t.Messages {
			if m.Role == "user" {
				users[m.Content] = true
			}
		}
	}
	for _, c := range w.Conversations {
		for _, tr := range c.Turns {
			if !users[tr.User] {
				t.Fatalf("turn %q is not a user message of the data", tr.User[:min(40, len(tr.User))])
			}
			if tr.MaxTokens < 16 || tr.MaxTokens > p.MaxOutput {
				t.Fatalf("max tokens %d", tr.MaxTokens)
			}
		}
	}
}

func TestMTBenchShared(t *testing.T) {
	qs, err := LoadMTBench(sharedOrSkip(t, MTBench))
	if err != nil {
		t.Fatal(err)
	}
	p := DefaultConversationParams()
	p.Conversations = 10
	w, err := MTBenchWorkload(qs, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Conversations) != 10 || w.Requests() != 20 {
		t.Fatalf("%d conversations, %d requests", len(w.Conversations), w.Requests())
	}
}
