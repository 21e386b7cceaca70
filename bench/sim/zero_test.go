package sim

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestWantsStream(t *testing.T) {
	for body, want := range map[string]bool{
		`{"stream":true}`:                              true,
		`{"stream" : true,"x":1}`:                      true,
		"{\"stream\":\n\ttrue}":                        true,
		`{"stream":false}`:                             false,
		`{"model":"m"}`:                                false,
		`{"messages":[{"content":"\"stream\":true"}]}`: false, // escaped inside a string
		`{"streamx":true}`:                             false,
	} {
		if got := wantsStream([]byte(body)); got != want {
			t.Errorf("wantsStream(%s) = %v, want %v", body, got, want)
		}
	}
}

func TestZeroReplicas(t *testing.T) {
	z, err := StartZero(2, "127.0.0.1", 0, ZeroOptions{Chunks: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	if len(z.URLs()) != 2 {
		t.Fatalf("URLs = %v", z.URLs())
	}
	post := func(url, body string) *http.Response {
		t.Helper()
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, u := range z.URLs() {
		// Non-streamed: one chat.completion with usage.
		resp := post(u+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`)
		var out struct {
			Object  string `json:"object"`
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
				TotalTokens  int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || out.Object != "chat.completion" || len(out.Choices) != 1 || out.Usage.PromptTokens <= 0 ||
			out.Usage.TotalTokens != out.Usage.PromptTokens+3 {
			t.Fatalf("non-streamed answer: status %d, %+v", resp.StatusCode, out)
		}

		// Streamed: 3 content events, a usage event, [DONE]; chunked, as an engine sends it.
		resp = post(u+"/v1/completions", `{"model":"m","prompt":"hello","stream":true}`)
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" || len(resp.TransferEncoding) == 0 {
			t.Fatalf("content-type %q, transfer-encoding %v", ct, resp.TransferEncoding)
		}
		var events []string
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: ") {
				events = append(events, strings.TrimSpace(strings.TrimPrefix(line, "data: ")))
			}
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		if len(events) != 5 || events[4] != "[DONE]" || !strings.Contains(events[3], `"prompt_tokens":`) ||
			!strings.Contains(events[0], `"text_completion"`) {
			t.Fatalf("events = %q", events)
		}

		// Models and health as vLLM answers them; anything else 404.
		for path, code := range map[string]int{"/v1/models": 200, "/health": 200, "/nope": 404} {
			r, err := http.Get(u + path)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
			if r.StatusCode != code {
				t.Errorf("GET %s = %d, want %d", path, r.StatusCode, code)
			}
		}
	}
	if z.Served() != 4 {
		t.Errorf("served %d completions, want 4", z.Served())
	}
}
