package router

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/backend"
	"github.com/prefixlb/prefixlb/router/key"
)

// scriptedSettler is a Settler that logs each call with the stamps it gets: Learn and Hold
// return the next stamp (1, 2, …) or 0 when nothing (learns nothing), Release says again
// when contended, SettleWait asks for wait.
type scriptedSettler struct {
	fullPolicy
	nothing   bool
	contended bool
	wait      time.Duration
	next      Learned
	log       []string
}

func (p *scriptedSettler) stamp() Learned {
	if p.nothing {
		return 0
	}
	p.next++
	return p.next
}

func (p *scriptedSettler) Learn(_ *key.Key, b *backend.Backend, held int) Learned {
	l := p.stamp()
	p.log = append(p.log, fmt.Sprintf("Learn(%s,%d)=%d", b.Name, held, l))
	return l
}

func (p *scriptedSettler) Unlearn(_ *key.Key, b *backend.Backend, l Learned) {
	p.log = append(p.log, fmt.Sprintf("Unlearn(%s,%d)", b.Name, l))
}

func (p *scriptedSettler) Correct(_ *key.Key, b *backend.Backend, l Learned, r CacheReport) int {
	p.log = append(p.log, fmt.Sprintf("Correct(%s,%d,held %d,%d/%d)", b.Name, l, r.MatchedChunks, r.ReportedCached, r.ReportedPrompt))
	return 1
}

func (p *scriptedSettler) SettleWait(*key.Key, Decision) time.Duration {
	p.log = append(p.log, "SettleWait")
	return p.wait
}

func (p *scriptedSettler) Hold(_ *key.Key, d Decision) Learned {
	l := p.stamp()
	p.log = append(p.log, fmt.Sprintf("Hold(%s,%d)=%d", d.Backend.Name, d.MatchedChunks, l))
	return l
}

func (p *scriptedSettler) Release(_ *key.Key, d Decision, l Learned, _ time.Time) bool {
	p.log = append(p.log, fmt.Sprintf("Release(%s,%d)=%v", d.Backend.Name, l, p.contended))
	return p.contended
}

func (p *scriptedSettler) Abandon(_ *key.Key, b *backend.Backend, l Learned) {
	p.log = append(p.log, fmt.Sprintf("Abandon(%s,%d)", b.Name, l))
}

func (p *scriptedSettler) Prefilled(_ *key.Key, b *backend.Backend, l Learned) {
	p.log = append(p.log, fmt.Sprintf("Prefilled(%s,%d)", b.Name, l))
}

func (p *scriptedSettler) Finished(_ *key.Key, b *backend.Backend, l Learned) {
	p.log = append(p.log, fmt.Sprintf("Finished(%s,%d)", b.Name, l))
}

// justLearner is a Learner that does not settle.
type justLearner struct{ s *scriptedSettler }

func (p justLearner) Pick(*key.Key, []*backend.Backend) Decision    { return Decision{} }
func (p justLearner) Preview(*key.Key, []*backend.Backend) Decision { return Decision{} }
func (p justLearner) Learn(k *key.Key, b *backend.Backend, held int) Learned {
	return p.s.Learn(k, b, held)
}
func (p justLearner) Unlearn(k *key.Key, b *backend.Backend, l Learned) { p.s.Unlearn(k, b, l) }
func (p justLearner) Correct(k *key.Key, b *backend.Backend, l Learned, r CacheReport) int {
	return p.s.Correct(k, b, l, r)
}

// TestTicket: each transition of the learning ticket, from each state it may find, makes the
// policy calls of that transition once, with the stamp the ticket owns, and lands in its
// state; a transition called again, or from a state it does not leave, does nothing.
// Steps: send (on backend a, 3 chunks held), retry (send on b, 0 held), wait (SettleWait),
// hold (decided on a, 3 chunks held), release, refuse, report (100 prompt, 40 cached), first (the
// first token arrived), done.
func TestTicket(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy string // settler, learner (does not settle), none (learns nothing), unparsed
		script func(*scriptedSettler)
		steps  string
		state  TicketState
		stands bool
		calls  string
	}{
		{"issued", "settler", nil, "", TicketOpen, false, ""},
		{"send learns", "settler", nil, "send", TicketSent, true, "Learn(a,3)=1"},
		{"send twice learns once", "settler", nil, "send send", TicketSent, true, "Learn(a,3)=1"},
		{"refuse unlearns its stamp once", "settler", nil, "send refuse refuse", TicketRefused, false,
			"Learn(a,3)=1 Unlearn(a,1)"},
		{"a retry after a refusal learns again", "settler", nil, "send refuse retry", TicketSent, true,
			"Learn(a,3)=1 Unlearn(a,1) Learn(b,0)=2"},
		{"the retry's refusal unlearns the retry's stamp", "settler", nil, "send refuse retry refuse", TicketRefused, false,
			"Learn(a,3)=1 Unlearn(a,1) Learn(b,0)=2 Unlearn(b,2)"},
		{"refuse before a send does nothing", "settler", nil, "refuse", TicketOpen, false, ""},
		{"report corrects once", "settler", nil, "send report report", TicketReported, true,
			"Learn(a,3)=1 Correct(a,1,held 3,40/100)"},
		{"a refusal after the report does nothing", "settler", nil, "send report refuse", TicketReported, true,
			"Learn(a,3)=1 Correct(a,1,held 3,40/100)"},
		{"a report after a refusal does nothing", "settler", nil, "send refuse report", TicketRefused, false,
			"Learn(a,3)=1 Unlearn(a,1)"},
		{"report before a send does nothing", "settler", nil, "report", TicketOpen, false, ""},
		{"hold", "settler", nil, "wait hold", TicketHeld, true, "SettleWait Hold(a,3)=1"},
		{"hold twice holds once", "settler", nil, "hold hold", TicketHeld, true, "Hold(a,3)=1"},
		{"no wait once held", "settler", nil, "hold wait", TicketHeld, true, "Hold(a,3)=1"},
		{"release sends", "settler", nil, "hold release", TicketSent, true, "Hold(a,3)=1 Release(a,1)=false"},
		{"released: the send learns nothing more", "settler", nil, "hold release send release", TicketSent, true,
			"Hold(a,3)=1 Release(a,1)=false"},
		{"released, refused: unlearned as a Learn", "settler", nil, "hold release send refuse", TicketRefused, false,
			"Hold(a,3)=1 Release(a,1)=false Unlearn(a,1)"},
		{"released, reported", "settler", nil, "hold release send report", TicketReported, true,
			"Hold(a,3)=1 Release(a,1)=false Correct(a,1,held 3,40/100)"},
		{"contended: refused, held again", "settler", func(p *scriptedSettler) { p.contended = true },
			"hold release release wait hold", TicketHeld, true,
			"Hold(a,3)=1 Release(a,1)=true SettleWait Hold(a,3)=2"},
		{"contended: refusing again does nothing", "settler", func(p *scriptedSettler) { p.contended = true },
			"hold release refuse", TicketRefused, false, "Hold(a,3)=1 Release(a,1)=true"},
		{"refused while held: abandoned, not unlearned", "settler", nil, "hold refuse refuse send", TicketSent, true,
			"Hold(a,3)=1 Abandon(a,1) Learn(a,3)=2"},
		{"release without a hold does nothing", "settler", nil, "release send release", TicketSent, true, "Learn(a,3)=1"},
		{"no hold once sent", "settler", nil, "send wait hold", TicketSent, true, "Learn(a,3)=1"},
		{"a hold of nothing: sent and learned once written", "settler", func(p *scriptedSettler) { p.nothing = true },
			"hold release send", TicketSent, false, "Hold(a,3)=0 Learn(a,3)=0"},
		{"a Learn of nothing is neither unlearned nor reported", "settler", func(p *scriptedSettler) { p.nothing = true },
			"send report refuse", TicketRefused, false, "Learn(a,3)=0"},
		{"done: nothing moves it", "settler", nil, "send done refuse report send", TicketDone, false, "Learn(a,3)=1 Finished(a,1)"},
		{"tracked: the first token once, the end once", "settler", nil, "send first first report done done", TicketDone, false,
			"Learn(a,3)=1 Prefilled(a,1) Correct(a,1,held 3,40/100) Finished(a,1)"},
		{"tracked: a refused request has ended, nothing after", "settler", nil, "send refuse first done", TicketDone, false,
			"Learn(a,3)=1 Unlearn(a,1)"},
		{"tracked: a retry is followed anew", "settler", nil, "send first refuse retry first done", TicketDone, false,
			"Learn(a,3)=1 Prefilled(a,1) Unlearn(a,1) Learn(b,0)=2 Prefilled(b,2) Finished(b,2)"},
		{"a learner that does not settle: no wait, no hold", "learner", nil, "wait hold send refuse", TicketRefused, false,
			"Learn(a,3)=1 Unlearn(a,1)"},
		{"a policy that learns nothing: the states alone", "none", nil, "wait hold send report refuse retry", TicketSent, false, ""},
		{"an unparsed key: the states alone", "unparsed", nil, "wait hold send report", TicketSent, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := prefixBackends(t, 2)
			bs[0].Name, bs[1].Name = "a", "b"
			s := &scriptedSettler{wait: time.Second}
			if tc.script != nil {
				tc.script(s)
			}
			var p Policy = s
			k := routedKey(chunkChain(nil).extend("ticket", 4))
			switch tc.policy {
			case "learner":
				p = justLearner{s}
			case "none":
				p = &RoundRobin{}
			case "unparsed":
				k.OK = false
			}
			tk := NewDecider(p).Ticket(k)
			dec := Decision{Backend: bs[0], MatchedChunks: 3}
			for _, step := range strings.Fields(tc.steps) {
				switch step {
				case "send":
					tk.Send(bs[0], 3)
				case "retry":
					tk.Send(bs[1], 0)
				case "wait":
					if w := tk.SettleWait(dec); w != 0 && w != s.wait {
						t.Errorf("SettleWait %v, want the policy's %v", w, s.wait)
					}
				case "hold":
					tk.Hold(dec)
				case "release":
					tk.Release(time.Unix(1, 0))
				case "refuse":
					tk.Refuse()
				case "report":
					tk.Report(100, 40)
				case "first":
					tk.FirstToken()
				case "done":
					tk.Done()
				default:
					t.Fatalf("step %q", step)
				}
			}
			if got := strings.Join(s.log, " "); got != tc.calls {
				t.Errorf("after %q the policy saw\n  %s\nwant\n  %s", tc.steps, got, tc.calls)
			}
			if tk.State() != tc.state || tk.Stands() != tc.stands {
				t.Errorf("after %q: %s, stands %v; want %s, stands %v", tc.steps, tk.State(), tk.Stands(), tc.state, tc.stands)
			}
		})
	}
}

// TestTicketAnswers: SettleWait is the policy's while the ticket may be held, Hold says
// whether anything was held, Release whether the request is to be decided again, Report the
// entries the policy dropped.
func TestTicketAnswers(t *testing.T) {
	bs := prefixBackends(t, 1)
	k := routedKey(chunkChain(nil).extend("ticket", 4))
	dec := Decision{Backend: bs[0]}
	s := &scriptedSettler{wait: 3 * time.Millisecond, contended: true}
	tk := NewDecider(s).Ticket(k)
	if w := tk.SettleWait(dec); w != s.wait {
		t.Errorf("SettleWait %v, want %v", w, s.wait)
	}
	if !tk.Hold(dec) || tk.Hold(dec) {
		t.Error("Hold: want true, then false (held already)")
	}
	if !tk.Release(time.Unix(1, 0)) || tk.Release(time.Unix(1, 0)) {
		t.Error("contended Release: want again, then false (not held)")
	}
	tk.Send(bs[0], 0)
	if n := tk.Report(10, 0); n != 1 {
		t.Errorf("Report: %d dropped, want the policy's 1", n)
	}
	if n := tk.Report(10, 0); n != 0 {
		t.Errorf("a second Report: %d dropped, want 0", n)
	}
	s.nothing = true
	tk = NewDecider(s).Ticket(k)
	if tk.Hold(dec) {
		t.Error("a Hold that learned nothing: held")
	}
	var zero Ticket
	zero.Send(bs[0], 0)
	zero.Refuse()
	if zero.Learns() || zero.Stands() || zero.Report(10, 0) != 0 {
		t.Error("the zero ticket learns")
	}
}

// panickyTracker is a scriptedSettler whose Finished panics after logging.
type panickyTracker struct{ scriptedSettler }

func (p *panickyTracker) Finished(k *key.Key, b *backend.Backend, l Learned) {
	p.scriptedSettler.Finished(k, b, l)
	panic("tracker bug")
}

// TestTicketDoneOnceWhenFinishedPanics: a Tracker's Finished that panics has still ended the
// ticket, so that the Done of the proxy's panic recovery (flow.abandon) does not call it
// again, from inside the recovery, where a second panic would end the process.
func TestTicketDoneOnceWhenFinishedPanics(t *testing.T) {
	bs := prefixBackends(t, 1)
	bs[0].Name = "a"
	p := &panickyTracker{}
	tk := NewDecider(p).Ticket(routedKey(chunkChain(nil).extend("ticket", 4)))
	tk.Send(bs[0], 0)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Finished did not panic")
			}
		}()
		tk.Done()
	}()
	tk.Done()
	if got := strings.Join(p.log, " "); got != "Learn(a,0)=1 Finished(a,1)" || tk.State() != TicketDone {
		t.Errorf("the policy saw %s, ticket %s; want Finished once, done", got, tk.State())
	}
}
