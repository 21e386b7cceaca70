// State: a backend's health as /debug/backends shows it.

package health

import (
	"time"

	"github.com/prefixlb/prefixlb/backend"
)

// State is a backend's health as shown by /debug/backends.
type State struct {
	Name string `json:"name"`
	// Healthy is the backend's flag as the proxy sees it (backend.Healthy).
	Healthy bool `json:"healthy"`
	// ActiveHealthy is the active-check verdict (true when active checks are disabled).
	ActiveHealthy bool `json:"active_healthy"`
	// NeverPassed is true until the backend's first passing active check: it takes no
	// traffic, not even in panic mode (backend.NeverPassed).
	NeverPassed bool `json:"never_passed"`
	// ConsecutivePasses and ConsecutiveFails count the latest run of active-check results.
	ConsecutivePasses int `json:"consecutive_passes"`
	ConsecutiveFails  int `json:"consecutive_fails"`
	// PassiveFailures counts consecutive failed attempts reported by Observe.
	PassiveFailures int `json:"passive_failures"`
	// Ejections is the ejection count that sets the length of the next ejection.
	Ejections int `json:"ejections"`
	// EjectedUntil is when the current ejection ends (zero: not ejected).
	EjectedUntil time.Time `json:"ejected_until,omitzero"`
	// LastCheck is when the last active check finished; LastCheckError its error, if any.
	LastCheck      time.Time `json:"last_check,omitzero"`
	LastCheckError string    `json:"last_check_error,omitempty"`
	// LastScrape is when the last scrape was attempted; LastScrapeError its error, if any.
	LastScrape      time.Time `json:"last_scrape,omitzero"`
	LastScrapeError string    `json:"last_scrape_error,omitempty"`
	// ScrapeErrors counts the scrapes that failed (an error status, a body that did not parse
	// or end within the size cap or the timeout): their values were discarded.
	ScrapeErrors uint64 `json:"scrape_errors"`
	// Load is the last successfully scraped load; LoadFresh as Checker.Load reports it.
	Load      Load `json:"load"`
	LoadFresh bool `json:"load_fresh"`
	// CacheEpoch is the backend's cache epoch (backend.Epoch).
	CacheEpoch uint64 `json:"cache_epoch"`
	// Tracked is false for a backend the Checker does not know; the other fields are then zero.
	Tracked bool `json:"tracked"`
}

// State returns b's health state for debugging.
func (c *Checker) State(b *backend.Backend) State {
	st := c.lookup(b)
	if st == nil {
		return State{Name: b.Name, Healthy: b.Healthy(), CacheEpoch: b.Epoch()}
	}
	s := State{Name: b.Name, Tracked: true, PassiveFailures: int(st.passiveFails.Load())}
	c.mu.Lock()
	s.Healthy = b.Healthy()
	s.ActiveHealthy = st.activeOK
	s.NeverPassed = !c.o.Disabled && !st.everPassed
	s.ConsecutivePasses, s.ConsecutiveFails = st.passes, st.fails
	s.Ejections = st.ejections
	s.EjectedUntil = st.ejectedUntil
	s.LastCheck, s.LastCheckError = st.lastCheck, st.lastCheckErr
	c.mu.Unlock()
	s.CacheEpoch = b.Epoch()
	if r := st.scrape.Load(); r != nil {
		s.LastScrape, s.LastScrapeError = r.attempt, r.err
		s.ScrapeErrors = st.scrapeErrors.Load()
		s.Load = r.load
		s.LoadFresh = c.fresh(r)
	}
	return s
}
