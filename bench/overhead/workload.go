package overhead

import (
	"math/rand/v2"
	"strconv"

	"github.com/prefixlb/prefixlb/bench/overhead/agentbody"
	"github.com/prefixlb/prefixlb/internal/splitmix"
)

// Workload makes chat-completion bodies of one target size with realistic prefix sharing:
// each body is one of a small pool of system prompts (SharedFraction of the body) followed by
// a user turn that no other body has (a window of a large word corpus at an offset drawn per
// request). Bodies are built into a caller's buffer, so generating one costs a copy and no
// allocation, and the load generator stays cheap next to the targets it measures.
//
// With WorkloadOptions.Agent the bodies are a coding agent's instead (package agentbody):
// tools, system prompt, task and a history of tool calls and results that grows by one step
// per request of a session, each body at most Size bytes.
type Workload struct {
	Size   int // target body size in bytes
	agent  *agentbody.Workload
	model  string
	system []string // the system prompts, JSON-safe
	user   int      // user-turn length in bytes
	corpus []byte   // JSON-safe words; user turns are windows of it
	stream float64  // fraction of requests with "stream": true
}

// WorkloadOptions configure NewWorkload.
type WorkloadOptions struct {
	Model          string
	SystemPrompts  int     // size of the system-prompt pool (default 4)
	SharedFraction float64 // share of the body that is the system prompt (default 0.75)
	StreamFraction float64 // share of streamed requests
	Seed           uint64
	// Agent selects a coding agent's bodies (agentbody; SystemPrompts is its number of
	// system prompts, SharedFraction does not apply); Size must be at least
	// agentbody.MinSize.
	Agent bool
}

// bodyOverhead is the JSON around the two message contents, roughly; the user turn absorbs
// the difference so that bodies come out close to Size.
const bodyOverhead = 160

var words = []string{
	"the", "model", "cache", "prefix", "token", "request", "replica", "latency", "throughput",
	"summarize", "document", "section", "policy", "answer", "question", "context", "window",
	"attention", "kernel", "batch", "schedule", "memory", "block", "evict", "route", "balance",
	"stream", "server", "client", "vector", "matrix", "report", "table", "figure", "result",
	"analysis", "compare", "measure", "quickly", "carefully", "because", "however", "therefore",
	"and", "of", "to", "in", "is", "for", "on", "with", "as", "by", "at", "from", "that", "this",
}

// NewWorkload prepares the prompt pool and the corpus for bodies of size bytes, or, with
// o.Agent, an agent workload; that fails for a size under agentbody.MinSize.
func NewWorkload(size int, o WorkloadOptions) (*Workload, error) {
	if o.Agent {
		a, err := agentbody.New(agentbody.Options{Size: size, Model: o.Model, SystemPrompts: o.SystemPrompts, StreamFraction: o.StreamFraction, Seed: o.Seed})
		if err != nil {
			return nil, err
		}
		return &Workload{Size: size, agent: a}, nil
	}
	if o.SystemPrompts <= 0 {
		o.SystemPrompts = 4
	}
	if o.SharedFraction <= 0 || o.SharedFraction >= 1 {
		o.SharedFraction = 0.75
	}
	if o.Model == "" {
		o.Model = "meta-llama/Llama-3.1-8B-Instruct"
	}
	rng := rand.New(rand.NewPCG(o.Seed, uint64(size)))
	content := max(size-bodyOverhead-len(o.Model), 64)
	sys := int(float64(content) * o.SharedFraction)
	w := &Workload{Size: size, model: o.Model, user: content - sys, stream: o.StreamFraction}
	for i := range o.SystemPrompts {
		p := "You are assistant #" + strconv.Itoa(i) + ". "
		w.system = append(w.system, string(text(rng, []byte(p), sys)))
	}
	w.corpus = text(rng, nil, max(1<<20, 8*w.user))
	return w, nil
}

// Shape names the kind of bodies: "agent" or "chat".
func (w *Workload) Shape() string {
	if w.agent != nil {
		return ShapeAgent
	}
	return ShapeChat
}

// Body shapes, as Workload.Shape and the report name them.
const (
	ShapeChat  = "chat"
	ShapeAgent = "agent"
)

// text appends random words to dst until it is n bytes long.
func text(rng *rand.Rand, dst []byte, n int) []byte {
	for len(dst) < n {
		dst = append(dst, words[rng.IntN(len(words))]...)
		dst = append(dst, ' ')
	}
	return dst[:n]
}

// Body appends the body of request number i (any int; the same i gives the same body) to
// dst[:0] and returns it, with whether it streams.
func (w *Workload) Body(dst []byte, i uint64) ([]byte, bool) {
	if w.agent != nil {
		return w.agent.Body(dst, i)
	}
	h := splitmix.Next(i)
	sys := w.system[h%uint64(len(w.system))]
	off := int((h >> 20) % uint64(len(w.corpus)-w.user))
	stream := float64(h>>11)/(1<<53) < w.stream
	dst = append(dst[:0], `{"model":"`...)
	dst = append(dst, w.model...)
	dst = append(dst, `","max_tokens":16,"messages":[{"role":"system","content":"`...)
	dst = append(dst, sys...)
	dst = append(dst, `"},{"role":"user","content":"Request `...)
	dst = strconv.AppendUint(dst, i, 10)
	dst = append(dst, ": "...)
	dst = append(dst, w.corpus[off:off+w.user]...)
	dst = append(dst, `"}],"stream":`...)
	dst = strconv.AppendBool(dst, stream)
	dst = append(dst, '}')
	return dst, stream
}
