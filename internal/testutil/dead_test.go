//go:build unix

package testutil

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDeadURLRefuses: a connection to DeadURL's port is refused, and while the test runs the
// port cannot be listened on by anyone else.
func TestDeadURLRefuses(t *testing.T) {
	addr := strings.TrimPrefix(DeadURL(t), "http://")
	for range 3 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			c.Close()
			t.Fatal("a connection to the dead port was accepted")
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial: %v, want connection refused", err)
		}
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatal("the dead port could be listened on while held")
	}
}
