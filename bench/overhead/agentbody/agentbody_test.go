package agentbody

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/router/key"
)

// chatPath is where an agent's bodies go.
var chatPath = []byte("/v1/chat/completions")

// agentRequest is what the test reads back of a body.
type agentRequest struct {
	Model  string `json:"model"`
	Stream *bool  `json:"stream"`
	Tools  []struct {
		Type     string `json:"type"`
		Function struct {
			Name       string `json:"name"`
			Parameters struct {
				Type       string                     `json:"type"`
				Properties map[string]json.RawMessage `json:"properties"`
				Required   []string                   `json:"required"`
			} `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	Messages []struct {
		Role       string  `json:"role"`
		Content    *string `json:"content"`
		ToolCallID string  `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
}

func newWorkload(t testing.TB, o Options) *Workload {
	t.Helper()
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// Every body is a valid chat request of a coding agent: tools with JSON Schema parameters, a
// system prompt, the task, then assistant turns each calling one tool and that tool's result
// (ids matching, arguments valid JSON), at most Size bytes and not far under it.
func TestBodyShape(t *testing.T) {
	for _, size := range []int{MinSize, 64 << 10, 1 << 20} {
		w := newWorkload(t, Options{Size: size, SystemPrompts: 2, StreamFraction: 0.5, Seed: 3})
		var buf []byte
		streams, n := 0, uint64(300)
		if size >= 1<<20 {
			n = 40 // decoding a MB is slow under -race
		}
		for i := range n {
			var stream bool
			buf, stream = w.Body(buf, i*7)
			if n := len(buf); n > size || n < size*8/10 {
				t.Fatalf("size %d: body %d is %d bytes, want (0.8, 1] × size", size, i*7, n)
			}
			var r agentRequest
			if err := json.Unmarshal(buf, &r); err != nil {
				t.Fatalf("size %d: body %d is not JSON: %v", size, i*7, err)
			}
			if r.Model != DefaultModel || r.Stream == nil || *r.Stream != stream {
				t.Fatalf("size %d: model %q, stream %v (Body said %v)", size, r.Model, r.Stream, stream)
			}
			if stream {
				streams++
			}
			if len(r.Tools) != len(toolDefs) {
				t.Fatalf("size %d: %d tools, want %d", size, len(r.Tools), len(toolDefs))
			}
			for _, tl := range r.Tools {
				p := tl.Function.Parameters
				if tl.Type != "function" || tl.Function.Name == "" || p.Type != "object" || len(p.Properties) == 0 || len(p.Required) == 0 {
					t.Fatalf("size %d: tool %+v", size, tl)
				}
			}
			_, step := w.Request(i * 7)
			m := r.Messages
			if len(m) < 4 || m[0].Role != "system" || m[1].Role != "user" || !strings.HasPrefix(*m[1].Content, "Session ") {
				t.Fatalf("size %d: messages begin %+v", size, m[:min(len(m), 2)])
			}
			if (len(m)-2)%2 != 0 {
				t.Fatalf("size %d: %d messages after the task, want pairs of call and result", size, len(m)-2)
			}
			for j := 2; j < len(m); j += 2 {
				a, res := m[j], m[j+1]
				if a.Role != "assistant" || len(a.ToolCalls) != 1 || res.Role != "tool" || res.Content == nil || *res.Content == "" {
					t.Fatalf("size %d: messages %d, %d: %+v %+v", size, j, j+1, a, res)
				}
				c := a.ToolCalls[0]
				if c.Type != "function" || c.ID == "" || c.ID != res.ToolCallID || !json.Valid([]byte(c.Function.Arguments)) {
					t.Fatalf("size %d: call %+v answered by %q", size, c, res.ToolCallID)
				}
				if !slices.ContainsFunc(r.Tools, func(tl struct {
					Type     string `json:"type"`
					Function struct {
						Name       string `json:"name"`
						Parameters struct {
							Type       string                     `json:"type"`
							Properties map[string]json.RawMessage `json:"properties"`
							Required   []string                   `json:"required"`
						} `json:"parameters"`
					} `json:"function"`
				}) bool {
					return tl.Function.Name == c.Function.Name
				}) {
					t.Fatalf("size %d: call of undeclared tool %q", size, c.Function.Name)
				}
			}
			if calls := (len(m) - 2) / 2; calls < step+1 {
				t.Fatalf("size %d: step %d has %d calls", size, step, calls)
			}
		}
		if streams == 0 || streams == int(n) {
			t.Errorf("size %d: %d of %d bodies streamed, want a mix", size, streams, n)
		}
		// Escapes as a client writes them: newlines and tabs of tool results, quotes of
		// arguments, arguments holding escaped code (escaped twice).
		for _, esc := range []string{`\n`, `\t`, `\"`, `\\t`} {
			if !bytes.Contains(buf, []byte(esc)) {
				t.Errorf("size %d: no %s in a body", size, esc)
			}
		}
		b1, _ := w.Body(nil, 12345)
		b2, _ := w.Body(make([]byte, 10), 12345)
		if !bytes.Equal(b1, b2) {
			t.Errorf("size %d: body 12345 not reproducible", size)
		}
	}
}

// Each request of a session is the previous one plus one step: its bytes up to the closing
// "]}" are a prefix of the next request's, which adds one assistant turn and one tool result,
// and its routing key's chunks are a prefix of the next one's. Sessions share the chunks of
// the tools and the system prompt, and no more.
func TestSessionPrefix(t *testing.T) {
	const sessions, steps = 8, 5
	w := newWorkload(t, Options{Size: 256 << 10, Sessions: sessions, Steps: steps, StreamFraction: 0.5, Seed: 9})
	kb := key.NewBuilder(0)
	var prev, cur []byte
	var kPrev, kCur key.Key
	checked := 0
	for i := uint64(sessions); i < 4*sessions*steps; i++ {
		s, step := w.Request(i)
		ps, pstep := w.Request(i - sessions)
		prev, _ = w.Body(prev, i-sessions)
		cur, _ = w.Body(cur, i)
		if step == 0 {
			if ps == s {
				t.Fatalf("request %d begins session %d, and request %d was in it too", i, s, i-sessions)
			}
			if bytes.HasPrefix(cur, prev[:len(prev)-len(tail)]) {
				t.Fatalf("request %d (a new session) extends request %d", i, i-sessions)
			}
			continue
		}
		if ps != s || pstep != step-1 {
			t.Fatalf("request %d: session %d step %d; request %d: session %d step %d", i, s, step, i-sessions, ps, pstep)
		}
		head := prev[:len(prev)-len(tail)]
		if !bytes.HasPrefix(cur, head) {
			t.Fatalf("request %d (session %d step %d) does not extend request %d", i, s, step, i-sessions)
		}
		added := cur[len(head) : len(cur)-len(tail)]
		if !bytes.HasPrefix(added, []byte(`,{"role":"assistant"`)) || bytes.Count(added, []byte(`{"role":`)) != 2 {
			t.Fatalf("request %d adds %.200q…, want one assistant turn and one tool result", i, added)
		}
		kb.Build(chatPath, prev, &kPrev)
		kb.Build(chatPath, cur, &kCur)
		// A step adds at least minStep bytes, less than a coarse chunk (key.CoarseFactor ×
		// 256 bytes) past key.FineChunks: the prompt grows, its chunks may not.
		if !kPrev.OK || !kCur.OK || kCur.PromptTokens < kPrev.PromptTokens+minStep/key.BytesPerToken/2 || len(kCur.Chunks) < len(kPrev.Chunks) {
			t.Fatalf("request %d: keys OK %v %v, %d and %d tokens, %d and %d chunks", i, kPrev.OK, kCur.OK,
				kPrev.PromptTokens, kCur.PromptTokens, len(kPrev.Chunks), len(kCur.Chunks))
		}
		if !slices.Equal(kPrev.Chunks, kCur.Chunks[:len(kPrev.Chunks)]) {
			t.Fatalf("request %d: the previous request's chunks are not a prefix of its own", i)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no request checked")
	}

	// Two sessions of one system prompt share the header's chunks, then part.
	a, _ := w.Body(nil, 0)
	b, _ := w.Body(nil, 1)
	kb.Build(chatPath, a, &kPrev)
	kb.Build(chatPath, b, &kCur)
	shared := 0
	for shared < min(len(kPrev.Chunks), len(kCur.Chunks)) && kPrev.Chunks[shared] == kCur.Chunks[shared] {
		shared++
	}
	header := bytes.Index(a, []byte(`{"role":"user"`))
	if want := header / (4 * key.DefaultChunkTokens); shared < want/2 || shared > want+2 {
		t.Errorf("sessions 0 and 1 share %d chunks; their header (tools, system prompt: %d bytes) is about %d", shared, header, want)
	}
}

func TestRequest(t *testing.T) {
	w := newWorkload(t, Options{Size: MinSize, Sessions: 4, Steps: 3})
	for _, tt := range []struct {
		i       uint64
		session uint64
		step    int
	}{
		{0, 0, 0}, {3, 3, 0}, {4, 0, 1}, {7, 3, 1}, {8, 0, 2}, {11, 3, 2},
		{12, 4, 0}, {13, 5, 0}, {16, 4, 1}, {24, 8, 0},
	} {
		if s, step := w.Request(tt.i); s != tt.session || step != tt.step {
			t.Errorf("Request(%d) = session %d step %d, want %d %d", tt.i, s, step, tt.session, tt.step)
		}
	}
}

func TestNewErrors(t *testing.T) {
	for _, o := range []Options{
		{Size: MinSize - 1},
		{Size: 1 << 20, Sessions: -1},
		{Size: 1 << 20, Steps: -1},
		{Size: 1 << 20, StreamFraction: 1.5},
		{Size: MinSize, Steps: 1000}, // a thousand steps do not fit in 64 KiB
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// A body goes into a buffer of Size capacity without allocating.
func TestBodyAllocs(t *testing.T) {
	w := newWorkload(t, Options{Size: 1 << 20, StreamFraction: 0.5})
	buf := make([]byte, 0, w.Size())
	i := uint64(0)
	if n := testing.AllocsPerRun(50, func() { buf, _ = w.Body(buf, i); i += 31 }); n != 0 {
		t.Errorf("Body allocates %v times per body", n)
	}
}

// BenchmarkBody is the load generator's cost of one 1 MiB agent body.
func BenchmarkBody(b *testing.B) {
	w := newWorkload(b, Options{Size: 1 << 20, StreamFraction: 0.5})
	buf := make([]byte, 0, w.Size())
	b.SetBytes(int64(w.Size()))
	b.ReportAllocs()
	for i := uint64(0); b.Loop(); i++ {
		buf, _ = w.Body(buf, i)
	}
}
