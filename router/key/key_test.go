package key

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
)

const (
	pathChat   = "/v1/chat/completions"
	pathCompl  = "/v1/completions"
	pathResp   = "/v1/responses"
	pathModels = "/v1/models"
	pathMsgs   = "/v1/messages"
	pathEmbed  = "/v1/embeddings"
	pathRerank = "/v1/rerank"
)

// build runs Build and returns a copy of the key, detached from any pool.
func build(b *Builder, path, body string) Key {
	var k Key
	b.Build([]byte(path), []byte(body), &k)
	return Key{
		API: k.API, Routed: k.Routed, OK: k.OK, Stream: k.Stream,
		Model:          slices.Clone(k.Model),
		PromptTokens:   k.PromptTokens,
		Chunks:         slices.Clone(k.Chunks),
		ShortFirstTurn: k.ShortFirstTurn,
	}
}

func TestRouted(t *testing.T) {
	tests := []struct {
		path string
		want bool
	}{
		{"/v1/chat/completions", true},
		{"/v1/chat/completions/", true},
		{"/v1/completions", true},
		{"/v1/completions/", true},
		{"/v1/responses", true},
		{"/v1/responses/", true},
		{"/v1/responses/resp_123", false},
		{"/v1/chat/completions//", false},
		{"/v1/chat/completionsx", false},
		{"/V1/chat/completions", false},
		{"/v1/models", false},
		{"/health", false},
		{"/metrics", false},
		{"/", false},
		{"", false},
		{"/v1/embeddings", true},
		{"/v1/messages", true},
		{"/v1/messages/", true},
		{"/v1/messages/count_tokens", false},
		{"/v1/rerank", false},
		{"/v1/score", false},
		{"/tokenize", false},
		{"/detokenize", false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			if got := Routed([]byte(tt.path)); got != tt.want {
				t.Errorf("Routed(%q) = %v, want %v", tt.path, got, tt.want)
			}
		})
	}
}

func TestNewBuilder(t *testing.T) {
	tests := []struct{ in, want int }{{0, 64}, {-3, 64}, {1, 1}, {16, 16}, {64, 64}, {1 << 30, maxChunkTokens}}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.in), func(t *testing.T) {
			if got := NewBuilder(tt.in).ChunkTokens; got != tt.want {
				t.Errorf("NewBuilder(%d).ChunkTokens = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
	// A zero Builder behaves like the default.
	body := `{"prompt":"` + strings.Repeat("x", 1000) + `"}`
	got, want := build(&Builder{}, pathCompl, body), build(NewBuilder(64), pathCompl, body)
	if !slices.Equal(got.Chunks, want.Chunks) {
		t.Errorf("zero Builder chunks = %x, want %x", got.Chunks, want.Chunks)
	}
}

var long = strings.Repeat("The quick brown fox jumps over the lazy dog. ", 30) // 1350 bytes

// TestBuild checks flags, counts and chunk counts for many body shapes.
func TestBuild(t *testing.T) {
	ids130 := make([]string, 130)
	for i := range ids130 {
		ids130[i] = fmt.Sprint(i * 1000)
	}
	ids := strings.Join(ids130, ",")
	tests := []struct {
		name     string
		path     string
		body     string
		ok       bool
		stream   bool
		model    string
		tokens   int // -1: don't check
		chunks   int // -1: don't check
		unrouted bool
	}{
		{name: "chat simple", path: pathChat, body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ok: true, model: "m", tokens: 2, chunks: 0},
		{name: "chat long", path: pathChat, body: `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`, ok: true, model: "m", tokens: (1 + 1 + 4 + 1 + 2 + 1350) / 4, chunks: 7},
		{name: "chat trailing slash", path: pathChat + "/", body: `{"messages":[{"role":"user","content":"hi"}]}`, ok: true, tokens: -1, chunks: 0},
		{name: "chat empty messages", path: pathChat, body: `{"model":"m","messages":[]}`, ok: true, model: "m", tokens: 0, chunks: 0},
		{name: "chat null content", path: pathChat, body: `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, ok: true, tokens: -1, chunks: 1},
		{name: "chat stream true", path: pathChat, body: `{"stream":true,"messages":[]}`, ok: true, stream: true, tokens: 0, chunks: 0},
		{name: "chat stream false", path: pathChat, body: `{"stream":false,"messages":[]}`, ok: true, tokens: 0, chunks: 0},
		{name: "chat stream string is not a flag", path: pathChat, body: `{"stream":"true","messages":[]}`, ok: true, tokens: 0, chunks: 0},
		{name: "chat missing messages", path: pathChat, body: `{"model":"m","prompt":"hi"}`, model: "m", tokens: 0, chunks: 0},
		{name: "chat messages not array", path: pathChat, body: `{"messages":"hi"}`, tokens: 0, chunks: 0},
		{name: "chat message not object", path: pathChat, body: `{"messages":["hi"]}`, tokens: 0, chunks: 0},
		{name: "chat content number", path: pathChat, body: `{"messages":[{"role":"user","content":5}]}`, tokens: 0, chunks: 0},
		{name: "chat role number", path: pathChat, body: `{"messages":[{"role":1,"content":"x"}]}`, tokens: 0, chunks: 0},
		{name: "chat text part without text", path: pathChat, body: `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, tokens: 0, chunks: 0},
		{name: "chat part not object", path: pathChat, body: `{"messages":[{"role":"user","content":["x"]}]}`, tokens: 0, chunks: 0},
		{name: "chat tool_calls not array", path: pathChat, body: `{"messages":[{"role":"assistant","tool_calls":{}}]}`, tokens: 0, chunks: 0},
		{name: "model number", path: pathChat, body: `{"model":7,"messages":[]}`, tokens: 0, chunks: 0},
		{name: "model null", path: pathChat, body: `{"model":null,"messages":[]}`, ok: true, tokens: 0, chunks: 0},
		{name: "salt number", path: pathChat, body: `{"model":"m","cache_salt":1,"messages":[]}`, model: "m", tokens: 0, chunks: 0},
		{name: "stream set on fallback", path: pathChat, body: `{"model":"m","stream":true,"messages":7}`, stream: true, model: "m", tokens: 0, chunks: 0},
		{name: "malformed json", path: pathChat, body: `{"messages":[{"role":"user","content":"hi"}`, tokens: 0, chunks: 0},
		{name: "empty body", path: pathChat, body: ``, tokens: 0, chunks: 0},
		{name: "top-level array", path: pathChat, body: `[{"messages":[]}]`, tokens: 0, chunks: 0},
		{name: "trailing garbage", path: pathChat, body: `{"messages":[]} x`, tokens: 0, chunks: 0},
		{name: "invalid utf8", path: pathChat, body: "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", tokens: 0, chunks: 0},
		{name: "deep nesting", path: pathChat, body: `{"messages":[{"role":"user","content":"x"}],"tools":` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}`, tokens: 0, chunks: 0},
		{name: "nesting within limit", path: pathChat, body: `{"messages":[],"tools":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, ok: true, tokens: 100, chunks: 3},
		{name: "unicode", path: pathChat, body: `{"messages":[{"role":"user","content":"日本語のテキスト 😀 ünïcödé"}]}`, ok: true, tokens: -1, chunks: 1},

		{name: "completions empty string", path: pathCompl, body: `{"model":"m","prompt":""}`, ok: true, model: "m", tokens: 0, chunks: 0},
		{name: "completions tiny", path: pathCompl, body: `{"prompt":"hello"}`, ok: true, tokens: 1, chunks: 0},
		{name: "completions text", path: pathCompl, body: `{"prompt":"` + long + `"}`, ok: true, tokens: 1350 / 4, chunks: 7},
		{name: "completions list of strings", path: pathCompl, body: `{"prompt":["` + long + `","b"]}`, ok: true, tokens: 1350 / 4, chunks: 7},
		{name: "completions token ids", path: pathCompl, body: `{"prompt":[` + ids + `]}`, ok: true, tokens: 130, chunks: 3},
		{name: "completions list of id lists", path: pathCompl, body: `{"prompt":[[` + ids + `],[1,2]]}`, ok: true, tokens: 130, chunks: 3},
		{name: "completions 64 ids: the head chunks", path: pathCompl, body: `{"prompt":[` + strings.Repeat("7,", 63) + `7]}`, ok: true, tokens: 64, chunks: 2},
		{name: "completions empty list", path: pathCompl, body: `{"prompt":[]}`, ok: true, tokens: 0, chunks: 0},
		{name: "completions max uint32 id", path: pathCompl, body: `{"prompt":[4294967295]}`, ok: true, tokens: 1, chunks: 0},
		{name: "completions id too big", path: pathCompl, body: `{"prompt":[4294967296]}`, tokens: 0, chunks: 0},
		{name: "completions negative id", path: pathCompl, body: `{"prompt":[1,-1]}`, tokens: 0, chunks: 0},
		{name: "completions float id", path: pathCompl, body: `{"prompt":[1.5]}`, tokens: 0, chunks: 0},
		{name: "completions mixed list", path: pathCompl, body: `{"prompt":["a",1]}`, tokens: 0, chunks: 0},
		{name: "completions list of objects", path: pathCompl, body: `{"prompt":[{}]}`, tokens: 0, chunks: 0},
		{name: "completions bad id in first list", path: pathCompl, body: `{"prompt":[[1,"x"]]}`, tokens: 0, chunks: 0},
		{name: "completions null prompt", path: pathCompl, body: `{"prompt":null}`, tokens: 0, chunks: 0},
		{name: "completions missing prompt", path: pathCompl, body: `{"messages":[]}`, tokens: 0, chunks: 0},
		{name: "completions prompt number", path: pathCompl, body: `{"prompt":1}`, tokens: 0, chunks: 0},

		{name: "responses string", path: pathResp, body: `{"model":"m","input":"hi","stream":true}`, ok: true, stream: true, model: "m", tokens: (6 + 4) / 4, chunks: 0},
		{name: "responses instructions only", path: pathResp, body: `{"instructions":"be nice"}`, ok: true, tokens: -1, chunks: 1},
		{name: "responses items", path: pathResp, body: `{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"https://x/y.png"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"42"},{"type":"reasoning","summary":[]}]}`, ok: true, tokens: -1, chunks: 2},
		{name: "responses no input", path: pathResp, body: `{"model":"m"}`, model: "m", tokens: 0, chunks: 0},
		{name: "responses input number", path: pathResp, body: `{"input":3}`, tokens: 0, chunks: 0},
		{name: "responses item not object", path: pathResp, body: `{"input":["hi"]}`, tokens: 0, chunks: 0},

		{name: "unrouted path", path: pathModels, body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, unrouted: true, tokens: 0, chunks: 0},
		{name: "unrouted sub path", path: "/v1/responses/abc", body: `{"input":"x"}`, unrouted: true, tokens: 0, chunks: 0},
	}
	b := NewBuilder(64)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := build(b, tt.path, tt.body)
			if k.Routed != !tt.unrouted {
				t.Errorf("Routed = %v, want %v", k.Routed, !tt.unrouted)
			}
			if k.OK != tt.ok {
				t.Errorf("OK = %v, want %v", k.OK, tt.ok)
			}
			if k.Stream != tt.stream {
				t.Errorf("Stream = %v, want %v", k.Stream, tt.stream)
			}
			if string(k.Model) != tt.model {
				t.Errorf("Model = %q, want %q", k.Model, tt.model)
			}
			if tt.tokens >= 0 && k.PromptTokens != tt.tokens {
				t.Errorf("PromptTokens = %d, want %d", k.PromptTokens, tt.tokens)
			}
			if tt.chunks >= 0 && len(k.Chunks) != tt.chunks {
				t.Errorf("len(Chunks) = %d, want %d", len(k.Chunks), tt.chunks)
			}
			if want := ChunkCount(k.PromptTokens*BytesPerToken, b.ChunkTokens*BytesPerToken); len(k.Chunks) != want {
				t.Errorf("len(Chunks) = %d, want ChunkCount = %d", len(k.Chunks), want)
			}
		})
	}
}

func disjoint(a, b []uint64) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func chat(extra, msgs string) string {
	if extra != "" {
		extra += ","
	}
	return `{` + extra + `"messages":[` + msgs + `]}`
}

const pad = `{"role":"user","content":"padding so that every difference above lies in a full chunk"}`

// TestSameKey lists bodies that must render alike (same chunks and tokens).
func TestSameKey(t *testing.T) {
	img := func(url, extra string) string {
		return `{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"` + url + `"` + extra + `}}]}`
	}
	tests := []struct {
		name, path, a, b string
	}{
		{"top-level key order", pathChat,
			`{"model":"m","cache_salt":"s","messages":[` + pad + `],"tools":[{"type":"function"}]}`,
			`{"tools":[{"type":"function"}],"messages":[` + pad + `],"cache_salt":"s","model":"m"}`},
		{"message key order", pathChat,
			chat(`"model":"m"`, `{"role":"user","name":"bob","content":"hello"},`+pad),
			chat(`"model":"m"`, `{"content":"hello","name":"bob","role":"user"},`+pad)},
		{"whitespace", pathChat,
			chat(`"tools":[{"a":1,"b":[true,null]}]`, pad),
			"{ \"tools\" : [ { \"a\" : 1 ,\n \"b\" : [ true , null ] } ] ,\n\t\"messages\" : [ " + pad + " ] }"},
		{"unicode escapes", pathChat,
			chat("", `{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"q\" a\/b"},`+pad),
			chat("", `{"role":"user","content":"café 😀 \"q\" a/b"},`+pad)},
		{"string content = one text part", pathChat,
			chat("", `{"role":"user","content":"hello"},`+pad),
			chat("", `{"role":"user","content":[{"type":"text","text":"hello"}]},`+pad)},
		{"same image url", pathChat,
			chat("", img("https://example.com/cat.png", "")+","+pad),
			chat("", img("https://example.com/cat.png", `,"detail":"high"`)+","+pad)},
		{"image_url as string", pathChat,
			chat("", img("data:image/png;base64,AAAA", "")+","+pad),
			chat("", `{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":"data:image/png;base64,AAAA"}]},`+pad)},
		{"stream and sampling fields ignored", pathChat,
			chat(`"model":"m","stream":true,"temperature":0.2,"max_tokens":9`, pad),
			chat(`"model":"m"`, pad)},
		{"duplicate key: last wins", pathChat,
			`{"model":"a","model":"m","messages":[` + pad + `]}`,
			`{"model":"m","messages":[` + pad + `]}`},
		{"empty salt = no salt", pathChat,
			chat(`"model":"m","cache_salt":""`, pad),
			chat(`"model":"m"`, pad)},
		{"null tools = no tools", pathChat,
			chat(`"tools":null`, pad),
			chat("", pad)},
		{"list of strings keys the first", pathCompl,
			`{"prompt":["` + long + `","other"]}`,
			`{"prompt":"` + long + `"}`},
		{"list of id lists keys the first", pathCompl,
			`{"prompt":[[1,2,3,4,5,6,7,8],[9]]}`,
			`{"prompt":[1,2,3,4,5,6,7,8]}`},
		{"responses string input = user message item", pathResp,
			`{"instructions":"sys","input":"` + long + `"}`,
			`{"instructions":"sys","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"` + long + `"}]}]}`},
		{"responses easy message = typed message", pathResp,
			`{"input":[{"role":"user","content":"` + long + `"}]}`,
			`{"input":[{"type":"message","role":"user","content":"` + long + `"}]}`},
	}
	b := NewBuilder(1) // 4-byte chunks: almost every byte difference shows
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ka, kb := build(b, tt.path, tt.a), build(b, tt.path, tt.b)
			if !ka.OK || !kb.OK {
				t.Fatalf("OK = %v, %v; want true, true", ka.OK, kb.OK)
			}
			if ka.PromptTokens != kb.PromptTokens {
				t.Errorf("PromptTokens = %d vs %d, want equal", ka.PromptTokens, kb.PromptTokens)
			}
			if len(ka.Chunks) == 0 || !slices.Equal(ka.Chunks, kb.Chunks) {
				t.Errorf("chunks differ or empty:\n a=%x\n b=%x", ka.Chunks, kb.Chunks)
			}
		})
	}
}

// TestResponsesMatchesChat: the Responses API renders instructions + input like the equivalent
// chat conversation (vLLM renders both through the same chat template).
func TestResponsesMatchesChat(t *testing.T) {
	b := NewBuilder(4)
	r := build(b, pathResp, `{"model":"m","instructions":"You are terse.","input":"`+long+`"}`)
	c := build(b, pathChat, `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"`+long+`"}]}`)
	if !r.OK || !c.OK || len(r.Chunks) == 0 || !slices.Equal(r.Chunks, c.Chunks) {
		t.Errorf("responses key %x (ok %v), want chat key %x (ok %v)", r.Chunks, r.OK, c.Chunks, c.OK)
	}
}

// TestDifferentKey lists bodies that must render differently. When disjoint is set the two
// must share no chunk hash at all (seed differences).
func TestDifferentKey(t *testing.T) {
	img := func(url string) string {
		return `{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + url + `"}}]}`
	}
	tests := []struct {
		name, pathA, a, pathB, b string
		disjoint                 bool
	}{
		{"model", pathChat, chat(`"model":"llama"`, pad), pathChat, chat(`"model":"llama-lora1"`, pad), true},
		{"missing model vs model", pathChat, chat("", pad), pathChat, chat(`"model":"m"`, pad), true},
		{"cache_salt", pathChat, chat(`"model":"m","cache_salt":"tenant-a"`, pad), pathChat, chat(`"model":"m","cache_salt":"tenant-b"`, pad), true},
		{"salt vs no salt", pathChat, chat(`"model":"m","cache_salt":"x"`, pad), pathChat, chat(`"model":"m"`, pad), true},
		{"model/salt boundary", pathChat, chat(`"model":"ab","cache_salt":"c"`, pad), pathChat, chat(`"model":"a","cache_salt":"bc"`, pad), true},
		{"chat vs completions", pathChat, chat("", `{"role":"user","content":"`+long+`"}`), pathCompl, `{"prompt":"` + long + `"}`, true},
		{"text vs ids", pathCompl, `{"prompt":"\u0001\u0000\u0000\u0000\u0002\u0000\u0000\u0000"}`, pathCompl, `{"prompt":[1,2]}`, true},
		{"different image url", pathChat, chat("", img("https://x/a.png")+","+pad), pathChat, chat("", img("https://x/b.png")+","+pad), false},
		{"image vs audio same data", pathChat,
			chat("", `{"role":"user","content":[{"type":"image_url","image_url":{"url":"AAAA"}}]},`+pad), pathChat,
			chat("", `{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]},`+pad), false},
		{"field boundary ab+c vs a+bc", pathChat,
			chat("", `{"role":"user","content":"ab"},{"role":"user","content":"c"},`+pad), pathChat,
			chat("", `{"role":"user","content":"a"},{"role":"user","content":"bc"},`+pad), false},
		{"role vs content boundary", pathChat,
			chat("", `{"role":"user","content":"x"},`+pad), pathChat,
			chat("", `{"role":"userx","content":""},`+pad), false},
		{"two text parts vs one", pathChat,
			chat("", `{"role":"user","content":[{"type":"text","text":"ab"},{"type":"text","text":"c"}]},`+pad), pathChat,
			chat("", `{"role":"user","content":"abc"},`+pad), false},
		{"role", pathChat, chat("", `{"role":"user","content":"hello"},`+pad), pathChat, chat("", `{"role":"system","content":"hello"},`+pad), false},
		{"name", pathChat, chat("", `{"role":"user","name":"a","content":"hello"},`+pad), pathChat, chat("", `{"role":"user","content":"hello"},`+pad), false},
		{"tools", pathChat, chat(`"tools":[{"type":"function","function":{"name":"a"}}]`, pad), pathChat, chat(`"tools":[{"type":"function","function":{"name":"b"}}]`, pad), false},
		{"tools vs functions", pathChat, chat(`"tools":[{"name":"a"}]`, pad), pathChat, chat(`"functions":[{"name":"a"}]`, pad), false},
		{"response_format", pathChat, chat(`"response_format":{"type":"json_object"}`, pad), pathChat, chat(`"response_format":{"type":"text"}`, pad), false},
		{"tool object key order kept", pathChat, chat(`"tools":[{"a":1,"b":2}]`, pad), pathChat, chat(`"tools":[{"b":2,"a":1}]`, pad), false},
		{"tool call arguments", pathChat,
			chat("", `{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},`+pad), pathChat,
			chat("", `{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"x\":2}"}}]},`+pad), false},
		{"tool call name", pathChat,
			chat("", `{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]},`+pad), pathChat,
			chat("", `{"role":"assistant","tool_calls":[{"function":{"name":"g","arguments":"{}"}}]},`+pad), false},
		{"tool_call_id", pathChat,
			chat("", `{"role":"tool","tool_call_id":"call_1","content":"42"},`+pad), pathChat,
			chat("", `{"role":"tool","tool_call_id":"call_2","content":"42"},`+pad), false},
		{"number text kept", pathChat, chat(`"tools":[1]`, pad), pathChat, chat(`"tools":[1.0]`, pad), false},
		{"ids", pathCompl, `{"prompt":[1,2,3,4]}`, pathCompl, `{"prompt":[1,2,3,5]}`, false},
	}
	b := NewBuilder(1)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ka, kb := build(b, tt.pathA, tt.a), build(b, tt.pathB, tt.b)
			if !ka.OK || !kb.OK {
				t.Fatalf("OK = %v, %v; want true, true", ka.OK, kb.OK)
			}
			if len(ka.Chunks) == 0 || len(kb.Chunks) == 0 {
				t.Fatalf("no chunks: %d, %d", len(ka.Chunks), len(kb.Chunks))
			}
			if slices.Equal(ka.Chunks, kb.Chunks) {
				t.Errorf("chunks equal, want different: %x", ka.Chunks)
			}
			if tt.disjoint && !disjoint(ka.Chunks, kb.Chunks) {
				t.Errorf("chunks share a hash, want disjoint:\n a=%x\n b=%x", ka.Chunks, kb.Chunks)
			}
		})
	}
}

// TestChainFormula recomputes the chunk hashes of a text prompt and a token-id prompt from the
// documented formula: Chunks[i] = xxhash64(seed ‖ Chunks[i-1] ‖ xxhash64(chunk_i)),
// Chunks[-1] = 0, the HeadChunks first a sixteenth and three sixteenths of the others.
func TestChainFormula(t *testing.T) {
	// Past FineChunks of 64 bytes (8,080 bytes) chunks are 512 bytes: both prompts have some.
	text := []byte(strings.Repeat("0123456789abcdef", 640)) // 10,240 bytes
	idList := make([]string, 2600)
	var idStream []byte
	for i := range idList {
		idList[i] = fmt.Sprint(i * 70001)
		idStream = binary.LittleEndian.AppendUint32(idStream, uint32(i*70001))
	}
	// The seeds are pinned: xxhash64 of the key-format domain, the prompt kind ('p' text,
	// 'i' token ids), 'm' uvarint(len) model, 's' uvarint(len) cache_salt. A new key format
	// must change them on purpose.
	tests := []struct {
		name   string
		body   string
		kind   byte
		seed   uint64
		stream []byte
		tokens int
	}{
		{"text", `{"model":"m","cache_salt":"s","prompt":"` + string(text) + `"}`, 'p', 0xab89bdf7ede7d22d, text, 2560},
		{"ids", `{"model":"m","cache_salt":"s","prompt":[` + strings.Join(idList, ",") + `]}`, 'i', 0xc4cdae553b31ae3a, idStream, 2600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := xxhash.Sum64String("prefixlb/key/v5" + string(tt.kind) + "m\x01m" + "s\x01s"); got != tt.seed {
				t.Fatalf("seed formula gives %#x, pinned %#x", got, tt.seed)
			}
			b := NewBuilder(16)
			k := build(b, pathCompl, tt.body)
			want := refChain(tt.seed, tt.stream, 64)
			if len(want) <= FineChunks {
				t.Fatalf("the stream has %d chunks: none coarse", len(want))
			}
			if !slices.Equal(k.Chunks, want) {
				t.Errorf("Chunks = %x\nwant %x", k.Chunks, want)
			}
			if k.PromptTokens != tt.tokens {
				t.Errorf("PromptTokens = %d, want %d", k.PromptTokens, tt.tokens)
			}
		})
	}
}

// TestModelCopied: k.Model must not alias parser memory that the next request reuses.
func TestModelCopied(t *testing.T) {
	b := NewBuilder(64)
	k1, k2 := new(Key), new(Key)
	b.Build([]byte(pathChat), []byte(`{"model":"first-model","messages":[]}`), k1)
	b.Build([]byte(pathChat), []byte(`{"model":"XXXXXXXXXXX","messages":[]}`), k2)
	if got := string(k1.Model); got != "first-model" {
		t.Errorf("k1.Model = %q after another Build, want %q", got, "first-model")
	}
}

// TestKeyReuse: Build resets a reused key, including on fallback.
func TestKeyReuse(t *testing.T) {
	b := NewBuilder(1)
	k := new(Key)
	b.Build([]byte(pathChat), []byte(chat(`"model":"m","stream":true`, pad)), k)
	if !k.OK || len(k.Chunks) == 0 {
		t.Fatalf("first build: OK=%v chunks=%d, want OK and chunks", k.OK, len(k.Chunks))
	}
	b.Build([]byte(pathChat), []byte(`{"messages":5}`), k)
	if k.OK || k.Stream || len(k.Model) != 0 || len(k.Chunks) != 0 || k.PromptTokens != 0 {
		t.Errorf("after fallback build: %+v, want all zero but Routed", *k)
	}
	k.Recycle()
	if k.Routed || k.OK || len(k.Chunks) != 0 || len(k.Model) != 0 {
		t.Errorf("Recycle left a dirty key: %+v", *k)
	}
	k.Chunks = make([]uint64, 0, maxPooledChunks+1)
	k.Recycle()
	if k.Chunks != nil {
		t.Error("Recycle kept an oversized chunk buffer")
	}
}

// TestLargeBody: a body over the pooling limit still works and keys like a small one would.
func TestLargeBody(t *testing.T) {
	b := NewBuilder(64)
	big := strings.Repeat("a", 3<<20)
	k := build(b, pathCompl, `{"prompt":"`+big+`"}`)
	// 4 and 12 tokens, 126 of 64, then 512 each: (3 MiB − 32,320 bytes) ÷ 2,048 bytes = 1,520.
	if want := FineChunks + (len(big)-(64+126*256))/2048; !k.OK || k.PromptTokens != len(big)/4 || len(k.Chunks) != want || want != ChunkCount(len(big), 256) {
		t.Errorf("OK=%v tokens=%d chunks=%d, want true %d %d (ChunkCount %d)", k.OK, k.PromptTokens, len(k.Chunks), len(big)/4, want, ChunkCount(len(big), 256))
	}
	small := build(b, pathCompl, `{"prompt":"`+big[:2560]+`"}`)
	if len(small.Chunks) != 11 || !slices.Equal(small.Chunks, k.Chunks[:11]) {
		t.Errorf("prefix of big prompt keys differently from the same small prompt")
	}
}

// TestConcurrent builds the same bodies from many goroutines (run with -race) and checks the
// results match a serial run.
func TestConcurrent(t *testing.T) {
	b := NewBuilder(8)
	bodies := []struct{ path, body string }{
		{pathChat, chat(`"model":"a","tools":[{"x":[1,2,{"y":null}]}]`, `{"role":"user","content":[{"type":"text","text":"`+long+`"},{"type":"image_url","image_url":{"url":"u"}}]}`)},
		{pathCompl, `{"model":"b","prompt":"` + long + `"}`},
		{pathCompl, `{"model":"c","prompt":[` + strings.Repeat("12345,", 200) + `1]}`},
		{pathResp, `{"model":"d","input":[{"role":"user","content":"` + long + `"}]}`},
	}
	want := make([]Key, len(bodies))
	for i, x := range bodies {
		want[i] = build(b, x.path, x.body)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 8 {
		wg.Go(func() {
			k := new(Key)
			for n := range 200 {
				i := (g + n) % len(bodies)
				b.Build([]byte(bodies[i].path), []byte(bodies[i].body), k)
				if !k.OK || !bytes.Equal(k.Model, want[i].Model) || !slices.Equal(k.Chunks, want[i].Chunks) {
					select {
					case errs <- fmt.Sprintf("goroutine %d body %d: got model %q %d chunks, want %q %d", g, i, k.Model, len(k.Chunks), want[i].Model, len(want[i].Chunks)):
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestSteadyStateAllocs: after warm-up, Build allocates nothing for a 128 KiB chat body.
func TestSteadyStateAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocation counts need a non-race, non-short run (sync.Pool drops items at random under -race)")
	}
	b := NewBuilder(64)
	for _, size := range []int{1 << 10, 128 << 10} {
		body := chatBody(size)
		ids := idsBody(4000)
		// The fastjson path (the Responses API) as well as the fast path (text, ids, media parts).
		resp := []byte(`{"model":"m","instructions":"be brief","input":` + string(body[bytes.Index(body, []byte(`[`)):bytes.LastIndex(body, []byte(`]`))+1]) + `}`)
		media := append([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]},`), body[bytes.Index(body, []byte(`[`))+1:]...)
		k := new(Key)
		for _, x := range []struct{ path, body []byte }{{[]byte(pathChat), body}, {[]byte(pathCompl), ids}, {[]byte(pathResp), resp}, {[]byte(pathChat), media},
			{[]byte(pathMsgs), messagesAgentBody(8)}, {[]byte(pathRerank), []byte(`{"model":"r","query":"q","documents":["a"]}`)}} {
			b.Build(x.path, x.body, k)
			if !k.OK && (string(x.path) != pathRerank || string(k.Model) != "r") { // rerank: Model only
				t.Fatalf("%s: body not OK", x.path)
			}
			// sync.Pool may drop its item at a GC; allow a stray allocation in 100 runs.
			if got := testing.AllocsPerRun(100, func() { b.Build(x.path, x.body, k) }); got > 0.05 {
				t.Errorf("%s %d bytes: %.2f allocs per Build, want 0", x.path, len(x.body), got)
			}
		}
	}
}

// A chat message whose text extends another's (a long document, then more text in the same
// message) shares the leading chunks, as the engine shares its KV blocks.
func TestChatTextExtensionSharesChunks(t *testing.T) {
	b := NewBuilder(16)
	doc := strings.Repeat("The quarterly report covers revenue, costs and outlook. ", 40)
	var k1, k2 Key
	b.Build([]byte("/v1/chat/completions"), []byte(`{"model":"m","messages":[{"role":"user","content":"`+doc+`"}]}`), &k1)
	b.Build([]byte("/v1/chat/completions"), []byte(`{"model":"m","messages":[{"role":"user","content":"`+doc+`What changed since last year?"}]}`), &k2)
	if !k1.OK || !k2.OK || len(k1.Chunks) < 5 {
		t.Fatalf("keys: %v %v, %d chunks", k1.OK, k2.OK, len(k1.Chunks))
	}
	shared := 0
	for shared < len(k1.Chunks) && shared < len(k2.Chunks) && k1.Chunks[shared] == k2.Chunks[shared] {
		shared++
	}
	if shared < len(k1.Chunks)-1 {
		t.Errorf("extended message shares %d of %d chunks, want at least %d", shared, len(k1.Chunks), len(k1.Chunks)-1)
	}
}

// TestKeyBody: a routed request's key refers to the body it was built from (parsed or not);
// an unrouted one's does not, and Recycle drops the reference so a pooled key keeps no body
// alive.
func TestKeyBody(t *testing.T) {
	b := NewBuilder(0)
	for _, tc := range []struct {
		name, path, body string
		want             bool
	}{
		{"chat", pathChat, `{"messages":[{"role":"user","content":"hi"}]}`, true},
		{"unparsable", pathChat, `{"messages":`, true},
		{"invalid utf-8", pathChat, "{\"prompt\":\"\xff\"}", true},
		{"unrouted", "/v1/models", `{}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var k Key
			body := []byte(tc.body)
			b.Build([]byte(tc.path), body, &k)
			if got := len(k.Body) > 0 && &k.Body[0] == &body[0]; got != tc.want {
				t.Fatalf("key refers to the body: %v, want %v", got, tc.want)
			}
			k.Recycle()
			if k.Body != nil {
				t.Fatal("Recycle kept the body")
			}
		})
	}
}
