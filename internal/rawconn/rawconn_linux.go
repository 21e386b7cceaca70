//go:build linux

package rawconn

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// Conn is a TCP connection whose Read, Write and WriteVector are raw non-blocking system
// calls run through its syscall.RawConn. Every other method is the TCPConn's. Like a
// net.Conn, it allows one Read and one Write (or WriteVector) at a time, concurrently with
// each other and with Close and the deadline setters.
type Conn struct {
	*net.TCPConn
	rc     syscall.RawConn
	rd, wr op
}

// op is the state of one read or write in progress: the buffers, the progress and the
// errno; fn is the bound callback handed to the RawConn, made once so that no call
// allocates.
type op struct {
	bufs  [2][]byte // read: bufs[0]; write: what is still to be written, in order
	iov   [2]syscall.Iovec
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// Wrap returns c as a *Conn when it is a *net.TCPConn, else c itself.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	w := &Conn{TCPConn: tc, rc: rc}
	w.rd.fn = w.rd.read
	w.wr.fn = w.wr.write
	return w
}

// Read reads up to len(p) bytes; 0 bytes read is io.EOF.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	o := &c.rd
	o.bufs[0], o.n, o.errno = p, 0, 0
	err := c.rc.Read(o.fn)
	o.bufs[0] = nil
	switch {
	case err != nil:
		return 0, opError("read", c, err)
	case o.errno != 0:
		return 0, opError("read", c, o.errno)
	case o.n == 0:
		return 0, io.EOF
	}
	return o.n, nil
}

func (o *op) read(fd uintptr) bool {
	p := o.bufs[0]
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			o.n = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // wait in the netpoller, then call again
		default:
			o.errno = e
			return true
		}
	}
}

// Write writes all of p unless an error (or a deadline) stops it.
func (c *Conn) Write(p []byte) (int, error) {
	return c.WriteVector(p, nil)
}

// WriteVector writes a then b with writev: one system call for both when the socket
// buffer has room.
func (c *Conn) WriteVector(a, b []byte) (int, error) {
	if len(a)+len(b) == 0 {
		return 0, nil
	}
	o := &c.wr
	o.bufs, o.n, o.errno = [2][]byte{a, b}, 0, 0
	err := c.rc.Write(o.fn)
	o.bufs, o.iov = [2][]byte{}, [2]syscall.Iovec{}
	switch {
	case err != nil:
		return o.n, opError("write", c, err)
	case o.errno != 0:
		return o.n, opError("write", c, o.errno)
	}
	return o.n, nil
}

func (o *op) write(fd uintptr) bool {
	for {
		k := 0
		for _, p := range o.bufs {
			if len(p) > 0 {
				o.iov[k] = syscall.Iovec{Base: &p[0]}
				o.iov[k].SetLen(len(p))
				k++
			}
		}
		if k == 0 {
			return true
		}
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&o.iov[0])), uintptr(k))
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // socket buffer full: wait in the netpoller for room
		default:
			o.errno = e
			return true
		}
		o.n += int(n)
		for i := range o.bufs {
			d := min(len(o.bufs[i]), int(n))
			o.bufs[i] = o.bufs[i][d:]
			n -= uintptr(d)
		}
	}
}
