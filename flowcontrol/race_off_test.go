//go:build !race

package flowcontrol

const raceEnabled = false
