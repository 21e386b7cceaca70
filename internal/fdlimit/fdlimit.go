// Package fdlimit reads and raises the process's open-file limit (RLIMIT_NOFILE), the number
// of file descriptors (sockets among them) it may hold at once.
//
// prefixlb raises the soft limit to the hard limit at start, as Envoy and HAProxy do: every
// proxied stream holds two descriptors (the client's connection and the backend's), and a
// soft limit left at the common default of 1024 caps a replica at a few hundred streams
// whatever the hard limit allows. (Go's runtime raises it too, from Go 1.19 on, for programs
// that import os; the explicit raise states the intent and reports the limit in force.)
package fdlimit

// Limit is an open-file limit: Soft is the one enforced, Hard the most Soft may be raised to.
// Unknown is true where the platform has no such limit (Soft and Hard are then 0).
type Limit struct {
	Soft, Hard uint64
	Unknown    bool
}

// Current returns the process's open-file limit.
func Current() (Limit, error) { return current() }

// Raise sets the soft open-file limit to the hard limit and returns the limit before and after.
// When the hard limit cannot be taken whole (macOS refuses a soft limit above OPEN_MAX with
// the hard limit unlimited), the soft limit is left as it was and err says why.
func Raise() (before, after Limit, err error) { return raise() }
