package key

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
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

// plainWords is the vocabulary of plainChatBody: JSON-safe words, as in bench/overhead.
var plainWords = strings.Fields(`the model cache prefix token request replica latency throughput
summarize document section policy answer question context window attention kernel batch schedule
memory block evict route balance stream server client vector matrix report table figure result
analysis compare measure quickly carefully because however therefore and of to in is for on with
as by at from that this`)

// plainChatBody returns a chat body of about size bytes shaped like bench/overhead's workload
// (workload.go): a system prompt of 3/4 of the content and one user turn, both plain words with
// no character that JSON escapes, fields in the order model, max_tokens, messages, stream.
func plainChatBody(size int) []byte {
	words := func(n, seed int) string {
		var sb strings.Builder
		for i := seed; sb.Len() < n; i++ {
			sb.WriteString(plainWords[(i*7+seed)%len(plainWords)])
			sb.WriteByte(' ')
		}
		return sb.String()[:n]
	}
	content := max(size-160-32, 64)
	sys := content * 3 / 4
	return []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","max_tokens":16,"messages":[` +
		`{"role":"system","content":"You are assistant #1. ` + words(sys, 1) + `"},` +
		`{"role":"user","content":"Request 42: ` + words(content-sys, 5) + `"}],"stream":true}`)
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

func BenchmarkBuild(b *testing.B) {
	bld := NewBuilder(64)
	cases := []struct {
		name string
		path []byte
		body []byte
	}{
		{"chat_1KB", []byte(pathChat), chatBody(1 << 10)},
		{"chat_16KB", []byte(pathChat), chatBody(16 << 10)},
		{"chat_128KB", []byte(pathChat), chatBody(128 << 10)},
		{"plain_16KB", []byte(pathChat), plainChatBody(16 << 10)},
		{"plain_128KB", []byte(pathChat), plainChatBody(128 << 10)},
		{"ids_8k_tokens", []byte(pathCompl), idsBody(8192)},
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

func BenchmarkRouted(b *testing.B) {
	p := []byte("/v1/chat/completions")
	b.ReportAllocs()
	for b.Loop() {
		if !Routed(p) {
			b.Fatal("not routed")
		}
	}
}
