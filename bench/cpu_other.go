//go:build !unix

package bench

import "time"

// processCPU is unknown here: 0, and the CPU check is skipped.
func processCPU() time.Duration { return 0 }
