//go:build race

package flowcontrol

// raceEnabled: the race detector instruments channel and map operations, so allocation
// counts are not the production ones under -race.
const raceEnabled = true
