package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

// Zero-latency replicas: an OpenAI-compatible server that answers every completion at once,
// with no engine, no KV cache and no tokenizer. They exist to measure what a proxy in front of
// them costs (bench overhead): the backend must not be the bottleneck, so it is a fasthttp
// server whose steady state allocates almost nothing.
//
// POST /v1/chat/completions and /v1/completions answer 200 with a fixed completion:
//   - "stream": true → text/event-stream, chunked, ZeroOptions.Chunks content events written
//     (and flushed) one by one, then a usage event and "data: [DONE]";
//   - otherwise one application/json chat.completion (text_completion for /v1/completions).
//
// usage.prompt_tokens is the body length ÷ 4. The usage has no prompt_tokens_details, as stock
// vLLM's (it reports cached tokens only with --enable-prompt-tokens-details): a replica without
// a cache that reported "cached_tokens": 0 would have prefixlb's index correct itself away on
// every request (router/correct.go), and the overhead bench would measure that churn (every
// prompt relearned whole, and sent whole to a peer) instead of a proxy in front of replicas that
// keep their prefixes. GET /v1/models and /health answer as vLLM does; anything else is 404.

// DefaultZeroChunks is the number of content events in a streamed zero-latency response.
const DefaultZeroChunks = 4

// ZeroOptions configure zero-latency replicas.
type ZeroOptions struct {
	// Model is the model name in responses (default DefaultModel).
	Model string
	// Chunks is the number of content events of a streamed response (default 4).
	Chunks int
}

// ZeroCluster is N zero-latency replicas in one process.
type ZeroCluster struct {
	srvs   []*fasthttp.Server
	lns    []net.Listener
	urls   []string
	served atomic.Uint64
	wg     sync.WaitGroup
}

// StartZero starts n zero-latency replicas on host:basePort … (basePort 0: ephemeral ports)
// and serves them in the background until Close.
func StartZero(n int, host string, basePort int, o ZeroOptions) (*ZeroCluster, error) {
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.Chunks <= 0 {
		o.Chunks = DefaultZeroChunks
	}
	lns, urls, err := listenN(n, host, basePort)
	if err != nil {
		return nil, err
	}
	z := &ZeroCluster{lns: lns, urls: urls}
	h := newZeroHandler(o, &z.served)
	for range n {
		z.srvs = append(z.srvs, &fasthttp.Server{
			Handler:                       h.serve,
			Name:                          "sim-zero",
			MaxRequestBodySize:            64 << 20,
			ReadBufferSize:                16 << 10,
			DisableHeaderNamesNormalizing: true,
			DisablePreParseMultipartForm:  true,
			NoDefaultDate:                 true,
			NoDefaultContentType:          true,
			CloseOnShutdown:               true,
		})
	}
	for i, s := range z.srvs {
		z.wg.Add(1)
		go func(s *fasthttp.Server, ln net.Listener) {
			defer z.wg.Done()
			_ = s.Serve(ln)
		}(s, z.lns[i])
	}
	return z, nil
}

// URLs returns the replicas' base URLs ("http://127.0.0.1:PORT").
func (z *ZeroCluster) URLs() []string { return append([]string(nil), z.urls...) }

// Served is the number of completions answered so far, over all replicas.
func (z *ZeroCluster) Served() uint64 { return z.served.Load() }

// Close stops the replicas (open connections are closed) and waits for them.
func (z *ZeroCluster) Close() error {
	var errs []error
	for _, s := range z.srvs {
		if err := s.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	z.wg.Wait()
	return errors.Join(errs...)
}

// zeroHandler holds the pre-rendered response pieces.
type zeroHandler struct {
	served   *atomic.Uint64
	output   int // completion tokens: one per content event
	models   []byte
	chatHead []byte // non-streamed chat response up to the prompt_tokens value
	textHead []byte // non-streamed completions response up to the prompt_tokens value
	chatSSE  [][]byte
	textSSE  [][]byte
	usageA   []byte // chat usage event up to the prompt_tokens value
	usageT   []byte // completions usage event up to the prompt_tokens value
	readers  sync.Pool
}

func newZeroHandler(o ZeroOptions, served *atomic.Uint64) *zeroHandler {
	q := strconv.Quote(o.Model)
	h := &zeroHandler{served: served, output: o.Chunks}
	h.models = []byte(`{"object":"list","data":[{"id":` + q + `,"object":"model","owned_by":"vllm","max_model_len":131072}]}`)
	h.chatHead = []byte(`{"id":"chatcmpl-zero","object":"chat.completion","created":0,"model":` + q +
		`,"choices":[{"index":0,"message":{"role":"assistant","content":"zero latency reply"},"finish_reason":"stop"}],"usage":{"completion_tokens":` +
		strconv.Itoa(o.Chunks) + `,"prompt_tokens":`)
	h.textHead = []byte(`{"id":"cmpl-zero","object":"text_completion","created":0,"model":` + q +
		`,"choices":[{"index":0,"text":"zero latency reply","finish_reason":"stop"}],"usage":{"completion_tokens":` +
		strconv.Itoa(o.Chunks) + `,"prompt_tokens":`)
	for i := range o.Chunks {
		fin := "null"
		if i == o.Chunks-1 {
			fin = `"stop"`
		}
		h.chatSSE = append(h.chatSSE, []byte(`data: {"id":"chatcmpl-zero","object":"chat.completion.chunk","created":0,"model":`+q+
			`,"choices":[{"index":0,"delta":{"content":"tok`+strconv.Itoa(i)+` "},"finish_reason":`+fin+`}]}`+"\n\n"))
		h.textSSE = append(h.textSSE, []byte(`data: {"id":"cmpl-zero","object":"text_completion","created":0,"model":`+q+
			`,"choices":[{"index":0,"text":"tok`+strconv.Itoa(i)+` ","finish_reason":`+fin+`}]}`+"\n\n"))
	}
	h.usageA = []byte(`data: {"id":"zero","object":"chat.completion.chunk","created":0,"model":` + q +
		`,"choices":[],"usage":{"completion_tokens":` + strconv.Itoa(o.Chunks) + `,"prompt_tokens":`)
	h.usageT = []byte(`data: {"id":"zero","object":"text_completion","created":0,"model":` + q +
		`,"choices":[],"usage":{"completion_tokens":` + strconv.Itoa(o.Chunks) + `,"prompt_tokens":`)
	h.readers.New = func() any { return &sseReader{h: h} }
	return h
}

func (h *zeroHandler) serve(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch string(path) {
	case "/v1/chat/completions", "/v1/completions":
	case "/v1/models":
		ctx.SetContentType("application/json")
		ctx.SetBody(h.models)
		return
	case "/health":
		return
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"not found","type":"invalid_request_error"}}`)
		return
	}
	if !ctx.IsPost() {
		ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
		return
	}
	h.served.Add(1)
	chat := string(path) == "/v1/chat/completions"
	body := ctx.PostBody()
	prompt := len(body) / 4
	if !wantsStream(body) {
		ctx.SetContentType("application/json")
		head := h.textHead
		if chat {
			head = h.chatHead
		}
		b := ctx.Response.BodyWriter()
		_, _ = b.Write(head)
		var num [20]byte
		_, _ = b.Write(strconv.AppendInt(num[:0], int64(prompt), 10))
		_, _ = b.Write([]byte(`,"total_tokens":`))
		_, _ = b.Write(strconv.AppendInt(num[:0], int64(prompt+h.output), 10))
		_, _ = b.Write([]byte(`}}`))
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	r := h.readers.Get().(*sseReader)
	r.events, r.usage = h.textSSE, append(r.usage[:0], h.usageT...)
	if chat {
		r.events, r.usage = h.chatSSE, append(r.usage[:0], h.usageA...)
	}
	r.i = 0
	r.usage = strconv.AppendInt(r.usage, int64(prompt), 10)
	r.usage = append(r.usage, "}}\n\ndata: [DONE]\n\n"...)
	ctx.SetBodyStream(r, -1)
}

// sseReader hands fasthttp one SSE event per Read, so that each goes out as its own flushed
// chunk, as a streaming engine writes them.
type sseReader struct {
	h      *zeroHandler
	events [][]byte
	i      int
	usage  []byte
}

func (r *sseReader) Read(p []byte) (int, error) {
	var ev []byte
	switch {
	case r.i < len(r.events):
		ev = r.events[r.i]
	case r.i == len(r.events):
		ev = r.usage
	default:
		return 0, io.EOF
	}
	if len(p) < len(ev) {
		return 0, errors.New("sim-zero: read buffer too small")
	}
	r.i++
	return copy(p, ev), nil
}

// Close returns the reader to its pool; fasthttp calls it once the body is written.
func (r *sseReader) Close() error {
	r.events = nil
	r.h.readers.Put(r)
	return nil
}

// wantsStream reports whether a JSON body sets "stream": true, by a scan that allows
// whitespace around the colon. A "stream" key nested in a message would also count; the
// bodies the overhead bench sends put it at the top level only.
func wantsStream(body []byte) bool {
	key := []byte(`"stream"`)
	for {
		i := bytes.Index(body, key)
		if i < 0 {
			return false
		}
		rest := body[i+len(key):]
		j := 0
		for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t' || rest[j] == '\n' || rest[j] == '\r') {
			j++
		}
		if j < len(rest) && rest[j] == ':' {
			j++
			for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t' || rest[j] == '\n' || rest[j] == '\r') {
				j++
			}
			return bytes.HasPrefix(rest[j:], []byte("true"))
		}
		body = rest
	}
}

// runZero is `prefixlb sim --zero-latency`: zero-latency replicas until ctx is done.
func runZero(ctx context.Context, out io.Writer, model string, n int, host string, basePort int) error {
	z, err := StartZero(n, host, basePort, ZeroOptions{Model: model})
	if err != nil {
		return err
	}
	for _, u := range z.URLs() {
		fmt.Fprintln(out, u)
	}
	<-ctx.Done()
	return z.Close()
}
