package key

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/prefixlb/prefixlb/bench/overhead/agentbody"
)

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

var words = strings.Fields(`the model server keeps a cache of attention keys and values for
every prompt prefix it has seen, so a request whose prefix is already cached skips most of its
prefill; "quoted" text, code like func main() { fmt.Println("hi") } and numbers 3.14 42
appear too, as do tabs	and newlines`)

// text returns about n bytes of English-like text with the odd newline (escaped in JSON).
func text(n, seed int) string {
	var sb strings.Builder
	for i := seed; sb.Len() < n; i++ {
		sb.WriteString(words[(i*7+seed)%len(words)])
		if i%23 == 0 {
			sb.WriteString(".\n")
		} else {
			sb.WriteByte(' ')
		}
	}
	return sb.String()
}

// chatBody returns a realistic chat body of at least size bytes (at most ~1/8 more): model,
// stream flag, a system prompt of a quarter of the size, then alternating user/assistant turns
// of size/16 bytes, ending with a user turn.
func chatBody(size int) []byte {
	msgs := []msg{{"system", text(size/4, 1)}}
	turn := max(size/16, 32)
	for i := 0; ; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, text(turn, i+2)})
		body, _ := json.Marshal(map[string]any{"model": "meta-llama/Llama-3.1-8B-Instruct", "stream": true, "messages": msgs})
		if len(body) >= size && role == "user" {
			return body
		}
	}
}

// overheadBody is a 16 KiB chat body exactly as bench/overhead's Workload makes it (plain
// words that JSON does not escape; fields model, max_tokens, messages, stream), committed
// there by TestKeyFixtureIsWorkloadBody, which fails when the two drift apart.
var overheadBody = mustRead("testdata/overhead_chat_16k.json")

func mustRead(name string) []byte {
	b, err := os.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return b
}

// widenSystem returns body with its system prompt repeated n times: the overhead workload's
// shape at about n times the size.
func widenSystem(body []byte, n int) []byte {
	const open, end = `"role":"system","content":"`, `"},{"role":"user"`
	i := bytes.Index(body, []byte(open)) + len(open)
	j := bytes.Index(body, []byte(end))
	if i < len(open) || j < i {
		panic("widenSystem: no system prompt in body")
	}
	out := append([]byte(nil), body[:i]...)
	for range n {
		out = append(out, body[i:j]...)
	}
	return append(out, body[j:]...)
}

func idsBody(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","prompt":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, (i*7919)%128000)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// BenchmarkBuild keys the same body again and again. A NewBuilder would resume each build
// of a body over memoMinBody from its own previous one (memo.go), so this one has no memo:
// these are full builds (BenchmarkRoutingDecision in proxy/ has the memo at work on a coding
// agent's bodies).
func BenchmarkBuild(b *testing.B) {
	bld := &Builder{ChunkTokens: 64}
	cases := []struct {
		name string
		path []byte
		body []byte
	}{
		{"chat_1KB", []byte(pathChat), chatBody(1 << 10)},
		{"chat_16KB", []byte(pathChat), chatBody(16 << 10)},
		{"chat_128KB", []byte(pathChat), chatBody(128 << 10)},
		{"plain_16KB", []byte(pathChat), overheadBody},
		{"plain_128KB", []byte(pathChat), widenSystem(overheadBody, 10)},
		{"ids_8k_tokens", []byte(pathCompl), idsBody(8192)},
		{"messages_agent_16KB", []byte(pathMsgs), messagesAgentBody(24)},
		{"agent_1MB", []byte(pathChat), agentBody(b, 1<<20)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			k := new(Key)
			bld.Build(c.path, c.body, k)
			if !k.OK {
				b.Fatal("body not OK")
			}
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				bld.Build(c.path, c.body, k)
			}
			b.ReportMetric(float64(k.PromptTokens), "tokens")
			b.ReportMetric(float64(len(k.Chunks)), "chunks")
		})
	}
}

// agentBody is the largest body of a coding agent's session as bench overhead sends it
// (tools, a system prompt, then tool calls and tool results with code and paths), about size
// bytes.
func agentBody(tb testing.TB, size int) []byte {
	w, err := agentbody.New(agentbody.Options{Size: size})
	if err != nil {
		tb.Fatal(err)
	}
	body, _ := w.Body(nil, uint64(agentbody.DefaultSessions*(w.Steps()-1)))
	return body
}

func BenchmarkRouted(b *testing.B) {
	p := []byte("/v1/chat/completions")
	b.ReportAllocs()
	for b.Loop() {
		if !Routed(p) {
			b.Fatal("not routed")
		}
	}
}
