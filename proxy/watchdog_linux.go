//go:build linux

package proxy

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// pollRDHUP is POLLRDHUP of linux/poll.h (golang.org/x/sys/unix does not define it for
// Linux): the peer shut its side down (a FIN arrived), reported even while bytes it sent
// before are still unread.
const pollRDHUP = 0x2000

// peekScratch is the watchdog's reusable poll argument, so that a check allocates nothing.
type peekScratch struct {
	fds [1]unix.PollFd
	ts  unix.Timespec // zero: poll returns at once
}

// peerClosed reports whether the client has gone: its FIN arrived (POLLRDHUP), or the
// socket has an error or was reset (POLLERR, POLLHUP), or it is no longer valid. Unlike a
// recv(MSG_PEEK), which returns the first unread byte rather than the EOF behind it, this
// also sees a client that sent anything after its request (a pipelined request, the CRLF
// RFC 9112 §2.2 allows after a body) and then left. It uses Control, not Read: Read
// honours the connection's read deadline, and fasthttp leaves the request's client_read
// deadline set while the response streams, so past it every check would fail and every
// stream longer than client_read would be cut as a disconnect.
func peerClosed(rc syscall.RawConn, ps *peekScratch) bool {
	closed := false
	err := rc.Control(func(fd uintptr) {
		ps.fds[0] = unix.PollFd{Fd: int32(fd), Events: pollRDHUP}
		for {
			n, err := unix.Ppoll(ps.fds[:], &ps.ts, nil)
			if err == unix.EINTR {
				continue
			}
			closed = err == nil && n > 0 && ps.fds[0].Revents&(pollRDHUP|unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0
			return
		}
	})
	return closed || err != nil
}
