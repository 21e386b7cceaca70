package health

import "time"

// logLimit lets a repeating warning about one backend through at most once per period (the
// Checker's clock), and counts what it held back meanwhile, so that a backend that keeps
// tripping it (a start time that changes every scrape, a model list that keeps an over-long
// id) costs a log line a period instead of one per scrape or read. Its owner serialises it.
type logLimit struct {
	last time.Time // when a warning last went through (zero: never)
	held int       // warnings held back since
}

// allow reports whether a warning at now goes through and, if so, how many were held back
// since the last one that did.
func (l *logLimit) allow(now time.Time, every time.Duration) (ok bool, held int) {
	if !l.last.IsZero() && now.Sub(l.last) < every {
		l.held++
		return false, 0
	}
	held, l.last, l.held = l.held, now, 0
	return true, held
}
