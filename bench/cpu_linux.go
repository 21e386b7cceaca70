//go:build linux

package bench

import (
	"os"
	"time"
)

// machineCPU is the machine's busy and steal CPU time so far (machineTimes of /proc/stat).
func machineCPU() (busy, steal time.Duration, ok bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	return machineTimes(data)
}
