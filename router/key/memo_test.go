package key

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// memoMessages returns n chat messages of a coding agent's session: system, user, then
// assistant turns with a tool call and tool results of about 32 KB with escapes (newlines,
// tabs, quotes, and the \u003c-style escapes of encoding/json).
func memoMessages(n, session int) []string {
	var out []string
	for i := range n {
		var m map[string]any
		switch {
		case i == 0:
			m = map[string]any{"role": "system", "content": "You are a coding agent.\n" + text(4<<10, 1)}
		case i == 1:
			m = map[string]any{"role": "user", "content": fmt.Sprintf("Session %d: fix the <failing> test", session)}
		case i%2 == 0:
			id := fmt.Sprintf("call_%d_%d", session, i)
			m = map[string]any{"role": "assistant", "content": "Let me read it.", "tool_calls": []any{map[string]any{
				"id": id, "type": "function", "function": map[string]any{"name": "Read", "arguments": `{"file_path":"/repo/f` + fmt.Sprint(i) + `.go"}`}}}}
		default:
			code := strings.Repeat("\tif err != nil {\n\t\treturn fmt.Errorf(\"read %s: %w\", p, err)\n\t}\n", 32<<10/64)
			m = map[string]any{"role": "tool", "tool_call_id": fmt.Sprintf("call_%d_%d", session, i-1), "content": fmt.Sprintf("%d:\n%s", i, code)}
		}
		b, err := json.Marshal(m)
		if err != nil {
			panic(err)
		}
		out = append(out, string(b))
	}
	return out
}

// memoBody joins raw top-level members ("name", JSON value) into a body, in order.
func memoBody(members ...string) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i := 0; i < len(members); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%s", members[i], members[i+1])
	}
	b.WriteByte('}')
	return b.Bytes()
}

func msgsJSON(n, session int) string { return "[" + strings.Join(memoMessages(n, session), ",") + "]" }

const memoTools = `[{"type":"function","function":{"name":"Read","description":"Reads a file","parameters":{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}}}]`

func sameMemoKey(t *testing.T, what string, got, want *Key) {
	t.Helper()
	if got.Routed != want.Routed || got.OK != want.OK || got.Stream != want.Stream || !bytes.Equal(got.Model, want.Model) ||
		got.PromptTokens != want.PromptTokens || !slices.Equal(got.Chunks, want.Chunks) || got.ShortFirstTurn != want.ShortFirstTurn {
		t.Fatalf("%s: memo key {OK %v stream %v model %q tokens %d, %d chunks, short first turn %v} != full build's {OK %v stream %v model %q tokens %d, %d chunks, short first turn %v}",
			what, got.OK, got.Stream, got.Model, got.PromptTokens, len(got.Chunks), got.ShortFirstTurn,
			want.OK, want.Stream, want.Model, want.PromptTokens, len(want.Chunks), want.ShortFirstTurn)
	}
}

// A Builder with the memo gives, body after body, exactly the key that one without it gives,
// whether the memo resumes (the body extends one keyed before, and what the remembered state
// depends on is unchanged) or must not (a field it depends on changed or repeats after the
// prefix, the history was edited, the new part is malformed).
func TestMemoMatchesFullBuild(t *testing.T) {
	const steps = 6
	tools := memoTools
	otherTools := strings.Replace(memoTools, "Reads a file", "Reads a file.", 1)
	for _, tt := range []struct {
		name string
		body func(step int) []byte
		hits int // builds that resume from the memo, of steps
	}{
		{"agent: tools before messages", func(i int) []byte {
			return memoBody("model", `"m"`, "stream", "true", "tools", tools, "messages", msgsJSON(20+i, 1))
		}, steps - 1},
		{"openai-python order: tools, stream after messages", func(i int) []byte {
			return memoBody("messages", msgsJSON(20+i, 2), "model", `"m"`, "stream", []string{"true", "false"}[i%2], "tools", tools, "temperature", "0.2")
		}, steps - 1},
		{"tools after messages change", func(i int) []byte {
			return memoBody("messages", msgsJSON(20+i, 3), "model", `"m"`, "tools", []string{tools, otherTools}[i%2])
		}, 0},
		{"tools after messages appear", func(i int) []byte {
			if i%2 == 0 {
				return memoBody("messages", msgsJSON(20+i, 4), "model", `"m"`)
			}
			return memoBody("messages", msgsJSON(20+i, 4), "model", `"m"`, "tools", tools)
		}, 0},
		{"model after messages changes", func(i int) []byte {
			return memoBody("messages", msgsJSON(20+i, 5), "model", fmt.Sprintf(`"m%d"`, i))
		}, 0},
		{"model repeated after the messages", func(i int) []byte {
			return memoBody("model", `"m"`, "messages", msgsJSON(20+i, 6), "model", fmt.Sprintf(`"m%d"`, i%2))
		}, 0},
		{"cache_salt after messages changes", func(i int) []byte {
			return memoBody("model", `"m"`, "messages", msgsJSON(20+i, 7), "cache_salt", fmt.Sprintf(`"s%d"`, i))
		}, 0},
		{"messages repeated", func(i int) []byte {
			return memoBody("model", `"m"`, "messages", msgsJSON(20+i, 8), "messages", msgsJSON(21, 9))
		}, 0},
		{"history edited", func(i int) []byte {
			m := memoMessages(20+i, 10)
			m[2] = strings.Replace(m[2], "Let me read it.", fmt.Sprintf("Let me read it (%d).", i), 1)
			return memoBody("model", `"m"`, "messages", "["+strings.Join(m, ",")+"]")
		}, 0},
		{"new part malformed on odd steps", func(i int) []byte {
			b := memoBody("model", `"m"`, "tools", tools, "messages", msgsJSON(20+i, 11))
			if i%2 == 1 {
				b = append(b[:len(b)-2], `,{"role":"user","content":"x"]}`...) // a '}' missing
			}
			return b
		}, 2}, // steps 2 and 4 resume from the body before the malformed one
		{"short first turn (no system prompt): the remembered state keeps ShortFirstTurn", func(i int) []byte {
			m := memoMessages(20+i, 13)
			m[1] = `{"role":"user","content":"Fix the test."}`
			return memoBody("model", `"m"`, "messages", "["+strings.Join(m[1:], ",")+"]")
		}, steps - 1},
		{"more messages than the first pass indexes", func(i int) []byte {
			m := memoMessages(20, 14)
			for j := range maxIndexedMsgs + 100 + 7*i {
				m = append(m, fmt.Sprintf(`{"role":"user","content":"ok \"%d\""}`, j))
			}
			return memoBody("model", `"m"`, "messages", "["+strings.Join(m, ",")+"]")
		}, steps - 1},
		{"stream before, other fields after", func(i int) []byte {
			return memoBody("stream", "true", "model", `"m"`, "messages", msgsJSON(20+i, 12), "max_tokens", fmt.Sprint(16+i), "response_format", `{"type":"text"}`)
		}, steps - 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			withMemo := NewBuilder(0)
			plain := &Builder{ChunkTokens: DefaultChunkTokens}
			var got, want Key
			for i := range steps {
				b := tt.body(i)
				if len(b) < memoMinBody {
					t.Fatalf("step %d: body of %d bytes is below memoMinBody", i, len(b))
				}
				withMemo.Build([]byte(pathChat), b, &got)
				plain.Build([]byte(pathChat), b, &want)
				sameMemoKey(t, fmt.Sprintf("step %d", i), &got, &want)
				if want.ShortFirstTurn != strings.HasPrefix(tt.name, "short first turn") {
					t.Fatalf("step %d: ShortFirstTurn %v", i, want.ShortFirstTurn)
				}
				if i%2 == 0 && !want.OK {
					t.Fatalf("step %d: the body did not parse", i)
				}
			}
			if h := int(withMemo.memo.hits.Load()); h != tt.hits {
				t.Errorf("%d of %d builds resumed from the memo, want %d", h, steps, tt.hits)
			}
		})
	}
}

// Many sessions keyed at once by one Builder: every key is the full build's, and most
// builds resume (run under -race, this also checks the slots' locking).
func TestMemoConcurrent(t *testing.T) {
	const sessions, steps = 8, 4
	withMemo := NewBuilder(0)
	plain := &Builder{ChunkTokens: DefaultChunkTokens}
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got, want Key
			for i := range steps {
				b := memoBody("model", `"m"`, "tools", memoTools, "messages", msgsJSON(20+i, 100+s))
				withMemo.Build([]byte(pathChat), b, &got)
				plain.Build([]byte(pathChat), b, &want)
				if !got.OK || !slices.Equal(got.Chunks, want.Chunks) || got.PromptTokens != want.PromptTokens {
					errs <- fmt.Errorf("session %d step %d: memo key differs from the full build's", s, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if h := withMemo.memo.hits.Load(); h == 0 {
		t.Errorf("no build of %d resumed from the memo", sessions*steps)
	}
}

// Bodies under memoMinBody and other endpoints neither use nor fill the memo.
func TestMemoSmallBodies(t *testing.T) {
	bld := NewBuilder(0)
	var k Key
	for i := range 4 {
		bld.Build([]byte(pathChat), memoBody("model", `"m"`, "messages", msgsJSON(2+i, 1)), &k)
		if !k.OK {
			t.Fatal("small body not OK")
		}
	}
	for i := range bld.memo.slots {
		if bld.memo.slots[i].key.Load() != 0 {
			t.Fatalf("slot %d filled by a small body", i)
		}
	}
}

// TestMemoSteadyStateAllocs: after warm-up, building a session's bodies one after another
// (each resuming from the one before) allocates nothing, remembering included.
func TestMemoSteadyStateAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocation counts need a non-race, non-short run (sync.Pool drops items at random under -race)")
	}
	const steps = 4
	bodies := make([][]byte, steps)
	for i := range bodies {
		bodies[i] = memoBody("model", `"m"`, "tools", memoTools, "messages", msgsJSON(20+i, 1))
	}
	b := NewBuilder(0)
	k := new(Key)
	for range 2 {
		for _, body := range bodies {
			b.Build([]byte(pathChat), body, k)
		}
	}
	i := 0
	hits := b.memo.hits.Load()
	// sync.Pool may drop its item at a GC; allow a stray allocation in 100 runs.
	if got := testing.AllocsPerRun(100, func() { b.Build([]byte(pathChat), bodies[i%steps], k); i++ }); got > 0.05 {
		t.Errorf("%.2f allocs per Build, want 0", got)
	}
	if b.memo.hits.Load()-hits < 50 {
		t.Errorf("%d of ~100 builds resumed from the memo", b.memo.hits.Load()-hits)
	}
}
