package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

func startTestCluster(t *testing.T, n int, speedup float64) *Cluster {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Speedup = speedup
	cfg.NumGPUBlocks = 4096
	c, err := StartCluster(cfg, n, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// readSSE reads a whole event stream, checking its framing; it returns the decoded chunks.
func readSSE(t *testing.T, body io.Reader) []chunk {
	t.Helper()
	br := bufio.NewReader(body)
	var out []chunk
	done := false
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			break
		}
		if err != nil {
			t.Fatalf("reading stream: %v", err)
		}
		if line == "\n" {
			continue
		}
		if done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if blank, _ := br.ReadString('\n'); blank != "\n" {
			t.Fatalf("event not terminated by a blank line: %q", blank)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("invalid JSON in %q: %v", data, err)
		}
		out = append(out, c)
	}
	if !done {
		t.Fatal("stream did not end with data: [DONE]")
	}
	return out
}

func TestHTTPStreamingChat(t *testing.T) {
	c := startTestCluster(t, 1, 1000)
	url := c.URLs()[0] + "/v1/chat/completions"
	doc := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 60)
	body := `{"model":"` + DefaultModel + `","stream":true,"stream_options":{"include_usage":true},"max_tokens":12,` +
		`"messages":[{"role":"system","content":"` + doc + `"},{"role":"user","content":"Summarise."}]}`

	var usages []usage
	for range 2 {
		resp := post(t, context.Background(), url, body)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		chunks := readSSE(t, resp.Body)
		resp.Body.Close()

		if chunks[0].Choices[0].Delta.Role != "assistant" {
			t.Errorf("first chunk has no assistant role: %+v", chunks[0])
		}
		last := chunks[len(chunks)-1]
		if last.Usage == nil || len(last.Choices) != 0 {
			t.Fatalf("last chunk is not a usage chunk with empty choices: %+v", last)
		}
		var text strings.Builder
		tokens := 0
		for _, ch := range chunks[:len(chunks)-1] {
			if ch.Object != "chat.completion.chunk" || ch.Model != DefaultModel || ch.ID != chunks[0].ID || ch.Usage != nil {
				t.Errorf("bad chunk header: %+v", ch)
			}
			if ch.Choices[0].Delta.Content != "" {
				tokens++
				text.WriteString(ch.Choices[0].Delta.Content)
			}
		}
		if fr := chunks[len(chunks)-2].Choices[0].FinishReason; fr == nil || *fr != "length" {
			t.Errorf("last token chunk finish_reason = %v, want length", fr)
		}
		if tokens != 12 || last.Usage.CompletionTokens != 12 || CountTokens(text.String()) != 12 {
			t.Errorf("%d token chunks, completion_tokens %d, text %q: want 12", tokens, last.Usage.CompletionTokens, text.String())
		}
		u := *last.Usage
		if u.PromptTokens < 500 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("usage %+v", u)
		}
		usages = append(usages, u)
	}
	if usages[0].PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first request cached_tokens %d, want 0", usages[0].PromptTokensDetails.CachedTokens)
	}
	if got, p := usages[1].PromptTokensDetails.CachedTokens, usages[1].PromptTokens; got <= 0 || got >= p || p-got > 16 {
		t.Errorf("second identical request cached_tokens %d of %d, want all full blocks but the last token's", got, p)
	}
}

func TestHTTPStreamingCompletionsWithoutUsage(t *testing.T) {
	c := startTestCluster(t, 1, 1000)
	resp := post(t, context.Background(), c.URLs()[0]+"/v1/completions",
		`{"prompt":"Once upon a time","stream":true,"max_tokens":5}`)
	defer resp.Body.Close()
	chunks := readSSE(t, resp.Body)
	if len(chunks) != 5 {
		t.Fatalf("%d chunks, want 5 token chunks and no usage", len(chunks))
	}
	for _, ch := range chunks {
		if ch.Object != "text_completion" || ch.Usage != nil || !strings.HasPrefix(ch.Choices[0].Text, " ") {
			t.Errorf("bad completions chunk %+v", ch)
		}
	}
}

func TestHTTPNonStreaming(t *testing.T) {
	c := startTestCluster(t, 1, 1000)
	base := c.URLs()[0]

	resp := post(t, context.Background(), base+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":[{"type":"text","text":"Hi there"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}],"max_completion_tokens":7,"max_tokens":3}`)
	var chat struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role, Content string
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&chat); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if chat.Object != "chat.completion" || chat.Choices[0].Message.Role != "assistant" || chat.Choices[0].FinishReason != "length" ||
		chat.Usage.CompletionTokens != 7 || CountTokens(chat.Choices[0].Message.Content) != 7 {
		t.Errorf("chat response %+v", chat)
	}

	resp = post(t, context.Background(), base+"/v1/completions", `{"model":"`+DefaultModel+`","prompt":[1,2,3,4,5,6,7,8,9,10]}`)
	var cmpl struct {
		Object  string `json:"object"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cmpl); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if cmpl.Object != "text_completion" || cmpl.Usage.PromptTokens != 10 || cmpl.Usage.CompletionTokens != 16 {
		t.Errorf("completions response %+v (default max_tokens is 16)", cmpl)
	}
}

func TestHTTPErrors(t *testing.T) {
	c := startTestCluster(t, 1, 1000)
	base := c.URLs()[0]
	tests := []struct {
		path, body string
		status     int
	}{
		{"/v1/chat/completions", `{"messages":`, 400},
		{"/v1/chat/completions", `[]`, 400},
		{"/v1/chat/completions", `{"messages":[]}`, 400},
		{"/v1/chat/completions", `{"messages":[{"content":"x"}]}`, 400},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":2}`, 400},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":200000}`, 400},
		{"/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, 404},
		{"/v1/completions", `{"max_tokens":3}`, 400},
		{"/v1/completions", `{"prompt":["a","b"]}`, 400},
		{"/v1/completions", `{"prompt":[1,-2]}`, 400},
		{"/v1/nothing", `{}`, 404},
	}
	for _, tt := range tests {
		resp := post(t, context.Background(), base+tt.path, tt.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		err := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tt.status || err != nil || e.Error.Message == "" || e.Error.Type != "invalid_request_error" {
			t.Errorf("%s %s: status %d (want %d), error %+v, decode %v", tt.path, tt.body, resp.StatusCode, tt.status, e, err)
		}
	}
	resp, err := http.Get(base + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET /v1/chat/completions: %d, want 405", resp.StatusCode)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestHTTPModelsHealthMetrics(t *testing.T) {
	c := startTestCluster(t, 2, 1000)
	for _, base := range c.URLs() {
		if code, _ := get(t, base+"/health"); code != 200 {
			t.Errorf("/health: %d", code)
		}
		code, body := get(t, base+"/v1/models")
		var models struct {
			Data []struct {
				ID          string `json:"id"`
				MaxModelLen int    `json:"max_model_len"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &models); err != nil || code != 200 || models.Data[0].ID != DefaultModel {
			t.Errorf("/v1/models: %d %s", code, body)
		}
	}
	resp := post(t, context.Background(), c.URLs()[1]+"/v1/completions", `{"prompt":"hello metrics","max_tokens":3}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	code, body := get(t, c.URLs()[1]+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="` + DefaultModel + `"} 0`,
		`vllm:num_requests_waiting{`,
		`vllm:kv_cache_usage_perc{`,
		`vllm:gpu_cache_usage_perc{`,
		`vllm:prefix_cache_queries_total{`,
		`vllm:prefix_cache_hits_total{`,
		`vllm:prompt_tokens_total{`,
		`vllm:generation_tokens_total{engine="0",model_name="` + DefaultModel + `"} 3`,
		`vllm:time_to_first_token_seconds_bucket{engine="0",model_name="` + DefaultModel + `",le="+Inf"} 1`,
		`vllm:time_to_first_token_seconds_count{`,
		`vllm:cache_config_info{block_size="16",`,
		`num_gpu_blocks="4096"} 1`,
		"process_start_time_seconds ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// Every sample line is NAME{labels} VALUE or NAME VALUE.
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if _, err := strconv.ParseFloat(line[sp+1:], 64); sp < 1 || err != nil {
			t.Errorf("malformed sample %q", line)
		}
		if name := line[:sp]; strings.ContainsRune(name, ' ') && !strings.Contains(name, "{") {
			t.Errorf("malformed sample name %q", line)
		}
	}
}

func TestHTTPClientDisconnectAbortsRequest(t *testing.T) {
	c := startTestCluster(t, 1, 20) // a decode step is ~0.3 ms: the stream lasts seconds
	rep := c.Replicas()[0]
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, ctx, c.URLs()[0]+"/v1/chat/completions",
		`{"stream":true,"max_tokens":50000,"messages":[{"role":"user","content":"Tell me everything."}]}`)
	br := bufio.NewReader(resp.Body)
	for events := 0; events < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			events++
		}
	}
	if s := rep.Stats(); s.Running != 1 || s.UsedBlocks == 0 {
		t.Fatalf("while streaming: %+v", s)
	}
	cancel() // the client goes away mid-stream
	resp.Body.Close()

	// Bounded wait for the server to notice; no assertion on how long it took.
	var s Stats
	testutil.Poll(testutil.Timeout, 5*time.Millisecond, func() bool { s = rep.Stats(); return s.Running == 0 })
	if s.Running != 0 || s.UsedBlocks != 0 || s.RequestsAborted != 1 {
		t.Fatalf("after disconnect: running %d, used blocks %d, aborted %d", s.Running, s.UsedBlocks, s.RequestsAborted)
	}
	_, body := get(t, c.URLs()[0]+"/metrics")
	if !strings.Contains(body, `vllm:num_requests_running{engine="0",model_name="`+DefaultModel+`"} 0`) {
		t.Error("/metrics does not report 0 running requests")
	}
}

func TestHTTPBodyTooLarge(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxRequestBodyBytes = 1000
	cfg.Speedup = 1000
	c, err := StartCluster(cfg, 1, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp := post(t, context.Background(), c.URLs()[0]+"/v1/completions", `{"prompt":"`+strings.Repeat("x", 2000)+`"}`)
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Errorf("status %d, want 413", resp.StatusCode)
	}
}

func TestCommandRunsUntilCancelled(t *testing.T) {
	cmd := Command()
	for _, f := range []string{"replicas", "base-port", "host", "speedup", "num-gpu-blocks", "block-size", "max-num-seqs",
		"max-num-batched-tokens", "step-base", "prefill-per-token", "prefill-per-token-per-k-context", "decode-per-seq",
		"decode-per-context-token", "default-max-tokens", "max-model-len", "model"} {
		if cmd.Flags().Lookup(f) == nil {
			t.Errorf("flag --%s missing", f)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stop as soon as the URLs are printed
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--replicas", "2", "--base-port", "0", "--speedup", "50", "--num-gpu-blocks", "100"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(out.String())
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "http://127.0.0.1:") {
		t.Errorf("output %q, want two URLs", out.String())
	}
	cmd = Command()
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--base-port", "0", "--num-gpu-blocks", "0"})
	if err := cmd.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), "--num-gpu-blocks") {
		t.Errorf("invalid flag value: err = %v", err)
	}
}

// TestStalledCountsLostModelTime: an engine held off its work for 150 ms of wall time (its
// lock taken, as a descheduled process would be) counts the model time it lost in Stalled:
// at least 100 ms × the speedup. The bench flags an arm whose sims lost more than a few percent
// of their time (bench: the stall check). A lower bound only: a busy machine adds stalls.
func TestStalledCountsLostModelTime(t *testing.T) {
	const speedup = 4
	c := startTestCluster(t, 1, speedup)
	r := c.Replicas()[0]
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp := post(t, context.Background(), c.URLs()[0]+"/v1/completions",
			`{"model":"`+DefaultModel+`","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":200}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	// Once it runs: 200 decode steps of at least 1.5 ms wall each leave it running after.
	for deadline := time.Now().Add(10 * time.Second); r.Stats().Running == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never started")
		}
	}
	r.mu.Lock()
	time.Sleep(150 * time.Millisecond)
	r.mu.Unlock()
	<-done
	if got, want := r.Stalled(), 100*time.Millisecond*speedup; got < want {
		t.Errorf("Stalled %v after the engine was held 150 ms wall at speedup %d; want at least %v", got, speedup, want)
	}
}
