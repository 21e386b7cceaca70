// Package rawconn wraps TCP connections so that their reads and writes are issued as raw
// non-blocking system calls inside Go's netpoller, on Linux.
//
// Why: a net.Conn Read or Write enters the Go runtime's syscall state. Leaving that state
// wakes the runtime's monitor thread (sysmon) from its deep sleep and resets it to a 20 µs
// tick, and a call that lasts longer than one tick (a 16 KB write on loopback delivers the
// data to the reader inside the same call) gets its P handed to another thread. A proxy at a
// moderate request rate pays that on every request (`perf record -e sched:sched_switch` on
// prefixlb relaying 16 KB requests one at a time shows sysmon's wake-ups among its context
// switches). Sockets in the netpoller are non-blocking, so these calls return at once;
// EAGAIN parks the goroutine in the netpoller exactly as net.Conn does, with the same
// deadlines.
//
// Elsewhere than Linux, Wrap returns the connection unchanged.
package rawconn

import (
	"errors"
	"net"
	"os"
)

// VectorWriter writes several buffers with one system call (writev), in order, as if they
// were concatenated. It returns the bytes written and the first error.
type VectorWriter interface {
	WriteVector(a, b []byte) (int, error)
}

// WriteVector writes a then b to c: one writev when c is a wrapped connection, else two
// writes.
func WriteVector(c net.Conn, a, b []byte) (int, error) {
	if vw, ok := c.(VectorWriter); ok {
		return vw.WriteVector(a, b)
	}
	n, err := c.Write(a)
	if err != nil {
		return n, err
	}
	m, err := c.Write(b)
	return n + m, err
}

// opError names the operation the way net.Conn does ("read", "write"), not "raw-read".
func opError(op string, c net.Conn, err error) error {
	if err == nil {
		return nil
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		e := *oe
		e.Op = op
		return &e
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, err)}
}
