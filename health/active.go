// Active checks: GET Options.Path on every backend; Rise passes or Fall failures in a row
// change the active verdict.

package health

import (
	"context"

	"go.uber.org/zap"
)

// CheckOnce runs one active check of every tracked backend, concurrently, records the
// results and then ends expired ejections. It returns when all checks are done or ctx ends.
// The loops Start runs do the same per backend on the Interval; tests and startup code may
// call it directly. It does nothing after Close and, when active checks are Disabled, only
// ends ejections.
func (c *Checker) CheckOnce(ctx context.Context) {
	if !c.o.Disabled {
		c.each(ctx, c.checkOne)
	}
	c.tick()
}

// maxRun caps the counts of consecutive passes and failures, far above any threshold.
const maxRun = 1 << 30

// checkOne runs one active check of st and records it.
func (c *Checker) checkOne(ctx context.Context, st *bstate) {
	err := c.get(ctx, st.checkURL, nil)
	if ctx.Err() != nil {
		return // shutting down or removed: the failure says nothing about the backend
	}
	c.recordCheck(st, err)
}

// recordCheck applies one active-check result: Rise passes in a row turn the verdict
// healthy, Fall failures in a row unhealthy.
func (c *Checker) recordCheck(st *bstate, err error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.removed {
		return
	}
	st.lastCheck = now
	if err == nil {
		st.lastCheckErr = ""
		st.fails = 0
		if st.passes < maxRun {
			st.passes++
		}
		// A backend that never passed needs one pass (Envoy marks a host healthy on its first
		// pass at start-up): every start of prefixlb, or a new pod from discovery, would
		// otherwise route in panic mode for Interval × (Rise − 1). A backend that was up and
		// went down needs Rise passes.
		need := c.o.Rise
		if !st.everPassed {
			need = 1
		}
		if !st.activeOK && st.passes >= need {
			st.everPassed = true
			st.b.SetNeverPassed(false)
			st.activeOK = true
			if !c.applyLocked(st, "active checks passing") {
				c.log.Info("active checks passing, backend still ejected",
					zap.String("backend", st.b.Name), zap.Time("ejected_until", st.ejectedUntil))
			}
		}
		return
	}
	st.lastCheckErr = err.Error()
	st.passes = 0
	if st.fails < maxRun {
		st.fails++
	}
	if st.activeOK && st.fails >= c.o.Fall {
		st.activeOK = false
		c.applyLocked(st, "active checks failing")
	}
}
