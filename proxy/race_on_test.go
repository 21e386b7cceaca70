//go:build race

package proxy

// raceEnabled: the race detector keeps shadow memory for every heap page the process
// touched, so VmRSS does not return to its baseline when the heap is given back.
const raceEnabled = true
