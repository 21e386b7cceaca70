package health

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/prefixlb/prefixlb/backend"
)

// Outcome is what one proxied attempt to a backend came to, as the proxy saw it.
type Outcome uint8

const (
	// OutcomeOK: the backend answered 1xx–3xx. Resets the consecutive-failure count.
	OutcomeOK Outcome = iota
	// OutcomeConnectError: dial or TLS failure, or the connection broke before a response.
	// Counts toward ejection.
	OutcomeConnectError
	// OutcomeServerError: a 5xx response (except 429, which is 4xx anyway). Counts.
	OutcomeServerError
	// OutcomeClientError: a 4xx response other than 429. The backend is fine and the request
	// is not (context too long, bad JSON): it never counts, and it resets the count, since the
	// server answered sanely. sglang #25811: counting 400s opened the circuit for a whole fleet.
	OutcomeClientError
	// OutcomeBusy: 429. The backend is busy, not dead: it neither counts nor resets.
	OutcomeBusy
	// OutcomeTimeout: no response headers within the header timeout. Counts like a connect
	// error.
	OutcomeTimeout
)

var outcomeNames = [...]string{"ok", "connect-error", "server-error", "client-error", "busy", "timeout"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// Observe records the outcome of one attempt on b; the proxy calls it after each attempt,
// retries included. ConsecutiveFailures counted outcomes in a row eject b (see Options),
// unless that would leave more than MaxEjectedPercent of the backends ejected or unhealthy
// (counting, as panic mode does, only backends that passed an active check once); the count
// then stays where it is and the next counted failure tries again. Failures of a backend
// that is already ejected do not extend its ejection. Unknown backends are ignored.
// Observe is cheap: one lock-free map lookup and an atomic, except when it ejects.
func (c *Checker) Observe(b *backend.Backend, outcome Outcome) {
	if c.o.ConsecutiveFailures < 0 {
		return
	}
	st := c.lookup(b)
	if st == nil {
		return
	}
	switch outcome {
	case OutcomeOK, OutcomeClientError:
		if st.passiveFails.Load() != 0 {
			st.passiveFails.Store(0)
		}
	case OutcomeConnectError, OutcomeServerError, OutcomeTimeout:
		if n := st.passiveFails.Add(1); int(n) >= c.o.ConsecutiveFailures {
			c.eject(st, outcome)
		}
	}
}

// eject takes st out of rotation for BaseEjection × n (capped at MaxEjection), n counting its
// ejections. The count forgets one ejection per MaxEjection the backend stayed in since its
// last return, so a replica that failed once a week is not ejected for 5 minutes each time
// (Envoy decrements its multiplier in the same spirit).
func (c *Checker) eject(st *bstate, last Outcome) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.removed {
		return
	}
	n := int(st.passiveFails.Load())
	if n < c.o.ConsecutiveFailures {
		return // an OK raced in and reset the count
	}
	if !st.ejectedUntil.IsZero() {
		st.passiveFails.Store(0) // already out; traffic it still gets (panic mode) does not extend it
		return
	}
	// The cap counts the backends panic mode counts: one that never passed an active check
	// (a new replica loading its model) is neither up nor down yet.
	counted, healthy := c.tallyLocked(st)
	down := counted - 1 - healthy // st itself is counted, and not yet down
	if (down+1)*allPercent > c.o.MaxEjectedPercent*counted {
		if !st.capLogged {
			st.capLogged = true
			c.log.Warn("backend failing but not ejected: max ejected percent reached",
				zap.String("backend", st.b.Name), zap.Int("consecutive_failures", n),
				zap.Int("unhealthy_or_ejected", down), zap.Int("backends", counted),
				zap.Int("max_ejected_percent", c.o.MaxEjectedPercent))
		}
		return
	}
	if !st.lastReturn.IsZero() && st.ejections > 0 {
		st.ejections -= int(now.Sub(st.lastReturn) / c.o.MaxEjection)
		if st.ejections < 0 {
			st.ejections = 0
		}
	}
	st.ejections++
	length := c.ejectionTime(st.ejections)
	st.ejectedUntil = now.Add(length)
	st.passiveFails.Store(0)
	st.capLogged = false
	fields := []zap.Field{zap.Int("consecutive_failures", n), zap.Stringer("last_outcome", last),
		zap.Int("ejection", st.ejections), zap.Duration("duration", length)}
	if !c.applyLocked(st, "ejected", fields...) {
		// Already down by active checks; the ejection still keeps it out for length.
		c.log.Warn("unhealthy backend ejected", append([]zap.Field{zap.String("backend", st.b.Name)}, fields...)...)
	}
}

// ejectionTime is BaseEjection × n, capped at MaxEjection.
func (c *Checker) ejectionTime(n int) time.Duration {
	if n <= 0 {
		n = 1
	}
	if time.Duration(n) > c.o.MaxEjection/c.o.BaseEjection {
		return c.o.MaxEjection
	}
	return min(c.o.BaseEjection*time.Duration(n), c.o.MaxEjection)
}

// tick ends the ejections whose time is up. An ejected backend returns as soon as its
// ejection ends, provided its active verdict is healthy: active checks keep running during
// the ejection, so a replica that died meanwhile has already failed Fall checks and must pass
// Rise again; one that kept passing returns at once (another Rise passes would only prove
// what the checks already showed). A passing check does not end an ejection early, unlike
// Envoy: an LLM server's /health stays green while generation fails (production-stack #1091).
func (c *Checker) tick() {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.order {
		if st.ejectedUntil.IsZero() || now.Before(st.ejectedUntil) {
			continue
		}
		st.ejectedUntil = time.Time{}
		st.lastReturn = now
		st.passiveFails.Store(0)
		if !c.applyLocked(st, "ejection ended") {
			c.log.Info("ejection ended, backend still failing active checks",
				zap.String("backend", st.b.Name), zap.String("last_error", st.lastCheckErr))
		}
	}
}
