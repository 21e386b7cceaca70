package loadgen

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixlb/prefixlb/bench/pace"
	"github.com/prefixlb/prefixlb/bench/workload"
)

// Options control one run.
type Options struct {
	Client *Client
	// Speedup divides think times and arrival offsets, to pair with a simulator running K×
	// faster than real time (1 or 0: real time).
	Speedup float64
	// RequestTimeout bounds one request, stream included (0: 10 minutes).
	RequestTimeout time.Duration
	// OnResult, if set, is called after every request (from several goroutines).
	OnResult func(Result)
}

// Outcome is everything measured in one run.
type Outcome struct {
	Results []Result
	// Schedule is the open-loop arrival schedule as sent: each conversation in the order it
	// was started, with its arrival offset from Start (scaled by Speedup). Empty in closed loop.
	Schedule []Arrival
	// Start is when the run began (the origin of open-loop arrival offsets); End is when the
	// last request finished.
	Start, End time.Time
}

// Arrival is one open-loop conversation start: its ID and due offset from Outcome.Start.
type Arrival struct {
	Conversation int
	At           time.Duration
}

// Duration is the run's wall time.
func (o *Outcome) Duration() time.Duration { return o.End.Sub(o.Start) }

type runner struct {
	w     *workload.Workload
	opt   Options
	mu    sync.Mutex
	out   Outcome
	scale float64
}

// Run sends w through opt.Client and returns the measurements. It returns early with what it
// has when ctx ends.
func Run(ctx context.Context, w *workload.Workload, opt Options) (*Outcome, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if opt.Client == nil {
		return nil, errors.New("loadgen: no client")
	}
	if opt.RequestTimeout <= 0 {
		opt.RequestTimeout = 10 * time.Minute
	}
	scale := 1.0
	if opt.Speedup > 0 {
		scale = 1 / opt.Speedup
	}
	r := &runner{w: w, opt: opt, scale: scale}
	r.out.Results = make([]Result, 0, w.Requests())
	r.out.Start = time.Now()
	switch w.Loop {
	case workload.Closed:
		r.closed(ctx)
	default:
		r.open(ctx)
	}
	r.out.End = time.Now()
	return &r.out, ctx.Err()
}

func (r *runner) scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * r.scale) }

// convState is the client side of one conversation: the messages sent and received so far.
type convState struct {
	c       *workload.Conversation
	next    int
	history []workload.Message
	// sent is how many messages of history the last request carried; replied is whether the
	// message after them is that request's reply.
	sent    int
	replied bool
}

func newConvState(c *workload.Conversation) *convState {
	s := &convState{c: c}
	if c.System != "" {
		s.history = append(s.history, workload.Message{Role: "system", Content: c.System})
	}
	return s
}

// turn sends the conversation's next turn, due at scheduled, and records the reply.
func (r *runner) turn(ctx context.Context, s *convState, scheduled time.Time) {
	t := &s.c.Turns[s.next]
	user := t.Text()
	req := Request{API: r.w.API, MaxTokens: t.MaxTokens}
	if r.w.API == workload.Completions {
		req.Prompt = user
		if s.c.System != "" {
			req.Prompt = s.c.System + "\n\n" + user
		}
	} else {
		if t.ToolCall != nil {
			s.addToolTurn(t)
		}
		if t.ToolCall == nil || user != "" {
			s.history = append(s.history, workload.Message{Role: "user", Content: user})
		}
		req.Messages, req.Tools = s.history, s.c.Tools
		s.sent, s.replied = len(s.history), false
	}
	if tn := s.c.Tenant; tn != nil {
		req.Headers = tn.Headers()
		req.Patience = r.scaled(tn.Patience)
	}
	rctx, cancel := context.WithTimeout(ctx, r.opt.RequestTimeout)
	res := r.opt.Client.Do(rctx, req, scheduled)
	cancel()
	res.Conversation, res.Turn = s.c.ID, s.next
	if tn := s.c.Tenant; tn != nil {
		res.Tenant = tn.Name
	}
	if r.w.API != workload.Completions && res.Reply != "" {
		s.history = append(s.history, workload.Message{Role: "assistant", Content: res.Reply})
		s.replied = true
	}
	res.Reply = "" // the history holds it; results stay small
	s.next++
	r.mu.Lock()
	r.out.Results = append(r.out.Results, res)
	r.mu.Unlock()
	if r.opt.OnResult != nil {
		r.opt.OnResult(res)
	}
}

// addToolTurn appends what an agent sends after its tool ran: the previous reply gets the
// turn's tool call (an assistant message with empty content stands in for a reply that failed),
// and a "tool" message answers it with the turn's tool result.
func (s *convState) addToolTurn(t *workload.Turn) {
	calls := []workload.ToolCall{*t.ToolCall}
	if s.replied {
		s.history[len(s.history)-1].ToolCalls = calls
	} else {
		s.history = append(s.history, workload.Message{Role: "assistant", ToolCalls: calls})
	}
	s.history = append(s.history, workload.Message{Role: "tool", ToolCallID: t.ToolCall.ID,
		Content: t.ToolResultText()})
	s.replied = false
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// closed runs Users workers over a FIFO of conversations: take one, wait its turn's think
// time, send the turn, put it back at the end if it has turns left. A conversation is never in
// flight twice.
func (r *runner) closed(ctx context.Context) {
	n := len(r.w.Conversations)
	queue := make(chan *convState, n) // never more than n conversations exist: sends never block
	for _, c := range r.w.Conversations {
		queue <- newConvState(c)
	}
	var left atomic.Int64 // conversations with turns still to send
	left.Store(int64(n))
	var workers sync.WaitGroup
	for u := 0; u < r.w.Users; u++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				var s *convState
				var ok bool
				select {
				case s, ok = <-queue:
				case <-ctx.Done():
					return
				}
				if !ok {
					return
				}
				if !sleep(ctx, r.scaled(s.c.Turns[s.next].Think)) {
					return
				}
				r.turn(ctx, s, time.Now())
				if s.next < len(s.c.Turns) {
					queue <- s
				} else if left.Add(-1) == 0 {
					close(queue) // the last conversation is done: every worker's receive ends
				}
			}
		}()
	}
	workers.Wait()
}

// open starts each top-level conversation at Start + At (scaled), however many are
// outstanding; later turns follow the reply after their think time. A sub-agent (Fork) starts
// after its parent's turn Fork.After has its reply, with a copy of the messages that turn sent,
// and the parent's next turn waits until every sub-agent forked there has finished.
func (r *runner) open(ctx context.Context) {
	forks := map[int]map[int][]*workload.Conversation{} // parent ID → parent turn → sub-agents
	for _, c := range r.w.Conversations {
		if f := c.Fork; f != nil {
			if forks[f.Parent] == nil {
				forks[f.Parent] = map[int][]*workload.Conversation{}
			}
			forks[f.Parent][f.After] = append(forks[f.Parent][f.After], c)
		}
	}
	var wg sync.WaitGroup
	// Arrivals a fraction of a millisecond apart (--speedup 8 at hundreds of requests/s) keep
	// their gaps: bench/pace, not a Go timer's millisecond granularity.
	sleeper := pace.New()
	defer sleeper.Close()
	for _, c := range r.w.Conversations {
		if c.Fork != nil {
			continue
		}
		at := r.scaled(c.At)
		due := r.out.Start.Add(at)
		if !sleeper.Until(due, ctx.Done()) {
			break
		}
		r.out.Schedule = append(r.out.Schedule, Arrival{Conversation: c.ID, At: at})
		wg.Add(1)
		go func(s *convState, due time.Time) {
			defer wg.Done()
			r.session(ctx, s, due, forks[s.c.ID])
		}(newConvState(c), due)
	}
	wg.Wait()
}

// session sends s's turns, the first due at first, each later one after its think time; after
// turn k it runs the sub-agents forked there (kids[k]) and waits for them.
func (r *runner) session(ctx context.Context, s *convState, first time.Time, kids map[int][]*workload.Conversation) {
	r.turn(ctx, s, first)
	for {
		if sub := kids[s.next-1]; len(sub) > 0 {
			var wg sync.WaitGroup
			for _, c := range sub {
				k := &convState{c: c, history: append([]workload.Message(nil), s.history[:s.sent]...)}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if sleep(ctx, r.scaled(c.Turns[0].Think)) {
						r.session(ctx, k, time.Now(), nil)
					}
				}()
			}
			wg.Wait()
		}
		if s.next >= len(s.c.Turns) || !sleep(ctx, r.scaled(s.c.Turns[s.next].Think)) {
			return
		}
		r.turn(ctx, s, time.Now())
	}
}
