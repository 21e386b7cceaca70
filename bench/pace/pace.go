// Package pace sleeps until an instant with sub-millisecond precision, for the bench's
// simulated replicas (their engine steps) and its load generator (open-loop arrivals).
//
// Why: a Go timer shorter than a millisecond, in a process with nothing else to run, fires
// after at least 1 ms (the runtime's netpoller waits in whole milliseconds: runtime's
// netpoll_epoll.go rounds a shorter wait up to 1 ms). At --speedup 8 a 0.2 ms wall-clock step
// would then end several ms of model time late, so a simulated TTFT of a few ms would be
// mostly the timer's granularity, and tokens would come in bursts. On Linux a Sleeper reads a
// timerfd through the netpoller, which the kernel's high-resolution timer wakes within about
// a tenth of a millisecond. Elsewhere it is a Go timer.
package pace

import "time"

// preciseBelow is the longest wait left to the timerfd: longer waits sleep on a Go timer until
// preciseBelow before the instant, so that quit interrupts them, and the timerfd sleeps the
// rest (not interruptible, at most preciseBelow).
const preciseBelow = 2 * time.Millisecond

// Sleeper waits for instants, one at a time: one per goroutine, not safe for concurrent use.
// The zero value is not usable; call New.
type Sleeper struct {
	tm *time.Timer
	p  *pacer // nil: Go timers alone
}

// New returns a Sleeper; Close releases its timerfd.
func New() *Sleeper {
	tm := time.NewTimer(time.Hour)
	tm.Stop()
	return &Sleeper{tm: tm, p: newPacer()}
}

// Close releases the Sleeper's resources.
func (s *Sleeper) Close() {
	s.tm.Stop()
	s.p.close()
}

// Until waits until wall time at, or until quit is closed; it reports false when quit is
// closed (checked last, so an instant in the past with quit closed is false too).
func (s *Sleeper) Until(at time.Time, quit <-chan struct{}) bool {
	wait := time.Until(at)
	if s.p != nil {
		wait -= preciseBelow
	}
	if wait > 0 {
		s.tm.Reset(wait)
		select {
		case <-s.tm.C:
		case <-quit:
			s.tm.Stop()
			return false
		}
	}
	if s.p != nil {
		if rest := time.Until(at); rest > 0 {
			s.p.sleep(rest)
		}
	}
	select {
	case <-quit:
		return false
	default:
		return true
	}
}
