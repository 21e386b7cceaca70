package key

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// bothPaths builds body on path by the fast path and by the fastjson path, each with fresh
// scratch state. took reports whether the fast path handled the body; fast is meaningful only
// then. Unrouted paths and invalid UTF-8 (which Build rejects before either path) give
// took false and a zero ref.
func bothPaths(b *Builder, path string, body []byte) (fast Key, took bool, ref Key) {
	ep := classify([]byte(path))
	if !ep.Routed() || !utf8.Valid(body) {
		return Key{}, false, Key{}
	}
	fast.Routed, ref.Routed = true, true
	took = new(state).fastBuild(ep, b.chunkTokens(), body, &fast)
	new(state).parseBuild(ep, b.chunkTokens(), body, &ref)
	return fast, took, ref
}

func sameKey(a, b Key) bool {
	return a.Routed == b.Routed && a.OK == b.OK && a.Stream == b.Stream && string(a.Model) == string(b.Model) &&
		a.PromptTokens == b.PromptTokens && slices.Equal(a.Chunks, b.Chunks) && a.ShortFirstTurn == b.ShortFirstTurn
}

// checkFast fails t when the fast path handles body but keys it differently from the fastjson
// path, and returns whether the fast path handled it.
func checkFast(t *testing.T, b *Builder, path string, body []byte) bool {
	t.Helper()
	fast, took, ref := bothPaths(b, path, body)
	if took && !sameKey(fast, ref) {
		t.Fatalf("fast path differs from the fastjson path on %s %q:\nfast %+v\nref  %+v", path, body, fast, ref)
	}
	if took && !fast.OK {
		t.Fatalf("fast path took %q without OK", body)
	}
	return took
}

// fastBodies are bodies the fast path must handle (and key as the fastjson path does).
var fastBodies = []struct{ name, path, body string }{
	{"simple", pathChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
	{"empty messages", pathChat, `{"messages":[]}`},
	{"escapes", pathChat, `{"messages":[{"role":"user","content":"a\"b\\c\/d\be\ff\ng\rh\ti \u00e9\u20AC\ud83d\ude00 \u0000 end\\"}]}`},
	{"escape at start and end", pathChat, `{"messages":[{"role":"user","content":"\n\"x\"\n"}]}`},
	{"escaped role name model salt", pathChat, `{"model":"m\u00e9","cache_salt":"s\"","messages":[{"role":"us\u0065r","name":"b\\ob","content":"x"}]}`},
	{"whitespace everywhere", pathChat, " \r\n\t{ \"model\" : \"m\" ,\n \"messages\" : [ { \"role\" : \"user\" , \"content\" : \"hi\" } ] , \"stream\" : true } \n"},
	{"null fields", pathChat, `{"model":null,"cache_salt":null,"tools":null,"messages":[{"role":null,"name":null,"content":null,"tool_calls":null,"function_call":null,"tool_call_id":null}]}`},
	{"duplicates last wins", pathChat, `{"model":"a","messages":5,"model":"b","messages":[{"role":"x","role":"user","content":1,"content":"hi"}]}`},
	{"messages then chat fields", pathChat, `{"messages":[{"content":"hi","role":"user"}],"model":"m","stream":false,"temperature":0.7,"n":1,"stop":["\n"],"logit_bias":{"1":-1e5}}`},
	{"text parts", pathChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_text","text":"b\n"},{"type":"output_text","text":"c"},{"type":"refusal","refusal":"no","extra":{"x":[1]}}]}]}`},
	{"media parts", pathChat, `{"messages":[{"role":"user","content":[` +
		`{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"high"}},` +
		`{"type":"image_url","image_url":"data:image/png;base64,AAAA"},` +
		`{"type":"image_url","image_url":{"url":""}},` +
		`{"type":"image_url","image_url":{"url":"a","url":"b\/c"}},` +
		`{"type":"image_url","image_url":{"url":1}},` +
		`{"type":"image_url","image_url":{"detail":"low"}},` +
		`{"type":"image_url","image_url":[1]},` +
		`{"type":"image_url"},` +
		`{"type":"video_url","video_url":{"url":"v"}},{"type":"audio_url","audio_url":"au"},` +
		`{"type":"input_audio","input_audio":{"data":"QUJD","format":"wav"}},` +
		`{"type":"file","file":{"file_data":"fd","file_id":"fi"}},{"type":"file","file":{"file_id":"fi"}},{"type":"file","file":{}},` +
		`{"type":"input_image","image_url":"u","file_id":"f"},{"type":"input_image","file_id":"f"},{"type":"input_image","image_url":null,"file_id":"f"},` +
		`{"type":"input_file","file_url":"u","file_id":"f","file_data":"d"},{"type":"input_file","file_url":"u"},{"type":"input_file"},` +
		`{"type":"mystery","x":[1,{"y":"\u00e9"}]},{"text":"no type"},{"type":null,"text":"null type"},` +
		`{"type":"te\u0078t","text":"escaped type"},{"type":"text","text":"after"}]}]}`},
	{"tools", pathChat, `{"tools":[{"type":"function","function":{"name":"f","description":"d\u00e9","parameters":{"type":"object","properties":{"q":{"type":"string","enum":["a","b"]}},"required":["q"],"n":-1.5e+3,"t":true,"f":false,"z":null,"e":{},"a":[]}}}],"functions":[{"name":"g"}],"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi"}]}`},
	{"tool calls", pathChat, `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}},{"id":"c2","function":{"name":"g","arguments":{"y":[1,2]}}},{"id":"c3","function":{"name":"h"}},{"id":"c4","type":"custom","custom":{"input":"x"}},{"function":null}]},{"role":"tool","tool_call_id":"c1","content":"42"},{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`},
	{"numbers as fastjson reads them", pathChat, `{"x":[0,-0,1.5,1e9,1E-9,-2.5e+10,01,1.2.3,e5,+1,--1,.5],"tools":[01,1.2.3,e5,+1,.5],"messages":[]}`},
	{"completions string", pathCompl, `{"model":"m","prompt":"hello \"world\"\n\u00e9","stream":true}`},
	{"completions with messages ignored", pathCompl, `{"prompt":"x","messages":"not an array"}`},
	{"completions empty", pathCompl, `{"prompt":""}`},
	{"completions ids", pathCompl, `{"prompt":[1,2,3,0,4294967295,007,00000000000042]}`},
	{"completions id lists", pathCompl, `{"prompt":[[1,2,3],[],[4]]}`},
	{"completions strings", pathCompl, `{"prompt":["a\n","b"]}`},
	{"completions empty list", pathCompl, `{"prompt":[]}`},
	{"completions duplicate prompt", pathCompl, `{"prompt":[1],"prompt":"x"}`},
	{"idsBody", pathCompl, string(idsBody(1000))},
	{"ids past what the arena holds", pathCompl, `{"prompt":[` + strings.Repeat("7,", 3000) + `4294967295],"model":"m"}`},
	{"id lists past what the arena holds", pathEmbed, `{"input":[[` + strings.Repeat("0,", 200) + `1],[2]]}`},
	{"nesting within fast limit", pathChat, `{"messages":[],"tools":` + strings.Repeat("[", 60) + strings.Repeat("]", 60) + `}`},
	{"raw control bytes in a string", pathChat, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\x01c\"}]}"},
	{"unicode", pathChat, `{"messages":[{"role":"user","content":"日本語のテキスト 😀 ünïcödé"}]}`},
	// Strings unescaped by fastjson's best effort (an unknown escape kept, a lone surrogate
	// kept as its escape, a bad pair one U+FFFD), and escaped object keys.
	{"responses string input", pathResp, `{"input":"hi"}`},
	{"media url bad escape", pathChat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"\q"}]}]}`},
	{"lone high surrogate", pathChat, `{"messages":[{"role":"user","content":"\ud83d x"}]}`},
	{"lone low surrogate", pathChat, `{"messages":[{"role":"user","content":"\ude00\ude00"}]}`},
	{"high then non-low", pathChat, `{"messages":[{"role":"user","content":"\ud83d\u0041"}]}`},
	{"unknown escape", pathChat, `{"messages":[{"role":"user","content":"\x"}]}`},
	{"short \\u", pathChat, `{"messages":[{"role":"user","content":"\u12"}]}`},
	{"bad hex", pathChat, `{"messages":[{"role":"user","content":"\u12g4"}]}`},
	{"bad escape in tools", pathChat, `{"tools":["\q"],"messages":[]}`},
	{"escaped key", pathChat, `{"m\u0065ssages":[{"role":"user","content":"hi"}]}`},
	{"best effort everywhere", pathChat, `{"model":"m\q","cache_salt":"\ud800","tools":[{"\x":"\u12"}],"messages":[{"role":"us\er","name":"\ud83d\ud83d\ude00","tool_call_id":"\udc00\\","content":[{"type":"text","text":"\uD83D\u0041\u00e9\u"}]}]}`},
	{"best effort around escaped quotes", pathChat, `{"messages":[{"role":"user","content":"\"\q\"\\\"\u12\"x\\"}]}`},
	{"escaped keys everywhere", pathChat, `{"\u006dodel":"m","\u0074ools":[{"a\"b":1}],"m\u0065ssages":[{"r\u006fle":"user","c\u006fntent":[{"\u0074ype":"text","\u0074ext":"hi"},{"type":"image_url","image_\u0075rl":{"\u0075rl":"u"}}]},{"role":"assistant","tool_c\u0061lls":[{"f\u0075nction":{"n\u0061me":"f","\u0061rguments":"{}"}}]}]}`},
	{"escaped key best effort", pathChat, `{"mess\qages":5,"\ud800":1,"messages":[{"role":"user","content":"hi","\u12":2}]}`},
	{"escaped key completions", pathCompl, `{"pr\u006fmpt":"hello","model":"m"}`},
	{"responses items", pathResp, `{"model":"m","instructions":"be brief","input":[{"role":"user","content":"hi"},` +
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]},` +
		`{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":1}"},{"type":"function_call_output","call_id":"c1","output":"42"},` +
		`{"type":"function_call_output","call_id":"c2","output":{"a":[1,2.5e3,null]}},{"type":"function_call_output","output":7},` +
		`{"type":"function_call_output","output":[{"type":"input_text","text":"t"},{"type":"input_image","image_url":"u"}]},` +
		`{"type":"function_call_output","call_id":null,"output":null},{"type":"reasoning","summary":[],"id":"r\u00e9"},` +
		`{"type":null,"role":null,"content":"x"},{"role":"user","type":"message","content":null},` +
		`{"type":"function_call","name":"g","arguments":{"y":true}},{"type":"function_call","name":"h"},{}],` +
		`"tools":[{"type":"function","name":"f"}],"response_format":{"type":"json_object"},"stream":true}`},
	{"responses instructions only", pathResp, `{"instructions":"x","input":null}`},
	{"responses empty input", pathResp, `{"input":[]}`},
	{"responses escaped keys", pathResp, `{"\u0069nput":[{"t\u0079pe":"function_call_output","c\u0061ll_id":"c","\u006futput":"o"},{"\u0072ole":"user","content":"hi"}],"instr\u0075ctions":"x"}`},
	{"messages escaped keys", pathMsgs, `{"m\u0065ssages":[{"role":"user","c\u006fntent":[{"t\u0079pe":"text","t\u0065xt":"hi","cache_\u0063ontrol":{}},{"type":"image","s\u006furce":{"d\u0061ta":"AAAA"}}]}],"s\u0079stem":"s","tools":[{"name":"t","cache\u005fcontrol":1}]}`},
	{"messages media sources", pathMsgs, `{"messages":[{"role":"user","content":[{"type":"image","source":{"data":1,"url":"u","data":"d"}},` +
		`{"type":"document","source":{"data":5,"url":null}},{"type":"image","source":{"file_id":"f"}},{"type":"image","source":{}},` +
		`{"type":"tool_use","id":"i","name":"n"},{"type":"tool_use","id":null,"name":null,"input":null},{"type":"tool_result","tool_use_id":"t","is_error":true},` +
		`{"type":"tool_result","tool_use_id":"t","content":"s","is_error":"true"},{"cache_control":{"type":"ephemeral"},"x":[1]},{"type":"redacted_thinking","data":"d\n"}]},` +
		`{"role":null},{"role":"assistant","content":null},{"content":"no role"}],"system":[]}`},
	{"embeddings escaped input", pathEmbed, `{"inp\u0075t":[[1,2],[3]],"model":"e"}`},
	{"embeddings messages and input", pathEmbed, `{"input":"ignored","messages":[{"role":"user","content":"hi"}],"tools":[1]}`},
	{"more messages than the first pass indexes", pathChat, manyMessages(maxIndexedMsgs + 50)},
	{"chatBody", pathChat, string(chatBody(4 << 10))},
	{"overhead workload body", pathChat, string(overheadBody)},
	{"overhead workload body, 128 KiB", pathChat, string(widenSystem(overheadBody, 10))},
}

// manyMessages is a chat body of n messages of every kind the fast path reads (escaped and
// part contents, tool calls, names), past the first pass's index when n > maxIndexedMsgs.
func manyMessages(n int) string {
	kinds := []string{`{"role":"user","content":"q%d\n"}`, `{"role":"assistant","name":"a","content":[{"type":"text","text":"t%d"},{"type":"image_url","image_url":{"url":"u"}}]}`,
		`{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{\"n\":%d}"}}]}`, `{"c\u006fntent":"x%d","role":"tool","tool_call_id":"c"}`, `{}`}
	var sb strings.Builder
	sb.WriteString(`{"model":"m","messages":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		k := kinds[i%len(kinds)]
		if strings.Contains(k, "%d") {
			k = fmt.Sprintf(k, i)
		}
		sb.WriteString(k)
	}
	sb.WriteString(`],"tools":[{"type":"function"}]}`)
	return sb.String()
}

// slowBodies are bodies the fast path must hand back to the fastjson path.
var slowBodies = []struct{ name, path, body string }{
	{"id too big", pathCompl, `{"prompt":[4294967296]}`},
	{"id float", pathCompl, `{"prompt":[1.0]}`},
	{"id negative", pathCompl, `{"prompt":[-1]}`},
	{"id exponent", pathCompl, `{"prompt":[1e3]}`},
	{"ids mixed", pathCompl, `{"prompt":[1,"a"]}`},
	{"strings mixed", pathCompl, `{"prompt":["a",1]}`},
	{"id list with string", pathCompl, `{"prompt":[[1,"a"]]}`},
	{"id lists mixed", pathCompl, `{"prompt":[[1],2]}`},
	{"prompt null", pathCompl, `{"prompt":null}`},
	{"prompt list of null", pathCompl, `{"prompt":[null]}`},
	{"prompt list of objects", pathCompl, `{"prompt":[{}]}`},
	{"prompt number", pathCompl, `{"prompt":1}`},

	{"responses input number", pathResp, `{"input":5}`},
	{"responses item number", pathResp, `{"input":[5]}`},
	{"responses item type number", pathResp, `{"input":[{"type":5}]}`},
	{"responses no input", pathResp, `{"model":"m"}`},
	{"responses call name number", pathResp, `{"input":[{"type":"function_call","name":1}]}`},
	{"embeddings input null", pathEmbed, `{"input":null}`},
	{"embeddings messages null", pathEmbed, `{"messages":null,"input":"x"}`},
	{"embeddings mixed", pathEmbed, `{"input":[1,"a"]}`},
	{"part type number", pathChat, `{"messages":[{"role":"user","content":[{"type":1}]}]}`},
	{"text part text number", pathChat, `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`},
	{"NaN", pathChat, `{"x":NaN,"messages":[]}`},
	{"nan", pathChat, `{"x":nan,"messages":[]}`},
	{"Inf", pathChat, `{"x":-Inf,"messages":[]}`},
	{"deep", pathChat, `{"messages":[],"tools":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`},
	{"model number", pathChat, `{"model":1,"messages":[]}`},
	{"content number", pathChat, `{"messages":[{"role":"user","content":1}]}`},
	{"message not object", pathChat, `{"messages":["x"]}`},
	{"no messages", pathChat, `{"model":"m"}`},
	{"malformed", pathChat, `{"messages":[{"role":"user","content":"hi"}`},
	{"trailing garbage", pathChat, `{"messages":[]} x`},
	{"trailing comma", pathChat, `{"messages":[],}`},
	{"array trailing comma", pathChat, `{"messages":[{"role":"user","content":"hi"},]}`},
	{"lone minus", pathChat, `{"x":-,"messages":[]}`},
	{"bad literal", pathChat, `{"x":tru,"messages":[]}`},
	{"missing colon", pathChat, `{"messages" []}`},
	{"unterminated string", pathChat, `{"messages":[],"x":"abc}`},
	{"top-level array", pathChat, `[]`},
	{"empty", pathChat, ``},
}

func TestFastPath(t *testing.T) {
	for _, chunk := range []int{1, 4, 64} {
		b := NewBuilder(chunk)
		for _, tt := range fastBodies {
			t.Run(fmt.Sprintf("fast/%s/%d", tt.name, chunk), func(t *testing.T) {
				if !checkFast(t, b, tt.path, []byte(tt.body)) {
					t.Errorf("fast path did not take %q", tt.body)
				}
			})
		}
		for _, tt := range messagesBodies {
			t.Run(fmt.Sprintf("messages/%s/%d", tt.name, chunk), func(t *testing.T) {
				took := checkFast(t, b, tt.path, []byte(tt.body))
				hostile := strings.Contains(tt.name, "hostile") || tt.name == "msgs no messages"
				if Routed([]byte(tt.path)) && took == hostile {
					t.Errorf("fast path took %q: %v, want %v", tt.body, took, !hostile)
				}
			})
		}
		for _, tt := range slowBodies {
			t.Run(fmt.Sprintf("slow/%s/%d", tt.name, chunk), func(t *testing.T) {
				if checkFast(t, b, tt.path, []byte(tt.body)) {
					t.Errorf("fast path took %q, want it left to fastjson", tt.body)
				}
				// Build still keys it, by the fastjson path.
				k := build(b, tt.path, tt.body)
				_, _, ref := bothPaths(b, tt.path, []byte(tt.body))
				if utf8.ValidString(tt.body) && !sameKey(k, ref) {
					t.Errorf("Build = %+v, want the fastjson path's %+v", k, ref)
				}
			})
		}
	}
}

// TestFastPathEscapings: the fast path keys a conversation alike however its strings are
// escaped (every character as \uXXXX, every '/' as \/, ...), and as the fastjson path does.
func TestFastPathEscapings(t *testing.T) {
	b := NewBuilder(1)
	text := "caf\u00e9 \"quoted\" a/b \\ back\nslash\ttab 😀 end"
	escapings := map[string]func(string) string{
		"json": func(s string) string { x, _ := json.Marshal(s); return string(x) },
		"all \\u": func(s string) string {
			var sb strings.Builder
			sb.WriteByte('"')
			for _, r := range s {
				if r > 0xffff {
					r1, r2 := 0xd800+(r-0x10000)>>10, 0xdc00+(r-0x10000)&0x3ff
					fmt.Fprintf(&sb, `\u%04x\u%04X`, r1, r2)
				} else {
					fmt.Fprintf(&sb, `\u%04x`, r)
				}
			}
			sb.WriteByte('"')
			return sb.String()
		},
		"solidus": func(s string) string {
			x, _ := json.Marshal(s)
			return strings.ReplaceAll(string(x), "/", `\/`)
		},
	}
	var want []uint64
	for name, esc := range escapings {
		body := `{"model":` + esc("m/1") + `,"tools":[{"d":` + esc(text) + `}],"messages":[{"role":"user","name":` + esc(text) +
			`,"content":` + esc(text) + `},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":` + esc(text) + `}}]}]}`
		if !checkFast(t, b, pathChat, []byte(body)) {
			t.Fatalf("%s: fast path did not take %s", name, body)
		}
		k := build(b, pathChat, body)
		if want == nil {
			want = k.Chunks
		} else if !slices.Equal(k.Chunks, want) {
			t.Errorf("%s: chunks differ from another escaping", name)
		}
	}
}

// fastPathThreads runs the prefix-test conversations, in every variant, through both paths.
func fastPathThreads(t *testing.T, threads []thread) {
	t.Helper()
	took := 0
	for _, v := range variants {
		b := NewBuilder(v.chunk)
		for _, th := range threads {
			body, err := json.Marshal(v.body(th.Messages))
			if err != nil {
				t.Fatal(err)
			}
			if checkFast(t, b, v.path, body) {
				took++
			}
		}
	}
	if took < 3*len(threads) {
		t.Errorf("fast path took %d bodies, want at least %d (the chat variants)", took, 3*len(threads))
	}
}

// TestFastPathFixture runs the committed conversations through both paths.
func TestFastPathFixture(t *testing.T) {
	fastPathThreads(t, readJSONL[thread](t, fixtureThreads))
}

// TestFastPathDatasets runs the shared OpenAssistant threads through both paths (an optional
// extra).
func TestFastPathDatasets(t *testing.T) {
	fastPathThreads(t, readLines[thread](t, "datasets/oasst_en_100_threads.jsonl"))
}

// TestChain: chain(seed, prev, h) = xxhash64 of the 24 bytes seed ‖ prev ‖ h, little-endian.
func TestChain(t *testing.T) {
	x := uint64(1)
	for range 1000 {
		seed, prev, h := x, x*0x9e3779b97f4a7c15, ^x<<7
		buf := binary.LittleEndian.AppendUint64(nil, seed)
		buf = binary.LittleEndian.AppendUint64(buf, prev)
		buf = binary.LittleEndian.AppendUint64(buf, h)
		if got, want := chain(seed, prev, h), xxhash.Sum64(buf); got != want {
			t.Fatalf("chain(%x, %x, %x) = %x, want %x", seed, prev, h, got, want)
		}
		x = x*6364136223846793005 + 1442695040888963407
	}
}

// TestChunkerPieces: the chunk hashes do not depend on how the stream is cut into writes, for
// chunks that are buffered, hashed in place, or streamed (over maxPartBytes).
func TestChunkerPieces(t *testing.T) {
	stream := make([]byte, 40000)
	for i := range stream {
		stream[i] = byte(i * 7)
	}
	for _, size := range []int{4, 16, 256, maxPartBytes, maxPartBytes + 4, 3 * maxPartBytes} {
		var want Key
		var c chunker
		c.start(size, 42, &want)
		c.write(stream)
		if len(want.Chunks) != ChunkCount(len(stream), size) {
			t.Fatalf("size %d: %d chunks, want %d", size, len(want.Chunks), ChunkCount(len(stream), size))
		}
		for _, piece := range []int{1, 3, 7, 100, 255, 256, 257, 5000} {
			var k Key
			c.start(size, 42, &k)
			for p := stream; len(p) > 0; {
				n := min(piece, len(p))
				c.write(p[:n])
				p = p[n:]
			}
			if !slices.Equal(k.Chunks, want.Chunks) {
				t.Errorf("size %d, pieces of %d: chunks differ from one write", size, piece)
			}
		}
	}
}

// TestFastPathRandom compares the two paths on generated bodies of every routed API mixing
// every escape (valid and not, in strings and in keys), whitespace, duplicate keys, tools, tool
// calls, parts, Messages API blocks and Responses API items.
func TestFastPathRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	ws := func() string { return pick("", "", "", " ", "\n\t", "\r\n ") }
	str := func() string {
		var sb strings.Builder
		sb.WriteByte('"')
		for range rng.IntN(12) {
			sb.WriteString(pick("a", "word ", "é", "😀", `\n`, `\"`, `\\`, `\/`, `\t`, `\b`, `\f`, `\r`,
				`\u00e9`, `\u0000`, `\uD83D\uDE00`, `\ud83d`, `\ude00`, `\ud83d\u0041`, `\x`, `\u12`, `\u12g4`, "\x01"))
		}
		sb.WriteByte('"')
		return sb.String()
	}
	var value func(depth int) string
	value = func(depth int) string {
		switch n := rng.IntN(10); {
		case n < 3 || depth > 3:
			return pick(str(), "1", "-2.5e+3", "0", "true", "false", "null", "01", "1.2.3", "e5")
		case n < 6:
			var parts []string
			for range rng.IntN(3) {
				parts = append(parts, ws()+value(depth+1)+ws())
			}
			return "[" + strings.Join(parts, ",") + "]"
		default:
			var parts []string
			for range rng.IntN(3) {
				parts = append(parts, ws()+pick(`"a"`, `"type"`, `"text"`, `"name"`)+ws()+":"+ws()+value(depth+1))
			}
			return "{" + strings.Join(parts, ",") + "}"
		}
	}
	// A key is sometimes escaped: one byte as \u00XX, or an escape fastjson keeps as it is.
	escKey := func(k string) string {
		if k == "" || rng.IntN(8) != 0 {
			return k
		}
		i := rng.IntN(len(k))
		return k[:i] + pick(fmt.Sprintf(`\u%04x`, k[i]), fmt.Sprintf(`\u%04X`, k[i]), `\q`+k[i:i+1], `\ud800`+k[i:i+1]) + k[i+1:]
	}
	member := func(k, v string) string { return ws() + `"` + escKey(k) + `"` + ws() + ":" + ws() + v + ws() }
	message := func() string {
		var ms []string
		for range 1 + rng.IntN(4) {
			switch rng.IntN(9) {
			case 0:
				ms = append(ms, member("role", pick(`"user"`, `"assistant"`, str(), "null", "1")))
			case 1:
				ms = append(ms, member("name", pick(str(), "null")))
			case 2, 3:
				var parts []string
				for range rng.IntN(4) {
					var fs []string
					for range rng.IntN(4) {
						k := pick("type", "type", "text", "refusal", "image_url", "input_audio", "file", "video_url", "audio_url", "file_id", "file_data", "file_url", "detail")
						v := value(1)
						switch {
						case k == "type":
							v = pick(`"text"`, `"input_text"`, `"output_text"`, `"refusal"`, `"image_url"`, `"video_url"`, `"audio_url"`,
								`"input_audio"`, `"file"`, `"input_image"`, `"input_file"`, `"mystery"`, "null", "1", str())
						case rng.IntN(2) == 0:
							v = str()
						case rng.IntN(2) == 0:
							v = "{" + member(pick("url", "data", "file_data", "file_id"), pick(str(), "1", "null")) + "}"
						}
						fs = append(fs, member(k, v))
					}
					parts = append(parts, "{"+strings.Join(fs, ",")+"}")
				}
				ms = append(ms, member("content", pick(str(), str(), "null", "5", "["+strings.Join(parts, ",")+"]")))
			case 4:
				ms = append(ms, member("tool_calls", pick("null", "[]",
					`[{"id":"1","function":{"name":`+str()+`,"arguments":`+pick(str(), value(0))+`}}]`,
					`[{"id":"2","custom":`+value(0)+`}]`, `{}`)))
			case 5:
				ms = append(ms, member("tool_call_id", pick(str(), "null")))
			case 6:
				ms = append(ms, member("function_call", pick("null", `{"name":"f","arguments":`+str()+`}`)))
			default:
				ms = append(ms, member(pick("x", "weight"), value(0)))
			}
		}
		return "{" + strings.Join(ms, ",") + "}"
	}
	// Messages API content blocks, and Responses API input items.
	var block func(depth int) string
	block = func(depth int) string {
		var fs []string
		for range rng.IntN(5) {
			k := pick("type", "type", "text", "source", "id", "name", "input", "tool_use_id", "content", "is_error", "cache_control")
			v := value(1)
			switch {
			case k == "type":
				v = pick(`"text"`, `"image"`, `"document"`, `"tool_use"`, `"tool_result"`, `"thinking"`, "null", "1", str())
			case k == "source":
				v = "{" + member(pick("data", "url", "file_id", "type"), pick(str(), "1", "null")) + "," + member(pick("data", "url"), pick(str(), "null")) + "}"
			case k == "content" && depth < 2:
				v = pick(str(), "null", "5", "["+block(depth+1)+","+block(depth+1)+"]")
			case k == "is_error":
				v = pick("true", "false", "null", `"true"`)
			case rng.IntN(2) == 0:
				v = str()
			}
			fs = append(fs, member(k, v))
		}
		return "{" + strings.Join(fs, ",") + "}"
	}
	item := func() string {
		if rng.IntN(3) == 0 {
			return message()
		}
		var fs []string
		for range rng.IntN(5) {
			k := pick("type", "type", "role", "name", "arguments", "call_id", "output", "content", "id")
			v := value(1)
			switch {
			case k == "type":
				v = pick(`"message"`, `"function_call"`, `"function_call_output"`, `"reasoning"`, "null", "1", str())
			case k == "output":
				v = pick(str(), "null", value(0), `[{"type":"input_text","text":`+str()+`}]`)
			case k == "content":
				v = pick(str(), "null", `[{"type":"output_text","text":`+str()+`}]`)
			case rng.IntN(2) == 0:
				v = str()
			}
			fs = append(fs, member(k, v))
		}
		return "{" + strings.Join(fs, ",") + "}"
	}
	list := func(elem func() string) string {
		var es []string
		for range rng.IntN(4) {
			es = append(es, ws()+elem()+ws())
		}
		return "[" + strings.Join(es, ",") + "]"
	}
	paths := []string{pathChat, pathChat, pathCompl, pathResp, pathMsgs, pathEmbed}
	took := map[string]int{}
	const n = 6000
	for i := range n {
		path := paths[i%len(paths)]
		var members []string
		for range 1 + rng.IntN(6) {
			switch rng.IntN(8) {
			case 0:
				members = append(members, member("model", pick(str(), `"m"`, "null", "1")))
			case 1:
				members = append(members, member("cache_salt", pick(str(), "null")))
			case 2:
				members = append(members, member("stream", pick("true", "false", `"true"`)))
			case 3:
				members = append(members, member(pick("tools", "functions", "response_format"), value(0)))
			case 4:
				members = append(members, member(pick("prompt", "input"), pick(str(), "[1,2,3]", "[[1],[2]]", `[`+str()+`,"b"]`, "[]", "[1.5]", value(0))))
			case 5:
				switch path {
				case pathResp:
					members = append(members, member(pick("input", "input", "instructions"), pick(str(), "null", list(item))))
				case pathMsgs:
					members = append(members, member(pick("system", "tools"), pick(str(), "null", list(func() string { return block(0) }), value(0))))
				default:
					members = append(members, member("messages", list(message)))
				}
			default:
				if path == pathMsgs {
					members = append(members, member("messages", list(func() string {
						return "{" + member("role", pick(`"user"`, `"assistant"`, "null", "1")) + "," + member("content", pick(str(), "null", list(func() string { return block(0) }))) + "}"
					})))
					break
				}
				var msgs []string
				for range rng.IntN(4) {
					msgs = append(msgs, ws()+message()+ws())
				}
				members = append(members, member("messages", "["+strings.Join(msgs, ",")+"]"))
			}
		}
		body := ws() + "{" + strings.Join(members, ",") + "}" + ws()
		if checkFast(t, NewBuilder(1+i%5), path, []byte(body)) {
			took[path]++
		}
	}
	for _, path := range paths {
		if took[path] < n/len(paths)/20 {
			t.Errorf("%s: fast path took %d bodies; the test compares too few", path, took[path])
		}
	}
	t.Logf("fast path took %v of %d bodies", took, n)
}
