//go:build !linux

package pace

import "time"

// pacer is Linux's timerfd pacer (pace_linux.go); elsewhere a Sleeper uses Go timers alone.
type pacer struct{}

// newPacer is nil: no timerfd.
func newPacer() *pacer { return nil }

func (p *pacer) sleep(time.Duration) {}

func (p *pacer) close() {}
