package key

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// stream builds an expected canonical stream (render.go, render_messages.go) piece by piece.
type stream []byte

func (s stream) tag(t byte) stream { return append(s, t) }

func (s stream) str(t byte, b string) stream {
	s = append(s, t)
	s = binary.AppendUvarint(s, uint64(len(b)))
	return append(s, b...)
}

func (s stream) text(b string) stream { return append(append(append(s, tagText), b...), textEnd) }

func (s stream) media(typ string, h uint64) stream {
	return binary.LittleEndian.AppendUint64(s.str(tagMedia, typ), h)
}

// chainOf is the documented chunk chain (chunk.go) of a kindChat stream for model m, no salt,
// with chunks of chunkTokens×4 bytes, the HeadChunks first smaller (chunkBytes).
func chainOf(m string, st []byte, chunkTokens int) []uint64 {
	seedIn := seedDomain + string(rune(kindChat)) + "m" + string(binary.AppendUvarint(nil, uint64(len(m)))) + m + "s\x00"
	return refChain(xxhash.Sum64String(seedIn), st, chunkTokens*BytesPerToken)
}

// refChain is the chunk hashes of a rendered stream as the key format defines them, written
// out with no shortcut: chunks 0 and 1 a sixteenth of size and the rest of a quarter, then
// size up to FineChunks, then
// CoarseFactor × size; h_i = xxhash64(seed ‖ h_{i-1} ‖ xxhash64(chunk_i)) with bit 0
// (coarseMark) cleared for the fine chunks and set for the coarse ones.
func refChain(seed uint64, st []byte, size int) []uint64 {
	var out []uint64
	var prev uint64
	// A sixteenth and the rest of a quarter, in whole 4-byte tokens, at least one each.
	head := [2]int{max(size/16/4*4, 4)}
	head[1] = max(size/4/4*4-head[0], 4)
	n := head[0]
	for len(st) >= n {
		buf := binary.LittleEndian.AppendUint64(nil, seed)
		buf = binary.LittleEndian.AppendUint64(buf, prev)
		buf = binary.LittleEndian.AppendUint64(buf, xxhash.Sum64(st[:n]))
		prev = xxhash.Sum64(buf) &^ 1
		if len(out) >= FineChunks {
			prev |= 1
		}
		out = append(out, prev)
		st = st[n:]
		switch {
		case len(out) < len(head):
			n = head[len(out)]
		case len(out) >= FineChunks:
			n = size * CoarseFactor
		default:
			n = size
		}
	}
	return out
}

// messagesBodies are Messages API bodies of every shape the renderer reads, and hostile ones;
// they seed FuzzBuild too.
var messagesBodies = []struct{ name, path, body string }{
	{"msgs simple", pathMsgs, `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`},
	{"msgs system blocks tools", pathMsgs, `{"model":"m","system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],"tools":[{"name":"Read","description":"read a file","input_schema":{"type":"object","properties":{"path":{"type":"string"}}},"cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}],"stream":true}`},
	{"msgs tool loop", pathMsgs, `{"model":"m","messages":[{"role":"user","content":"read a.go"},{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"toolu_1","name":"Read","input":{"path":"a.go"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"package a"}],"is_error":false},{"type":"text","text":"now fix it"}]}]}`},
	{"msgs tool error string", pathMsgs, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"boom","is_error":true}]}]}`},
	{"msgs image url and thinking", pathMsgs, `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]},{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"text","text":"done"}]}]}`},
	{"msgs hostile content number", pathMsgs, `{"messages":[{"role":"user","content":7}]}`},
	{"msgs hostile block not object", pathMsgs, `{"messages":[{"role":"user","content":["x"]}]}`},
	{"msgs hostile tools object", pathMsgs, `{"tools":{"name":"x"},"messages":[]}`},
	{"msgs hostile tool not object", pathMsgs, `{"tools":[1],"messages":[]}`},
	{"msgs hostile image no source", pathMsgs, `{"messages":[{"role":"user","content":[{"type":"image"}]}]}`},
	{"msgs hostile tool_use name number", pathMsgs, `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":3,"input":{}}]}]}`},
	{"msgs hostile nested tool_result", pathMsgs, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"tool_result","tool_use_id":"b","content":[{"type":"text"}]}]}]}]}`},
	{"msgs hostile system number", pathMsgs, `{"system":5,"messages":[]}`},
	{"msgs hostile truncated", pathMsgs, `{"messages":[{"role":"user","content":[{"type":"text","text":"x"}`},
	{"msgs no messages", pathMsgs, `{"model":"m","system":"x"}`},
	{"embeddings string", pathEmbed, `{"model":"e","input":"hello world"}`},
	{"embeddings list", pathEmbed, `{"model":"e","input":["abcdefgh","b"]}`},
	{"embeddings ids", pathEmbed, `{"model":"e","input":[1,2,3]}`},
	{"embeddings messages", pathEmbed, `{"model":"e","messages":[{"role":"user","content":"hi"}]}`},
	{"embeddings hostile", pathEmbed, `{"model":"e","input":{"x":1}}`},
	{"rerank", pathRerank, `{"model":"r","query":"q","documents":["a","b"]}`},
	{"rerank hostile model", pathRerank, `{"model":[1],"query":"q"}`},
}

// TestMessagesRender checks the rendering of each Messages API production against the stream
// written out by hand (render_messages.go's grammar), chunk hash by chunk hash.
func TestMessagesRender(t *testing.T) {
	const imgData = "iVBORw0KGgoAAAANSUhEUg=="
	tools := `[{"name":"Read","description":"read a file","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}]`
	toolsCanon := stream{}.tag(canonArray).tag(canonObject).
		str(canonString, "name").str(canonString, "Read").
		str(canonString, "description").str(canonString, "read a file").
		str(canonString, "input_schema").tag(canonObject).str(canonString, "type").str(canonString, "object").tag(canonObjectEnd).
		tag(canonObjectEnd).tag(canonArrayEnd)
	input := stream{}.tag(canonObject).str(canonString, "path").str(canonString, "a.go").tag(canonObjectEnd)
	thinking := stream{}.tag(canonObject).str(canonString, "type").str(canonString, "thinking").
		str(canonString, "thinking").str(canonString, "hmm").tag(canonObjectEnd)
	tests := []struct {
		name, body string
		want       stream
	}{
		{"system string", `{"model":"m","system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
			stream{}.str(tagMessage, "system").text("be brief").str(tagMessage, "user").text("hi")},
		{"system blocks with cache_control", `{"model":"m","system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],"messages":[]}`,
			stream{}.str(tagMessage, "system").text("a").text("b")},
		{"tools without cache_control, before system", `{"model":"m","messages":[{"role":"user","content":"hi"}],"system":"s","tools":` + tools + `}`,
			append(stream{tagTools}, toolsCanon...).str(tagMessage, "system").text("s").str(tagMessage, "user").text("hi")},
		{"image base64 keyed on its bytes", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is it"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + imgData + `"}}]}]}`,
			stream{}.str(tagMessage, "user").text("what is it").media("image", xxhash.Sum64String(imgData))},
		{"image url keyed on the URL", `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/cat.png"},"cache_control":{"type":"ephemeral"}}]}]}`,
			stream{}.str(tagMessage, "user").media("image", xxhash.Sum64String("https://x/cat.png"))},
		{"tool_use then tool_result then text", `{"model":"m","messages":[` +
			`{"role":"assistant","content":[{"type":"text","text":"reading"},{"type":"tool_use","id":"toolu_1","name":"Read","input":{"path":"a.go"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"package a"}]},{"type":"text","text":"fix it"}]}]}`,
			append(stream{}.str(tagMessage, "assistant").text("reading").str(tagToolUse, "toolu_1").str(tagCall, "Read"), input...).
				str(tagMessage, "user").str(tagToolResult, "toolu_1").text("package a").tag(tagToolResEnd).text("fix it")},
		{"tool_result string content, is_error", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"boom","is_error":true,"cache_control":{"type":"ephemeral"}}]}]}`,
			stream{}.str(tagMessage, "user").str(tagToolResult, "t").tag(tagToolError).text("boom").tag(tagToolResEnd)},
		{"tool_use without input", `{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"x","name":"now"}]}]}`,
			stream{}.str(tagMessage, "assistant").str(tagToolUse, "x").str(tagCall, "now").str(tagArgs, "")},
		{"unknown block: canon without cache_control", `{"model":"m","messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","cache_control":{"type":"ephemeral"}}]}]}`,
			stream{}.str(tagMessage, "assistant").media("thinking", xxhash.Sum64(thinking))},
	}
	b := NewBuilder(1)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := build(b, pathMsgs, tt.body)
			if !k.OK || !k.Routed || k.API != APIMessages {
				t.Fatalf("OK %v Routed %v API %v, want true true messages", k.OK, k.Routed, k.API)
			}
			want := chainOf("m", tt.want, 1)
			if len(want) == 0 || !slices.Equal(k.Chunks, want) {
				t.Errorf("chunks\n got %x\nwant %x (stream %q)", k.Chunks, want, tt.want)
			}
			if k.PromptTokens != len(tt.want)/BytesPerToken {
				t.Errorf("PromptTokens = %d, want %d", k.PromptTokens, len(tt.want)/BytesPerToken)
			}
		})
	}
}

// TestMessagesMatchesChat: a text conversation sent to /v1/messages keys like the same
// conversation sent to /v1/chat/completions (vLLM renders both through one chat template), with
// system as a string or as text blocks, and content as a string or text blocks.
func TestMessagesMatchesChat(t *testing.T) {
	b := NewBuilder(4)
	c := build(b, pathChat, `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"`+long+`"},{"role":"assistant","content":"ok"}]}`)
	for _, body := range []string{
		`{"model":"m","max_tokens":9,"system":"You are terse.","messages":[{"role":"user","content":"` + long + `"},{"role":"assistant","content":"ok"}]}`,
		`{"model":"m","system":[{"type":"text","text":"You are terse."}],"messages":[{"role":"user","content":[{"type":"text","text":"` + long + `","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":[{"type":"text","text":"ok"}]}]}`,
	} {
		m := build(b, pathMsgs, body)
		if !m.OK || !c.OK || len(c.Chunks) == 0 || !slices.Equal(m.Chunks, c.Chunks) || m.PromptTokens != c.PromptTokens {
			t.Errorf("messages key %x (ok %v, %d tokens), want chat key %x (ok %v, %d tokens)", m.Chunks, m.OK, m.PromptTokens, c.Chunks, c.OK, c.PromptTokens)
		}
	}
}

// TestMessagesKeys: what must and must not change a Messages API key.
func TestMessagesKeys(t *testing.T) {
	msgs := func(extra, m string) string {
		return `{"model":"m"` + extra + `,"messages":[` + m + `,{"role":"user","content":"` + long + `"}]}`
	}
	img := func(src string) string {
		return `{"role":"user","content":[{"type":"image","source":` + src + `}]}`
	}
	use := func(id, input string) string {
		return `{"role":"assistant","content":[{"type":"tool_use","id":"` + id + `","name":"f","input":` + input + `}]}`
	}
	same := []struct{ name, a, b string }{
		{"cache_control everywhere", msgs(`,"cache_control":{"type":"ephemeral"},"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"tools":[{"name":"t","input_schema":{},"cache_control":{"type":"ephemeral"}}]`, `{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}`),
			msgs(`,"system":[{"type":"text","text":"s"}],"tools":[{"name":"t","input_schema":{}}]`, `{"role":"user","content":"x"}`)},
		{"sampling and max_tokens ignored", msgs(`,"max_tokens":5,"temperature":0.1,"stream":true,"metadata":{"user_id":"u"}`, `{"role":"user","content":"x"}`), msgs("", `{"role":"user","content":"x"}`)},
		{"image media_type ignored", msgs("", img(`{"type":"base64","media_type":"image/png","data":"AAAA"}`)), msgs("", img(`{"data":"AAAA","type":"base64","media_type":"image/jpeg"}`))},
	}
	diff := []struct{ name, a, b string }{
		{"image bytes", msgs("", img(`{"type":"base64","data":"AAAA"}`)), msgs("", img(`{"type":"base64","data":"AAAB"}`))},
		{"image url", msgs("", img(`{"type":"url","url":"https://x/a"}`)), msgs("", img(`{"type":"url","url":"https://x/b"}`))},
		{"tool_use id", msgs("", use("a", `{}`)), msgs("", use("b", `{}`))},
		{"tool_use input", msgs("", use("a", `{"x":1}`)), msgs("", use("a", `{"x":2}`))},
		{"tool_result is_error", msgs("", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"}]}`), msgs("", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x","is_error":true}]}`)},
		{"text inside vs after tool_result", msgs("", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"},{"type":"text","text":"y"}]}`), msgs("", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]}]}`)},
		{"tools", msgs(`,"tools":[{"name":"a","input_schema":{}}]`, `{"role":"user","content":"x"}`), msgs(`,"tools":[{"name":"b","input_schema":{}}]`, `{"role":"user","content":"x"}`)},
		{"model", msgs("", `{"role":"user","content":"x"}`), strings.Replace(msgs("", `{"role":"user","content":"x"}`), `"m"`, `"m2"`, 1)},
	}
	b := NewBuilder(1)
	for _, tt := range same {
		t.Run("same/"+tt.name, func(t *testing.T) {
			ka, kb := build(b, pathMsgs, tt.a), build(b, pathMsgs, tt.b)
			if !ka.OK || !kb.OK || len(ka.Chunks) == 0 || !slices.Equal(ka.Chunks, kb.Chunks) {
				t.Errorf("keys differ or not OK (%v %v): %x vs %x", ka.OK, kb.OK, ka.Chunks, kb.Chunks)
			}
		})
	}
	for _, tt := range diff {
		t.Run("diff/"+tt.name, func(t *testing.T) {
			ka, kb := build(b, pathMsgs, tt.a), build(b, pathMsgs, tt.b)
			if !ka.OK || !kb.OK || len(ka.Chunks) == 0 || slices.Equal(ka.Chunks, kb.Chunks) {
				t.Errorf("keys equal or not OK (%v %v): %x", ka.OK, kb.OK, ka.Chunks)
			}
		})
	}
}

// TestMessagesBodies: every seed body gives the documented OK, and the hostile ones fall back
// (Routed, !OK, no chunks) with Model still read where the body parsed.
func TestMessagesBodies(t *testing.T) {
	b := NewBuilder(1)
	for _, x := range messagesBodies {
		t.Run(x.name, func(t *testing.T) {
			k := build(b, x.path, x.body)
			hostile := strings.Contains(x.name, "hostile") || x.name == "msgs no messages"
			switch {
			case x.path == pathRerank:
				if k.Routed || k.OK || len(k.Chunks) != 0 || k.API != APIModelOnly {
					t.Fatalf("rerank keyed: %+v", k)
				}
				if wantModel := map[bool]string{false: "r", true: ""}[hostile]; string(k.Model) != wantModel {
					t.Errorf("Model = %q, want %q", k.Model, wantModel)
				}
			case hostile:
				if !k.Routed || k.OK || len(k.Chunks) != 0 || k.PromptTokens != 0 {
					t.Errorf("hostile body keyed: %+v", k)
				}
			default:
				if !k.Routed || !k.OK || len(k.Chunks) == 0 {
					t.Errorf("OK %v, %d chunks; want OK with chunks", k.OK, len(k.Chunks))
				}
			}
		})
	}
}

// TestEmbeddingsKeys: /v1/embeddings keys "input" like a completions prompt (a batch by its
// first input) under its own seed, and chat-style "messages" like chat.
func TestEmbeddingsKeys(t *testing.T) {
	b := NewBuilder(1)
	one := build(b, pathEmbed, `{"model":"e","input":"`+long+`"}`)
	batch := build(b, pathEmbed, `{"model":"e","input":["`+long+`","other"]}`)
	compl := build(b, pathCompl, `{"model":"e","prompt":"`+long+`"}`)
	if !one.OK || len(one.Chunks) == 0 || !slices.Equal(one.Chunks, batch.Chunks) || !slices.Equal(one.Chunks, compl.Chunks) {
		t.Errorf("embeddings input keys: one %x, batch %x, completions %x; want equal, non-empty", one.Chunks, batch.Chunks, compl.Chunks)
	}
	chatE := build(b, pathEmbed, `{"model":"e","messages":[{"role":"user","content":"`+long+`"}]}`)
	chatC := build(b, pathChat, `{"model":"e","messages":[{"role":"user","content":"`+long+`"}]}`)
	if !chatE.OK || len(chatE.Chunks) == 0 || !slices.Equal(chatE.Chunks, chatC.Chunks) {
		t.Errorf("embeddings messages key %x, want chat's %x", chatE.Chunks, chatC.Chunks)
	}
}

// agentTurns is a multi-turn coding-agent conversation in Messages API shape: a user task,
// then rounds of assistant text + tool_use and user tool_result (+ sometimes a text nudge),
// images included, ending with the assistant's answer.
func agentTurns(rounds int) []any {
	out := []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "Fix the failing test in pkg/foo. " + systemPrompt[:200]},
		map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUgAA"}},
	}}}
	for i := range rounds {
		id := fmt.Sprintf("toolu_%04d", i)
		out = append(out, map[string]any{"role": "assistant", "content": []any{
			map[string]any{"type": "text", "text": fmt.Sprintf("Step %d: I will read the file.", i)},
			map[string]any{"type": "tool_use", "id": id, "name": "Read", "input": map[string]any{"path": fmt.Sprintf("pkg/foo/f%d.go", i), "limit": 200}},
		}})
		result := []any{map[string]any{"type": "tool_result", "tool_use_id": id, "is_error": i%3 == 2,
			"content": []any{map[string]any{"type": "text", "text": strings.Repeat(fmt.Sprintf("line %d of file %d\n", i, i), 12)}}}}
		if i%2 == 1 {
			result = append(result, map[string]any{"type": "text", "text": "keep going", "cache_control": map[string]any{"type": "ephemeral"}})
		}
		out = append(out, map[string]any{"role": "user", "content": result})
	}
	return append(out, map[string]any{"role": "assistant", "content": "Fixed: the test now passes."})
}

// TestMessagesPrefixProperty is chat's prefix property (prefix_test.go) over a multi-turn
// agent conversation with tool_use and tool_result: turn n's chunk hashes are a prefix of turn
// n+1's, at two chunk sizes, with system blocks and tools carrying cache_control (which Claude
// Code moves from turn to turn: the last user message carries it, and it must not matter).
func TestMessagesPrefixProperty(t *testing.T) {
	conv := agentTurns(8)
	system := []any{map[string]any{"type": "text", "text": systemPrompt, "cache_control": map[string]any{"type": "ephemeral"}}}
	tools := []any{map[string]any{"name": "Read", "description": "Read a file", "input_schema": map[string]any{
		"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}}}}
	for _, chunk := range []int{16, 64} {
		t.Run(fmt.Sprint("chunk", chunk), func(t *testing.T) {
			b := NewBuilder(chunk)
			var prev Key
			for n := 1; n <= len(conv); n++ {
				body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1024, "stream": true,
					"system": system, "tools": tools, "messages": conv[:n]})
				if err != nil {
					t.Fatal(err)
				}
				k := build(b, pathMsgs, string(body))
				if !k.OK {
					t.Fatalf("turn %d: OK = false", n)
				}
				if n > 1 {
					if len(k.Chunks) < len(prev.Chunks) || !slices.Equal(k.Chunks[:len(prev.Chunks)], prev.Chunks) {
						t.Fatalf("chunks of turn %d (%d) are not a prefix of turn %d's (%d)", n-1, len(prev.Chunks), n, len(k.Chunks))
					}
					if k.PromptTokens <= prev.PromptTokens {
						t.Fatalf("PromptTokens turn %d = %d, turn %d = %d; want growth", n-1, prev.PromptTokens, n, k.PromptTokens)
					}
				}
				prev = k
			}
			if len(prev.Chunks) < 10 {
				t.Fatalf("%d chunks for the whole conversation; the test checks little", len(prev.Chunks))
			}
		})
	}
}

// messagesAgentBody is the /v1/messages body of agentTurns(rounds) with a system block and a
// tool, as a coding agent sends it.
func messagesAgentBody(rounds int) []byte {
	body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1024, "stream": true,
		"system":   []any{map[string]any{"type": "text", "text": systemPrompt, "cache_control": map[string]any{"type": "ephemeral"}}},
		"tools":    []any{map[string]any{"name": "Read", "description": "Read a file", "input_schema": map[string]any{"type": "object"}}},
		"messages": agentTurns(rounds)})
	if err != nil {
		panic(err)
	}
	return body
}
