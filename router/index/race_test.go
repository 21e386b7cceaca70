//go:build race

package index

// raceEnabled is true when the race detector is on: single-goroutine measurements that it
// only slows down are skipped.
const raceEnabled = true
