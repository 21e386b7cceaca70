//go:build !linux

package proxy

import "syscall"

// peekScratch is the watchdog's reusable one-byte peek buffer.
type peekScratch struct{ buf [1]byte }

// peerClosed peeks one byte without consuming it: 0 bytes and no error is EOF (the client
// closed); EAGAIN means open and quiet; any other error (reset) means gone. A client that
// sent bytes after its request and then left is not seen here (the peek returns the byte,
// not the EOF behind it); Linux builds poll for POLLRDHUP instead. It uses Control, not
// Read: Read honours the connection's read deadline, which fasthttp leaves set while the
// response streams.
func peerClosed(rc syscall.RawConn, ps *peekScratch) bool {
	closed := false
	err := rc.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), ps.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || (err != nil && err != syscall.EAGAIN && err != syscall.EINTR)
	})
	return closed || err != nil
}
