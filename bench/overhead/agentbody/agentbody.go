// Package agentbody makes the request bodies a coding agent sends: chat completions with a
// "tools" list (JSON function schemas), a system prompt, the session's task, then a long
// history of assistant turns that call tools and the tools' results. Each request of a
// session is the previous one plus one more step (an assistant turn with a tool call and that
// call's result), so all of it but the last step is a byte prefix the previous request
// already sent, as a coding agent's loop sends it.
//
// Bodies are built into a caller's buffer from pieces rendered once by New (the header, the
// task texts, a pool of steps), so that generating one costs a few copies and no allocation:
// a load generator stays cheap next to the proxies it measures. The package imports only the
// standard library, so that the proxy's and the router's benchmarks can use it.
package agentbody

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/prefixlb/prefixlb/internal/splitmix"
)

// Defaults of Options left at zero.
const (
	// DefaultSessions is the number of sessions in flight: requests go round-robin over them,
	// so a session's next request follows its previous one by this many requests, more than
	// the load generator's connections (32 in bench overhead), as an agent waits for its
	// answer and runs the tool before it sends again.
	DefaultSessions = 64
	// DefaultSteps is the number of requests of a session, each one step longer than the one
	// before.
	DefaultSteps = 16
	// DefaultModel is the "model" of the bodies.
	DefaultModel = "meta-llama/Llama-3.1-8B-Instruct"
)

// MinSize is the smallest body size New accepts, in bytes: below it the tools list (about
// 9 KB of structure without descriptions) and a session's steps do not fit.
const MinSize = 64 << 10

// Shares of a body, as divisors of Options.Size: the tools list is about 1/24 of it (44 KB at
// 1 MiB: a coding agent's tool set, ~11k tokens, is of that order), the system prompt about
// 1/48 (22 KB), the task at most 1/512 (2 KB at most: taskMax); a step (assistant turn, tool
// call, tool result) is 1/200 on average (5 KB at 1 MiB, a file read or a command's output),
// each drawn uniformly between half and one and a half of that.
const (
	toolsShare  = 24
	systemShare = 48
	taskShare   = 512
	taskMax     = 2 << 10
	stepShare   = 200
	minStep     = 512 // bytes: a step is never drawn shorter (its JSON alone is ~400)
)

// Options configure New.
type Options struct {
	// Size is the largest body in bytes (≥ MinSize): the last request of a session comes
	// within one step (at most 1.5 × Size/200 bytes) under it, its first about Steps steps
	// (Steps × Size/200 bytes on average) shorter.
	Size int
	// Model is the body's "model" (default DefaultModel).
	Model string
	// SystemPrompts is the number of system prompts (agents) the sessions are spread over
	// (default 1); all share one tools list.
	SystemPrompts int
	// StreamFraction is the share of sessions whose requests have "stream": true (a session
	// streams all its requests or none, so that each is a byte prefix of the next).
	StreamFraction float64
	// Sessions and Steps: see DefaultSessions and DefaultSteps.
	Sessions int
	Steps    int
	// Seed makes the texts; the same options give the same bodies.
	Seed uint64
}

// Workload makes the bodies of one Options. It is immutable after New and safe for
// concurrent use.
type Workload struct {
	size, sessions, steps int
	stream                float64
	model                 string
	// head[v] is the body from its opening brace to the "stream" value (exclusive); mid[v]
	// from after it to the task text of system prompt v (exclusive): max_tokens, tools,
	// system message, the user message's opening and "Session ".
	head  []byte
	mid   [][]byte
	tasks []byte // task texts: windows of it
	task  int    // task length in bytes
	// pool holds the steps, each beginning with a comma (",{assistant},{tool}"), back to
	// back; step k is pool[off[k]:off[k+1]]. A session reads a window of consecutive steps
	// that wraps around the end.
	pool []byte
	off  []int
}

// tail ends the messages list and the body.
const tail = `]}`

// taskSep and taskClose frame a session's task text in the user message.
const (
	taskSep   = `: `
	taskClose = `"}`
)

// maxSessionDigits bounds the bytes of a session number in a body (a uint64).
const maxSessionDigits = 20

// New renders the pieces of bodies of o.Size bytes at most. It fails on a size under MinSize
// or a negative count.
func New(o Options) (*Workload, error) {
	switch {
	case o.Size < MinSize:
		return nil, fmt.Errorf("agentbody: size %d is below the minimum %d bytes", o.Size, MinSize)
	case o.Sessions < 0 || o.Steps < 0 || o.SystemPrompts < 0:
		return nil, errors.New("agentbody: sessions, steps and system prompts must not be negative")
	case o.StreamFraction < 0 || o.StreamFraction > 1:
		return nil, fmt.Errorf("agentbody: stream fraction %v is not in [0, 1]", o.StreamFraction)
	}
	if o.Sessions == 0 {
		o.Sessions = DefaultSessions
	}
	if o.Steps == 0 {
		o.Steps = DefaultSteps
	}
	if o.SystemPrompts == 0 {
		o.SystemPrompts = 1
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	rng := rand.New(rand.NewPCG(o.Seed, uint64(o.Size)^0x6167656e74)) // "agent"
	w := &Workload{size: o.Size, sessions: o.Sessions, steps: o.Steps, stream: o.StreamFraction, model: o.Model}

	w.head = append(w.head, `{"model":`...)
	w.head = appendJSONString(w.head, o.Model)
	w.head = append(w.head, `,"stream":`...)
	tools := toolsJSON(rng, o.Size/toolsShare)
	for v := range o.SystemPrompts {
		m := append([]byte(nil), `,"max_tokens":16,"tools":`...)
		m = append(m, tools...)
		m = append(m, `,"messages":[{"role":"system","content":`...)
		sys := "You are coding agent #" + strconv.Itoa(v) + ", an interactive command line tool that helps users with software engineering tasks.\n"
		m = appendJSONString(m, string(prose(rng, []byte(sys), o.Size/systemShare)))
		m = append(m, `},{"role":"user","content":"Session `...)
		w.mid = append(w.mid, m)
	}
	w.task = min(o.Size/taskShare, taskMax)
	w.tasks = prose(rng, nil, max(64<<10, 16*w.task))
	for i := range w.tasks { // JSON-safe: the prose's newlines become spaces
		if w.tasks[i] < ' ' {
			w.tasks[i] = ' '
		}
	}

	mean := max(o.Size/stepShare, minStep)
	// Enough steps that a window as large as a body never wraps onto itself.
	w.off = append(w.off, 0)
	longest := 0
	for k := 0; len(w.pool) < 2*o.Size || k < 4*o.Steps; k++ {
		w.pool = appendStep(w.pool, rng, k, mean/2+rng.IntN(mean+1))
		w.off = append(w.off, len(w.pool))
		longest = max(longest, w.off[k+1]-w.off[k])
	}
	if fixed := w.fixedLen(); fixed+o.Steps*longest > o.Size {
		return nil, fmt.Errorf("agentbody: a body of %d bytes holds no %d steps (up to %d bytes each) after its %d bytes of header", o.Size, o.Steps, longest, fixed)
	}
	return w, nil
}

// fixedLen is the most bytes of a body outside its steps.
func (w *Workload) fixedLen() int {
	m := 0
	for _, x := range w.mid {
		m = max(m, len(x))
	}
	return len(w.head) + len("false") + m + maxSessionDigits + len(taskSep) + w.task + len(taskClose) + len(tail)
}

// Size is the largest body in bytes.
func (w *Workload) Size() int { return w.size }

// Steps is the number of requests of a session.
func (w *Workload) Steps() int { return w.steps }

// Request maps request number i to its session and its step in the session (0 ≤ step <
// Steps): requests go round-robin over Sessions sessions in flight, so that request
// i+Sessions is the next step of request i's session (while step+1 < Steps); a session that
// has sent Steps requests is followed by a new one.
func (w *Workload) Request(i uint64) (session uint64, step int) {
	n, s := uint64(w.sessions), uint64(w.steps)
	slot, round := i%n, i/n
	return round/s*n + slot, int(round % s)
}

// Body appends the body of request number i (any uint64; the same i gives the same body) to
// dst[:0] and returns it, with whether it streams. It allocates only when dst has less
// capacity than Size. A body with step > 0 (Request) is the body of its session's previous
// step, request i − Sessions, with one more step before its closing "]}".
func (w *Workload) Body(dst []byte, i uint64) ([]byte, bool) {
	session, step := w.Request(i)
	h := splitmix.Next(session ^ 0x5e55)
	variant := int(h % uint64(len(w.mid)))
	first := int(h>>16) % (len(w.off) - 1)
	n := w.lastSteps(first) - (w.steps - 1 - step)
	stream := float64(splitmix.Next(session^0x57ea)>>11)/(1<<53) < w.stream // per session, as an agent streams all or none

	dst = append(dst[:0], w.head...)
	dst = strconv.AppendBool(dst, stream)
	dst = append(dst, w.mid[variant]...)
	dst = strconv.AppendUint(dst, session, 10)
	dst = append(dst, taskSep...)
	t := int(h>>40) % (len(w.tasks) - w.task)
	dst = append(dst, w.tasks[t:t+w.task]...)
	dst = append(dst, taskClose...)
	k := len(w.off) - 1
	if end := first + n; end <= k {
		dst = append(dst, w.pool[w.off[first]:w.off[end]]...)
	} else {
		dst = append(dst, w.pool[w.off[first]:]...)
		dst = append(dst, w.pool[:w.off[end-k]]...)
	}
	dst = append(dst, tail...)
	return dst, stream
}

// lastSteps is how many steps, from pool step first on, the last request of a session that
// begins there holds: as many as fit in Size with the rest of its body.
func (w *Workload) lastSteps(first int) int {
	budget := w.size - w.fixedLen()
	k := len(w.off) - 1
	span := func(n int) int { // bytes of n steps from first on
		if end := first + n; end <= k {
			return w.off[end] - w.off[first]
		}
		return w.off[k] - w.off[first] + w.off[first+n-k]
	}
	lo, hi := w.steps, k // span(steps) fits (New checked it); span(k) is the whole pool, 2 × Size
	for lo+1 < hi {
		mid := (lo + hi) / 2
		if span(mid) <= budget {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}
