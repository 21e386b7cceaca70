package sim

import (
	"slices"
	"testing"
)

// A paragraph of plain English prose written for this test.
const englishSample = `The committee met on Tuesday afternoon to discuss the proposed changes to the city's ` +
	`transportation plan. Several members raised concerns about the cost of extending the light rail ` +
	`line to the northern suburbs, while others argued that the long-term benefits would outweigh the ` +
	`initial investment. After a lengthy debate, the chair suggested that the staff prepare a more ` +
	`detailed analysis, including estimates of ridership, construction timelines, and the effect on ` +
	`traffic congestion in the downtown area. The public will have an opportunity to comment on the ` +
	`analysis at a hearing scheduled for next month. Residents who cannot attend in person may submit ` +
	`written statements through the city's website or by mail.`

func TestTokenizeEnglishRatio(t *testing.T) {
	ids := Tokenize(nil, englishSample)
	if got := CountTokens(englishSample); got != len(ids) {
		t.Fatalf("CountTokens = %d, len(Tokenize) = %d", got, len(ids))
	}
	ratio := float64(len(englishSample)) / float64(len(ids))
	t.Logf("%d bytes, %d tokens, %.2f bytes/token", len(englishSample), len(ids), ratio)
	if ratio < 3.5 || ratio > 4.5 {
		t.Errorf("bytes per token = %.2f, want about 4", ratio)
	}
	if again := Tokenize(nil, []byte(englishSample)); !slices.Equal(ids, again) {
		t.Error("Tokenize(string) and Tokenize([]byte) differ")
	}
}

func TestTokenizeRules(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"hello world", []string{"hello", " world"}},
		{" tokenization", []string{" token", "izatio", "n"}},
		{"1234567", []string{"123", "456", "7"}},
		{"a, b", []string{"a", ",", " b"}},
		{"f(x) -> y", []string{"f", "(", "x", ")", " ->", " y"}},
		{"x**2", []string{"x", "**", "2"}},
		{"a\n\n\nb", []string{"a", "\n\n", "\n", "b"}},
		{"a    b", []string{"a", "   ", " b"}},
		{"héllo", []string{"h", "é", "llo"}},
		{"\xff\xfe", []string{"\xff", "\xfe"}},
		{"日本", []string{"日", "本"}},
	}
	for _, tt := range tests {
		var want []uint32
		for _, w := range tt.want {
			want = append(want, tokenID(w))
		}
		if got := Tokenize(nil, tt.in); !slices.Equal(got, want) {
			t.Errorf("Tokenize(%q): got %d tokens %v, want %q", tt.in, len(got), got, tt.want)
		}
	}
}

func TestOutputWordsAreSingleTokens(t *testing.T) {
	for i, w := range outputWords {
		for lead, s := range w {
			ids := Tokenize(nil, s)
			if len(ids) != 1 || ids[0] != outputIDs[i][lead] {
				t.Errorf("output word %q tokenizes to %v, want one token %d", s, ids, outputIDs[i][lead])
			}
		}
	}
}

// Turn n+1 of a conversation, with the assistant's generated answer echoed back, must start
// with turn n's prompt and the generated tokens: that is what lets a replica reuse the KV cache
// of the whole previous turn.
func TestChatMultiTurnSharesPrefix(t *testing.T) {
	cfg := DefaultConfig()
	var scratch []byte
	turn1 := `{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Summarise the plan."}],"max_tokens":40}`
	r1, aerr := parseRequest([]byte(turn1), epChat, &cfg, &scratch)
	if aerr != nil {
		t.Fatal(aerr)
	}
	rq := NewRequest(r1.tokens, r1.maxTokens, r1.seed, false, false)
	answer := ""
	want := slices.Clone(r1.tokens)
	for i := range rq.MaxTokens() {
		answer += rq.OutputWord(i)
		want = append(want, rq.outputID(i))
	}
	turn2 := `{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Summarise the plan."},` +
		`{"role":"assistant","content":"` + answer + `"},{"role":"user","content":[{"type":"text","text":"Shorter."}]}]}`
	r2, aerr := parseRequest([]byte(turn2), epChat, &cfg, &scratch)
	if aerr != nil {
		t.Fatal(aerr)
	}
	if len(r2.tokens) <= len(want) || !slices.Equal(r2.tokens[:len(want)], want) {
		t.Fatalf("turn 2 (%d tokens) does not start with turn 1 + answer (%d tokens)", len(r2.tokens), len(want))
	}
	if r1.maxTokens != 40 || r2.maxTokens != cfg.DefaultMaxTokens {
		t.Errorf("max tokens = %d, %d; want 40, %d", r1.maxTokens, r2.maxTokens, cfg.DefaultMaxTokens)
	}
}

func BenchmarkTokenize16KiB(b *testing.B) {
	text := []byte{}
	for len(text) < 16<<10 {
		text = append(text, englishSample...)
	}
	dst := make([]uint32, 0, len(text))
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		dst = Tokenize(dst[:0], text)
	}
}
