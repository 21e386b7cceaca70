//go:build unix

package testutil

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// deadAddr binds a TCP socket to 127.0.0.1 on a free port without listening, closed when the
// test ends: connections to it are refused (RST), and nobody else can bind the port meanwhile.
func deadAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("getsockname: %T", sa)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in.Port))
}
