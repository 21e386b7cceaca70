//go:build linux

package pace

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// pacer sleeps with a timerfd read through the netpoller: the kernel's high-resolution timer
// wakes the poller, not the runtime's millisecond poll timeout (the package doc says why).
type pacer struct {
	fd  int
	f   *os.File
	buf [8]byte
}

// newPacer returns a pacer, or nil where the kernel refuses a timerfd (Go timers alone then).
func newPacer() *pacer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	return &pacer{fd: fd, f: os.NewFile(uintptr(fd), "pace-timerfd")}
}

// sleep waits d (> 0); where the timer cannot be armed or read it sleeps on a Go timer.
func (p *pacer) sleep(d time.Duration) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if unix.TimerfdSettime(p.fd, 0, &spec, nil) != nil {
		time.Sleep(d)
		return
	}
	if _, err := p.f.Read(p.buf[:]); err != nil {
		time.Sleep(d)
	}
}

func (p *pacer) close() {
	if p != nil {
		_ = p.f.Close()
	}
}
