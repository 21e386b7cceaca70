package proxy

// The rate limit of log lines that a client can make repeat: a panic's stack (recover.go) and
// a local resource error (localres.go) log in full once per interval per site; the others
// are counted into the next full line.

import (
	"sync"
	"time"
)

// maxPanicSites bounds the sites logLimiter tracks apart (sites are places in the code, a
// few; past the bound the new ones share one entry).
const maxPanicSites = 64

// logLimiter decides which of a site's events log in full: the first, and the first after
// each every since the last one logged; panics' stacks (panicStackEvery per site) and local
// resource errors (localLogEvery per kind) share it.
type logLimiter struct {
	now   func() time.Time // time.Now; a test's clock
	every time.Duration
	mu    sync.Mutex
	sites map[string]*panicSiteState
}

// panicSiteState is a site's last event logged and the events left out since.
type panicSiteState struct {
	logged     time.Time
	suppressed int
}

func newLogLimiter(now func() time.Time, every time.Duration) *logLimiter {
	return &logLimiter{now: now, every: every, sites: map[string]*panicSiteState{}}
}

// newPanicLimiter is the limiter of panics' stacks: one per panicStackEvery per site.
func newPanicLimiter(now func() time.Time) *logLimiter { return newLogLimiter(now, panicStackEvery) }

// allow reports whether an event at site logs in full, and the site's events left out: when
// it does, those since the last one; otherwise, those since the last one, this one counted.
func (l *logLimiter) allow(site string) (full bool, suppressed int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.sites[site]
	if st == nil {
		if len(l.sites) >= maxPanicSites {
			site = "" // the shared entry of the sites past the bound
			st = l.sites[site]
		}
		if st == nil {
			l.sites[site] = &panicSiteState{logged: now}
			return true, 0
		}
	}
	if now.Sub(st.logged) >= l.every {
		n := st.suppressed
		*st = panicSiteState{logged: now}
		return true, n
	}
	st.suppressed++
	return false, st.suppressed
}

// size is the number of sites tracked.
func (l *logLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sites)
}
