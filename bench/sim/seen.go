package sim

import "sync/atomic"

// seenPaths are the paths whose requests a Replica counts (Replica.Seen); every other path
// counts under seenOther.
var seenPaths = [...]string{"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"}

// seenOther is Seen's key for paths not in seenPaths.
const seenOther = "other"

// seenCounters counts the HTTP requests a replica received, per path, whatever their
// outcome (a 404 for an unknown model, a 400, a 405 included).
type seenCounters struct {
	paths [len(seenPaths) + 1]atomic.Uint64
}

func (c *seenCounters) count(path string) {
	for i, p := range seenPaths {
		if p == path {
			c.paths[i].Add(1)
			return
		}
	}
	c.paths[len(seenPaths)].Add(1)
}

// Seen is how many HTTP requests the replica received on path (one of /v1/chat/completions,
// /v1/completions, /v1/models, /health, /metrics; "other" for the rest), whatever their
// outcome: tests read it to prove that a request never reached the replica.
func (r *Replica) Seen(path string) uint64 {
	for i, p := range seenPaths {
		if p == path {
			return r.seen.paths[i].Load()
		}
	}
	return r.seen.paths[len(seenPaths)].Load()
}
