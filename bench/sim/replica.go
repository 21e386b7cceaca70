package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"github.com/prefixlb/prefixlb/bench/kvevents"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixlb/prefixlb/bench/pace"
)

// Replica is one simulated vLLM server: an OpenAI-compatible HTTP API in front of one Engine
// driven in (scaled) real time by one goroutine.
//
// Endpoints: POST /v1/chat/completions, /v1/completions and /v1/messages (streaming SSE or
// JSON; the Messages API in Anthropic's shape, messages.go), GET
// /v1/models, /health and /metrics (vLLM metric names). A client that disconnects aborts its
// request in the engine.
type Replica struct {
	name      string
	cfg       Config
	cfgErr    error
	modelJSON string // the model name as a JSON string literal
	start     time.Time
	startUnix float64

	mu  sync.Mutex // guards eng and arr
	eng *Engine
	arr arrivals // the engine's recent accepted requests (the oracle's pending accounting)

	wake       chan struct{}
	quit       chan struct{}
	life       sync.Mutex // guards started and closed
	started    bool       // the engine goroutine runs
	closed     bool
	engineDone sync.WaitGroup
	srv        *http.Server
	ids        atomic.Uint64
	bufs       sync.Pool    // *[]byte
	stepDue    atomic.Int64 // model time (ns) at which the step in flight ends (Predict)
	// stalled is the model time (ns) the engine lost to the machine while it had work: a step
	// that could start only more than maxCatchUp (wall) after the previous one ended began
	// late, and the model time between is time a GPU would have been computing (Stalled).
	stalled atomic.Int64
	seen    seenCounters        // HTTP requests received, per path (Seen)
	pub     *kvevents.Publisher // KV events (Config.KVEventsEndpoint; nil: off)
}

// NewReplica returns a replica named name (used in logs and ids only). It does nothing until
// Serve; an invalid cfg makes Serve fail.
func NewReplica(name string, cfg Config) *Replica {
	now := time.Now()
	r := &Replica{
		name:      name,
		cfg:       cfg,
		cfgErr:    cfg.Validate(),
		start:     now,
		startUnix: float64(now.UnixNano()) / 1e9,
		wake:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
	}
	if r.cfgErr == nil {
		r.eng = NewEngine(cfg)
	}
	q, _ := json.Marshal(cfg.Model)
	r.modelJSON = string(q)
	r.srv = &http.Server{
		Handler:           r,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          nil,
	}
	r.bufs.New = func() any { b := make([]byte, 0, 16<<10); return &b }
	return r
}

// Name returns the replica's name.
func (r *Replica) Name() string { return r.name }

// Config returns the replica's configuration.
func (r *Replica) Config() Config { return r.cfg }

// Stats returns a snapshot of the engine's gauges and counters.
func (r *Replica) Stats() Stats {
	if r.eng == nil {
		return Stats{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Stats()
}

// Stalled is the model time the engine lost to the machine running it: the time between a
// step's end and the next step's start, while it had work, whenever the next began more than
// maxCatchUp (20 ms wall) late (a process descheduled, a busy machine). On a machine that
// keeps up it stays near 0; its share of the run's model time is how much of the latencies
// measure the machine rather than the engine (bench: the stall check).
func (r *Replica) Stalled() time.Duration { return time.Duration(r.stalled.Load()) }

// Serve answers HTTP on ln until Close; it returns nil after Close.
func (r *Replica) Serve(ln net.Listener) error {
	if r.cfgErr != nil {
		ln.Close()
		return r.cfgErr
	}
	r.life.Lock()
	if r.closed {
		r.life.Unlock()
		ln.Close()
		return nil
	}
	if !r.started && r.cfg.KVEventsEndpoint != "" {
		if err := r.openKVEvents(r.cfg.KVEventsEndpoint); err != nil {
			r.life.Unlock()
			ln.Close()
			return err
		}
	}
	if !r.started {
		r.started = true
		r.engineDone.Add(1)
		go r.runEngine()
	}
	r.life.Unlock()
	err := r.srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the engine and the server: listeners and connections are closed, so streams in
// flight are cut and their requests aborted.
func (r *Replica) Close() error {
	r.life.Lock()
	if r.closed {
		r.life.Unlock()
		r.engineDone.Wait()
		return nil
	}
	r.closed = true
	r.life.Unlock()
	close(r.quit)
	err := r.srv.Close()
	r.engineDone.Wait()
	if r.pub != nil {
		err = errors.Join(err, r.pub.Close())
	}
	return err
}

// modelNow is the model time: wall time since start × Speedup.
func (r *Replica) modelNow() time.Duration {
	return time.Duration(float64(time.Since(r.start)) * r.cfg.Speedup)
}

func (r *Replica) wallAt(model time.Duration) time.Time {
	return r.start.Add(time.Duration(float64(model) / r.cfg.Speedup))
}

// maxCatchUp bounds, in wall time, how far behind schedule the engine may be and still start
// its next step where the previous one was due rather than now: this absorbs timer overshoot on
// a busy machine without letting a long stall turn into a burst of instant steps.
const maxCatchUp = 20 * time.Millisecond

func (r *Replica) runEngine() {
	defer r.engineDone.Done()
	sleep := pace.New()
	defer sleep.Close()
	var due time.Duration // model time at which the previous step ended
	busy := false
	for {
		r.mu.Lock()
		d, ok := r.eng.Schedule()
		r.mu.Unlock()
		if !ok {
			busy = false
			select {
			case <-r.wake:
				continue
			case <-r.quit:
				return
			}
		}
		start := r.modelNow()
		if busy && start > due {
			if time.Duration(float64(start-due)/r.cfg.Speedup) < maxCatchUp {
				start = due // back-to-back steps: this one began when the last one ended
			} else {
				r.stalled.Add(int64(start - due))
			}
		}
		due = start + d
		r.stepDue.Store(int64(due))
		busy = true
		if !sleep.Until(r.wallAt(due), r.quit) {
			return
		}
		r.mu.Lock()
		r.eng.Complete(due)
		// Queued under the lock (Publish does not block), so that whoever holds r.mu sees
		// the cache and the publisher's count of queued batches agree.
		r.publishKVEvents(r.eng.takeKVEvents())
		r.mu.Unlock()
	}
}

func (r *Replica) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Replica) abort(rq *Request) {
	r.mu.Lock()
	r.eng.Abort(rq)
	r.mu.Unlock()
	r.kick() // freed blocks or a slot may admit a waiting request
}

// ServeHTTP routes the OpenAI and vLLM endpoints.
func (r *Replica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.seen.count(req.URL.Path)
	switch req.URL.Path {
	case "/v1/chat/completions", "/v1/completions", "/v1/messages":
		ep := endpointOf(req.URL.Path)
		if req.Method != http.MethodPost {
			writeAPIError(w, ep, &apiError{status: 405, typ: "invalid_request_error", msg: "method not allowed, use POST"})
			return
		}
		r.handleGenerate(w, req, ep)
	case "/v1/models", "/health", "/metrics", "/ping":
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			writeError(w, &apiError{status: 405, typ: "invalid_request_error", msg: "method not allowed, use GET"})
			return
		}
		switch req.URL.Path {
		case "/v1/models":
			r.handleModels(w)
		case "/metrics":
			r.handleMetrics(w)
		default: // vLLM answers /health with 200 and an empty body
			w.WriteHeader(http.StatusOK)
		}
	default:
		writeError(w, &apiError{status: 404, typ: "invalid_request_error", msg: "Not Found: " + req.URL.Path})
	}
}

func (r *Replica) handleModels(w http.ResponseWriter) {
	var b []byte
	b = append(b, `{"object":"list","data":[{"id":`...)
	b = append(b, r.modelJSON...)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, int64(r.startUnix), 10)
	b = append(b, `,"owned_by":"vllm","root":`...)
	b = append(b, r.modelJSON...)
	b = append(b, `,"parent":null,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(r.cfg.MaxModelLen), 10)
	b = append(b, `,"permission":[]}`...)
	for _, a := range r.cfg.Adapters {
		// vLLM lists a LoRA adapter with its path as root and the base model as parent.
		q, _ := json.Marshal(a)
		b = append(b, `,{"id":`...)
		b = append(b, q...)
		b = append(b, `,"object":"model","created":`...)
		b = strconv.AppendInt(b, int64(r.startUnix), 10)
		b = append(b, `,"owned_by":"vllm","root":`...)
		b = append(b, q...)
		b = append(b, `,"parent":`...)
		b = append(b, r.modelJSON...)
		b = append(b, `,"max_model_len":null,"permission":[]}`...)
	}
	b = append(b, `]}`...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (r *Replica) handleMetrics(w http.ResponseWriter) {
	s := r.Stats()
	var b bytes.Buffer
	writeMetrics(&b, &s, &r.cfg, r.startUnix)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write(b.Bytes())
}

func (r *Replica) handleGenerate(w http.ResponseWriter, req *http.Request, ep endpoint) {
	chat := ep != epCompletions
	bp := r.bufs.Get().(*[]byte)
	defer r.bufs.Put(bp)
	body, err := readBody((*bp)[:0], http.MaxBytesReader(w, req.Body, r.cfg.MaxRequestBodyBytes))
	*bp = body
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeAPIError(w, ep, &apiError{status: 413, typ: "invalid_request_error",
				msg: "request body larger than " + strconv.FormatInt(tooBig.Limit, 10) + " bytes"})
		} else {
			writeAPIError(w, ep, badRequest("", "reading the body: %v", err))
		}
		return
	}
	sp := r.bufs.Get().(*[]byte)
	ar, aerr := parseRequest(body, ep, &r.cfg, sp)
	r.bufs.Put(sp)
	if aerr != nil {
		writeAPIError(w, ep, aerr)
		return
	}

	fp := Fingerprint(ar.tokens, ar.seed, ar.maxTokens)
	rq := NewRequest(ar.tokens, ar.maxTokens, ar.seed, !chat, ar.stream)
	r.mu.Lock()
	err = r.eng.Add(rq, r.modelNow())
	if err == nil {
		r.arr.add(fp)
	}
	r.mu.Unlock()
	if err != nil {
		param := "prompt"
		if chat {
			param = "messages"
		}
		writeAPIError(w, ep, badRequest(param, "%v", err))
		return
	}
	r.kick()
	defer func() {
		if !rq.Done() {
			r.abort(rq) // client gone, or the replica is closing
		}
	}()

	n := r.ids.Add(1)
	var id []byte
	switch ep {
	case epMessages:
		id = append(id, "msg_"...)
	case epChat:
		id = append(id, "chatcmpl-"...)
	default:
		id = append(id, "cmpl-"...)
	}
	id = append(id, r.name...)
	id = append(id, '-')
	id = strconv.AppendUint(id, n, 10)
	created := time.Now().Unix()

	switch {
	case ep == epMessages && ar.stream:
		r.streamMessages(w, req, rq, id, bp)
	case ep == epMessages:
		r.respondMessages(w, req, rq, id, bp)
	case ar.stream:
		r.stream(w, req, rq, chat, ar.includeUsage, id, created, bp)
	default:
		r.respond(w, req, rq, chat, id, created, bp)
	}
}

func readBody(dst []byte, rd io.Reader) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := rd.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// chunkHead appends the fields every chunk of a stream starts with, up to `"choices":[`.
func (r *Replica) chunkHead(b, id []byte, chat bool, created int64) []byte {
	b = append(b, `data: {"id":"`...)
	b = append(b, id...)
	if chat {
		b = append(b, `","object":"chat.completion.chunk","created":`...)
	} else {
		b = append(b, `","object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = append(b, r.modelJSON...)
	b = append(b, `,"choices":[`...)
	return b
}

func appendUsage(b []byte, rq *Request, completion int) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(rq.promptLen), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(rq.promptLen+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(rq.CachedTokens()), 10)
	b = append(b, `}}`...)
	return b
}

// stream writes the response as server-sent events, one event per token, flushed as soon as
// the engine produces it. The chunk text around each word is fixed per request, so a token
// costs a few appends and one write+flush.
func (r *Replica) stream(w http.ResponseWriter, req *http.Request, rq *Request, chat, includeUsage bool, id []byte, created int64, bp *[]byte) {
	head := r.chunkHead(nil, id, chat, created)
	r.streamEvents(w, req, rq, bp, func(b []byte, sent int) []byte {
		if chat && sent == 0 {
			b = append(b, head...)
			b = append(b, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		}
		b = append(b, head...)
		if chat {
			b = append(b, `{"index":0,"delta":{"content":"`...)
			b = append(b, rq.OutputWord(sent)...)
			b = append(b, `"},"logprobs":null,"finish_reason":`...)
		} else {
			b = append(b, `{"index":0,"text":"`...)
			b = append(b, rq.OutputWord(sent)...)
			b = append(b, `","logprobs":null,"finish_reason":`...)
		}
		if sent == rq.maxTokens-1 {
			return append(b, `"length","stop_reason":null}]}`+"\n\n"...)
		}
		return append(b, `null,"stop_reason":null}]}`+"\n\n"...)
	}, func(b []byte, sent int) []byte {
		if includeUsage {
			b = append(b, head...)
			b = append(b, "],"...)
			b = appendUsage(b, rq, sent)
			b = append(b, "}\n\n"...)
		}
		return append(b, "data: [DONE]\n\n"...)
	})
}

// streamEvents is the server-sent-events plumbing of both APIs: headers at once (as uvicorn
// sends them; the first token may take a while), then, as the engine produces tokens, token's
// bytes for each new one and, once all maxTokens are out, end's, each batch in one write and
// flush; it stops when the client or the replica goes.
func (r *Replica) streamEvents(w http.ResponseWriter, req *http.Request, rq *Request, bp *[]byte, token, end func(b []byte, sent int) []byte) {
	fl, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if fl != nil {
		fl.Flush()
	}
	b := (*bp)[:0]
	defer func() { *bp = b }()
	ctx := req.Context()
	sent := 0
	for {
		done := rq.Done() // before Generated: once done, Generated is final
		n := rq.Generated()
		b = b[:0]
		for ; sent < n; sent++ {
			b = token(b, sent)
		}
		if done && sent == rq.maxTokens {
			b = end(b, sent)
		}
		if len(b) > 0 {
			if _, err := w.Write(b); err != nil {
				return
			}
			if fl != nil {
				fl.Flush()
			}
		}
		if done {
			return
		}
		select {
		case <-rq.Ready():
		case <-ctx.Done():
			return
		case <-r.quit:
			return
		}
	}
}

// respond waits for the whole generation and writes one JSON response.
func (r *Replica) respond(w http.ResponseWriter, req *http.Request, rq *Request, chat bool, id []byte, created int64, bp *[]byte) {
	ctx := req.Context()
	for !rq.Done() {
		select {
		case <-rq.Ready():
		case <-ctx.Done():
			return
		case <-r.quit:
			return
		}
	}
	n := rq.Generated()
	if n < rq.maxTokens {
		writeError(w, &apiError{status: 503, typ: "server_error", msg: "request aborted"})
		return
	}
	b := (*bp)[:0]
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	if chat {
		b = append(b, `","object":"chat.completion","created":`...)
	} else {
		b = append(b, `","object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = append(b, r.modelJSON...)
	if chat {
		b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	} else {
		b = append(b, `,"choices":[{"index":0,"text":"`...)
	}
	for i := range n {
		b = append(b, rq.OutputWord(i)...)
	}
	if chat {
		b = append(b, `"},"logprobs":null,"finish_reason":"length","stop_reason":null}],`...)
	} else {
		b = append(b, `","logprobs":null,"finish_reason":"length","stop_reason":null}],`...)
	}
	b = appendUsage(b, rq, n)
	b = append(b, '}')
	*bp = b
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// writeError writes the OpenAI error shape:
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
func writeError(w http.ResponseWriter, e *apiError) {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	}
	bd := body{Message: e.msg, Type: e.typ}
	if e.param != "" {
		bd.Param = &e.param
	}
	if e.code != "" {
		bd.Code = e.code
	}
	out, _ := json.Marshal(map[string]body{"error": bd})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_, _ = w.Write(out)
}
