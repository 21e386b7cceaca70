// Package loadgen sends a workload to an OpenAI-compatible endpoint and measures every
// streamed request: TTFT from the scheduled send time, inter-token gaps, end-to-end latency,
// token counts and cached tokens from the final usage chunk, and the serving backend named by
// prefixlb's x-prefixlb-backend header.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixlb/prefixlb/bench/workload"
)

// Response headers set by prefixlb.
const (
	// BackendHeader names the backend that served a request.
	BackendHeader = "x-prefixlb-backend"
	// RouteHeader says why: "REASON;chunks=N", in prefix mode with ";cached=T;predicted_ttft_us=U".
	RouteHeader = "x-prefixlb-route"
)

// Result is the measurement of one request.
type Result struct {
	Conversation int
	Turn         int
	// Scheduled is when the request was due (after think time or at its arrival offset);
	// latencies are measured from it, so a late send counts against the server, not hidden.
	Scheduled time.Time
	// SendLag is how late the request went out: Scheduled → the client starting to send it
	// (encoding, and for an open-loop arrival the wake-up of its timer). On an idle machine it
	// is microseconds; milliseconds mean the machine running the bench is short of CPU, and
	// its latencies measure that machine rather than the routing.
	SendLag time.Duration
	// TTFT: Scheduled → first data line with non-empty content. Zero if none arrived.
	TTFT time.Duration
	// ITL are the gaps between consecutive content events.
	ITL []time.Duration
	// E2E: Scheduled → end of the stream.
	E2E time.Duration
	// Usage from the final usage chunk (backend-reported).
	PromptTokens int
	OutputTokens int
	CachedTokens int
	// UsageSeen is true when a usage chunk arrived.
	UsageSeen bool
	// Backend is the x-prefixlb-backend response header ("" if absent).
	Backend string
	// Route is the x-prefixlb-route response header ("" if absent).
	Route string
	// Status is the HTTP status (0: no response).
	Status int
	// Err is a short reason when the request failed ("" on success).
	Err string
	// Reply is the assistant text received (carried into the next turn).
	Reply string
	// BodyHash is the xxhash64 of the exact request body bytes sent (0 if encoding failed):
	// arms of a comparison that got the same requests have the same hashes.
	BodyHash uint64
	// Router is the index in Client.Bases of the target the request went to (0 with Base).
	Router int
	// Tenant is the name of the tenant that sent the request ("" outside multi-tenant
	// workloads).
	Tenant string
	// Expired: the client gave up waiting for the first token (Request.Patience) and
	// cancelled the request; Err is then ExpiredReason.
	Expired bool
	// ErrorCode is the reason an error answer gives: the OpenAI-shaped body's error.code, else
	// its error.type ("" when the answer was 200 or its body says neither).
	ErrorCode string
}

// ExpiredReason is Result.Err of a request whose client gave up before the first token.
const ExpiredReason = "expired at client"

// OK reports whether the request succeeded.
func (r *Result) OK() bool { return r.Err == "" }

// Class is what became of a request, each request exactly one.
type Class int

const (
	// Completed: the stream ended normally with content.
	Completed Class = iota
	// Refused: the answer was HTTP 429 or 503 (an explicit refusal: overload, shedding, no
	// backend); its reason is ErrorCode.
	Refused
	// Expired: the client gave up before the first token (Result.Expired).
	Expired
	// Failed: anything else (another error status, a transport error, a broken stream).
	Failed
)

// Class classifies the request.
func (r *Result) Class() Class {
	switch {
	case r.Expired:
		return Expired
	case r.OK():
		return Completed
	case r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable:
		return Refused
	}
	return Failed
}

// Client sends streamed chat/completions requests.
type Client struct {
	// Base is the target's base URL, e.g. http://127.0.0.1:8080 (no /v1).
	Base string
	// Bases, when not empty, replaces Base with several targets (e.g. several prefixlb
	// replicas): each request goes to the next one in turn, round-robin per request, as a
	// Kubernetes Service spreads requests over a Deployment's pods.
	Bases     []string
	Model     string
	IgnoreEOS bool
	HTTP      *http.Client
	// MaxReplyBytes caps how much reply text is kept for the next turn (0: unlimited).
	MaxReplyBytes int
	// API, when MessagesAPI, sends chat requests to /v1/messages in the Messages API's shape
	// (messages.go); "" sends each request to its workload's OpenAI endpoint.
	API string

	next atomic.Uint64 // requests sent, for the round-robin over Bases
}

// pick returns the base URL for the next request and its index in Bases.
func (c *Client) pick() (string, int) {
	if len(c.Bases) == 0 {
		return c.Base, 0
	}
	i := int((c.next.Add(1) - 1) % uint64(len(c.Bases)))
	return c.Bases[i], i
}

// NewHTTPClient returns an HTTP/1.1 client for concurrency parallel streams: keep-alive pool of
// that size (net/http's default of 2 idle conns per host would re-dial constantly), no
// compression, no overall timeout (streams are bounded by the request context).
func NewHTTPClient(concurrency int) *http.Client {
	concurrency = max(concurrency, 1)
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        concurrency,
		MaxIdleConnsPerHost: concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr}
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatRequest struct {
	Model         string             `json:"model"`
	Messages      []workload.Message `json:"messages,omitempty"`
	Tools         json.RawMessage    `json:"tools,omitempty"`
	Prompt        string             `json:"prompt,omitempty"`
	MaxTokens     int                `json:"max_tokens"`
	Stream        bool               `json:"stream"`
	StreamOptions streamOptions      `json:"stream_options"`
	IgnoreEOS     bool               `json:"ignore_eos,omitempty"`
}

type chunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// Request is what one turn sends.
type Request struct {
	API       workload.API
	Messages  []workload.Message // chat
	Tools     json.RawMessage    // chat: the "tools" field (nil: none)
	Prompt    string             // completions
	MaxTokens int
	// Headers are extra request headers (a tenant's marks), set in order.
	Headers [][2]string
	// Patience, when > 0, is how long after its due time the client waits for the first
	// token before it gives up and cancels the request (Result.Expired).
	Patience time.Duration
}

// Do sends req and reads the stream to its end. scheduled is when it was due. It never
// returns an error: failures are recorded in the Result.
func (c *Client) Do(ctx context.Context, req Request, scheduled time.Time) (res Result) {
	res = Result{Scheduled: scheduled}
	var wait *patience
	if req.Patience > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		wait = startPatience(scheduled.Add(req.Patience), cancel)
		defer func() {
			if !wait.settle() { // the deadline passed first: whatever broke, the client left
				res.Err, res.Expired = ExpiredReason, true
			}
		}()
	}
	body := chatRequest{Model: c.Model, MaxTokens: req.MaxTokens, Stream: true,
		StreamOptions: streamOptions{IncludeUsage: true}, IgnoreEOS: c.IgnoreEOS}
	path := "/v1/chat/completions"
	var enc any = &body
	messages := c.API == MessagesAPI && req.API != workload.Completions
	switch {
	case req.API == workload.Completions:
		path = "/v1/completions"
		body.Prompt = req.Prompt
	case messages:
		path = "/v1/messages"
		mb, err := toMessagesRequest(c.Model, req.MaxTokens, c.IgnoreEOS, req.Messages, req.Tools)
		if err != nil {
			res.Err = "encode: " + err.Error()
			return res
		}
		enc = mb
	default:
		body.Messages, body.Tools = req.Messages, req.Tools
	}
	buf, err := json.Marshal(enc)
	if err != nil {
		res.Err = "encode: " + err.Error()
		return res
	}
	res.BodyHash = xxhash.Sum64(buf)
	base, router := c.pick()
	res.Router = router
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+path, bytes.NewReader(buf))
	if err != nil {
		res.Err = "request: " + err.Error()
		return res
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	for _, h := range req.Headers {
		hreq.Header.Set(h[0], h[1])
	}
	res.SendLag = time.Since(scheduled)
	resp, err := c.HTTP.Do(hreq)
	if err != nil {
		res.E2E = time.Since(scheduled)
		res.Err = transportReason(err)
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Backend = resp.Header.Get(BackendHeader)
	res.Route = resp.Header.Get(RouteHeader)
	if resp.StatusCode != http.StatusOK {
		wait.settle() // an answer, if it came in time
		res.ErrorCode = errorCode(io.LimitReader(resp.Body, 1<<20))
		res.E2E = time.Since(scheduled)
		res.Err = fmt.Sprintf("status %d", resp.StatusCode)
		return res
	}
	var format streamFormat = chatStream{}
	if messages {
		format = messagesStream{}
	}
	c.readStream(resp.Body, &res, format, wait)
	res.E2E = time.Since(scheduled)
	return res
}

// streamFormat is what the events of one API's stream mean, for readStream.
type streamFormat interface {
	// event reads one SSE data payload (trimmed, not empty) into res and returns the text it
	// carries ("" when it is not a content event), whether it ends the stream, and why the
	// stream failed ("" when it did not).
	event(data []byte, res *Result) (text string, done bool, fail string)
	// finish fills res.OutputTokens from the count of content events when the stream did not
	// report it.
	finish(res *Result, events int)
}

// readStream reads an event stream to its end as format reads its events: TTFT at the first
// content event, ITL between content events, the reply (up to MaxReplyBytes), and an error
// reason when the stream fails, is truncated or carries no content. SSE lines are read with a
// bufio.Reader (no line-length limit, unlike bufio.Scanner); only data lines count. The first
// content event settles the client's patience (wait; nil: none): one that came too late ends
// the read, the request already counted expired.
func (c *Client) readStream(r io.Reader, res *Result, format streamFormat, wait *patience) {
	br := bufio.NewReaderSize(r, 64<<10)
	var reply strings.Builder
	var last time.Time
	events, done := 0, false
	for !done {
		line, err := br.ReadBytes('\n')
		now := time.Now()
		line = bytes.TrimRight(line, "\r\n")
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data = bytes.TrimSpace(data); len(data) > 0 {
				var text, fail string
				text, done, fail = format.event(data, res)
				if fail != "" {
					res.Err = fail
					return
				}
				if text != "" {
					if events == 0 {
						if !wait.settle() {
							return // too late: the client has left (Do marks it expired)
						}
						res.TTFT = now.Sub(res.Scheduled)
					} else {
						res.ITL = append(res.ITL, now.Sub(last))
					}
					last = now
					events++
					if c.MaxReplyBytes == 0 || reply.Len() < c.MaxReplyBytes {
						reply.WriteString(text)
					}
				}
			}
		}
		if err != nil {
			if !done {
				if errors.Is(err, io.EOF) {
					res.Err = "truncated stream"
				} else {
					res.Err = transportReason(err)
				}
			}
			break
		}
	}
	res.Reply = reply.String()
	if res.Err == "" && events == 0 {
		res.Err = "no content"
	}
	format.finish(res, events)
}

// chatStream reads chat and completions chunks: content from the first choice's delta (chat)
// or text (completions), usage from the final usage chunk, the end at [DONE].
type chatStream struct{}

func (chatStream) event(data []byte, res *Result) (string, bool, string) {
	if bytes.Equal(data, []byte("[DONE]")) {
		return "", true, ""
	}
	var ch chunk
	if jerr := json.Unmarshal(data, &ch); jerr != nil {
		return "", false, "bad chunk"
	}
	if len(ch.Error) > 0 && !bytes.Equal(ch.Error, []byte("null")) {
		return "", false, "stream error"
	}
	if u := ch.Usage; u != nil {
		res.UsageSeen = true
		res.PromptTokens = u.PromptTokens
		res.OutputTokens = u.CompletionTokens
		if u.PromptTokensDetails != nil {
			res.CachedTokens = u.PromptTokensDetails.CachedTokens
		}
	}
	if len(ch.Choices) == 0 {
		return "", false, ""
	}
	return ch.Choices[0].Delta.Content + ch.Choices[0].Text, false, ""
}

// finish counts the content events as output tokens when no usage chunk arrived.
func (chatStream) finish(res *Result, events int) {
	if !res.UsageSeen {
		res.OutputTokens = events
	}
}

// transportReason shortens a transport error to a countable reason.
func transportReason(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "unexpected EOF"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	if len(s) > 60 {
		s = s[:60]
	}
	return "transport: " + s
}

// errorCode reads an error answer's OpenAI-shaped body, {"error": {"code": …, "type": …}},
// and returns its code, else its type ("" when it has neither or is not JSON). A code that is
// not a string (some servers send numbers) is written as it was sent.
func errorCode(r io.Reader) string {
	b, _ := io.ReadAll(r)
	var v struct {
		Error struct {
			Code json.RawMessage `json:"code"`
			Type string          `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &v) != nil {
		return ""
	}
	var code string
	if c := v.Error.Code; len(c) > 0 && !bytes.Equal(c, []byte("null")) {
		if json.Unmarshal(c, &code) != nil {
			code = string(c)
		}
	}
	if code != "" {
		return code
	}
	return v.Error.Type
}

// patience is a client's deadline for a request's first token: when it passes with no answer
// yet, the request's context is cancelled. Whichever comes first, the deadline or settle (a
// first token, an error answer, the end of the attempt), wins, once.
type patience struct {
	state atomic.Int32 // patienceWaiting → patienceAnswered or patienceExpired
	timer *time.Timer
}

const (
	patienceWaiting int32 = iota
	patienceAnswered
	patienceExpired
)

func startPatience(deadline time.Time, cancel func()) *patience {
	p := &patience{}
	p.timer = time.AfterFunc(time.Until(deadline), func() {
		if p.state.CompareAndSwap(patienceWaiting, patienceExpired) {
			cancel()
		}
	})
	return p
}

// settle records an answer (nil p: no deadline) and reports whether it came in time; after
// it the deadline no longer cancels anything.
func (p *patience) settle() bool {
	if p == nil {
		return true
	}
	p.state.CompareAndSwap(patienceWaiting, patienceAnswered)
	if p.state.Load() == patienceExpired {
		return false
	}
	p.timer.Stop()
	return true
}
