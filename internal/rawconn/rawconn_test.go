package rawconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
)

// waitLimit bounds every wait in these tests: a blocked Read or Write fails the test with a
// deadline error instead of hanging the package.
const waitLimit = 30 * time.Second

// pair returns a wrapped client connection and the server side of a loopback TCP pair, both
// with a waitLimit deadline (a test may set its own).
func pair(t *testing.T) (net.Conn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var s net.Conn
	select {
	case s = <-acc:
	case <-time.After(waitLimit):
		t.Fatal("accept did not return")
	}
	if s == nil {
		t.Fatal("accept failed")
	}
	w := Wrap(c)
	deadline := time.Now().Add(waitLimit)
	if err := errors.Join(w.SetDeadline(deadline), s.SetDeadline(deadline)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); s.Close() })
	return w, s.(*net.TCPConn)
}

func TestWrapIsRawOnLinux(t *testing.T) {
	c, _ := pair(t)
	_, raw := c.(*Conn)
	if raw != (runtime.GOOS == "linux") {
		t.Fatalf("Wrap returned %T on %s", c, runtime.GOOS)
	}
	if _, ok := c.(interface {
		SyscallConn() (syscall.RawConn, error)
	}); !ok {
		t.Fatal("wrapped connection lost SyscallConn (the proxy's disconnect watchdog needs it)")
	}
}

func TestReadWrite(t *testing.T) {
	for _, tt := range []struct {
		name string
		a, b int // WriteVector sizes
	}{
		{"small", 10, 0},
		{"header and body", 300, 16 << 10},
		{"empty first", 0, 100},
		// Larger than the socket buffers: writev returns short and EAGAIN, the goroutine
		// waits in the netpoller while the peer drains.
		{"8 MiB", 4 << 20, 4 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, s := pair(t)
			a, b := bytes.Repeat([]byte("a"), tt.a), bytes.Repeat([]byte("b"), tt.b)
			got := make(chan []byte, 1)
			go func() {
				buf := make([]byte, tt.a+tt.b)
				n, _ := io.ReadFull(s, buf)
				got <- buf[:n]
			}()
			n, err := WriteVector(c, a, b)
			if err != nil || n != tt.a+tt.b {
				t.Fatalf("WriteVector = %d, %v; want %d, nil", n, err, tt.a+tt.b)
			}
			select {
			case g := <-got:
				if !bytes.Equal(g, append(a, b...)) {
					t.Fatalf("peer read %d bytes, not what was written", len(g))
				}
			case <-time.After(waitLimit):
				t.Fatal("peer did not finish reading")
			}
			// And back, through Read, in whatever pieces the socket hands over.
			go func() { _, _ = s.Write(append(b, a...)) }()
			back := make([]byte, tt.a+tt.b)
			if _, err := io.ReadFull(c, back); err != nil {
				t.Fatalf("Read: %v", err)
			}
			if !bytes.Equal(back, append(b, a...)) {
				t.Fatal("read back different bytes")
			}
		})
	}
}

func TestErrors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(c net.Conn, s *net.TCPConn)
		do    func(c net.Conn) error
		check func(error) bool
		op    string
	}{
		{
			name:  "read deadline",
			setup: func(c net.Conn, _ *net.TCPConn) { _ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)) },
			do:    func(c net.Conn) error { _, err := c.Read(make([]byte, 10)); return err },
			check: func(err error) bool {
				var ne net.Error
				return errors.Is(err, os.ErrDeadlineExceeded) && errors.As(err, &ne) && ne.Timeout()
			},
			op: "read",
		},
		{
			name:  "peer closed: EOF",
			setup: func(_ net.Conn, s *net.TCPConn) { s.Close() },
			do:    func(c net.Conn) error { _, err := c.Read(make([]byte, 10)); return err },
			check: func(err error) bool { return err == io.EOF },
		},
		{
			name: "peer reset: ECONNRESET or EPIPE on write",
			setup: func(_ net.Conn, s *net.TCPConn) {
				_ = s.SetLinger(0) // close with RST
				s.Close()
			},
			do: func(c net.Conn) error {
				// The first write may go out before the RST is back; write until one fails.
				var err error
				testutil.Poll(waitLimit, time.Millisecond, func() bool {
					_, err = c.Write([]byte("x"))
					return err != nil
				})
				return err
			},
			check: func(err error) bool {
				return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
			},
			op: "write",
		},
		{
			name:  "closed locally",
			setup: func(c net.Conn, _ *net.TCPConn) { c.Close() },
			do:    func(c net.Conn) error { _, err := c.Write([]byte("x")); return err },
			check: func(err error) bool { return errors.Is(err, net.ErrClosed) },
			op:    "write",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, s := pair(t)
			tt.setup(c, s)
			err := tt.do(c)
			if err == nil || !tt.check(err) {
				t.Fatalf("error %v (%T) is not the expected one", err, err)
			}
			var oe *net.OpError
			if tt.op != "" && (!errors.As(err, &oe) || oe.Op != tt.op) {
				t.Errorf("error %v does not name op %q", err, tt.op)
			}
		})
	}
}

// A Read parked in the netpoller returns when another goroutine closes the connection,
// as the proxy's watchdog does when the client leaves. The close comes only once the reading
// goroutine is seen parked ("IO wait"), so the test exercises a parked Read, not a Read of
// an already closed connection.
func TestCloseUnblocksRead(t *testing.T) {
	c, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		done <- err
	}()
	if !testutil.Poll(waitLimit, time.Millisecond, func() bool { return parkedReading("TestCloseUnblocksRead.func") }) {
		t.Fatalf("the reading goroutine never parked in the netpoller within %v", waitLimit)
	}
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read did not return after Close")
	}
}

// parkedReading reports whether a goroutine started by the function fn (a name fragment such
// as "TestX.func") is blocked in the netpoller ([IO wait]) inside a Read.
func parkedReading(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(header, "[IO wait") && strings.Contains(g, ").Read(") && strings.Contains(g, fn) {
			return true
		}
	}
	return false
}

func BenchmarkRoundTrip(b *testing.B) {
	for _, raw := range []bool{false, true} {
		name := "net.Conn"
		if raw {
			name = "rawconn"
		}
		b.Run(name, func(b *testing.B) {
			ln, _ := net.Listen("tcp", "127.0.0.1:0")
			defer ln.Close()
			go func() {
				s, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = io.Copy(s, s) // echo
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if raw {
				c = Wrap(c)
			}
			msg, buf := make([]byte, 1024), make([]byte, 1024)
			b.ReportAllocs()
			b.SetBytes(int64(len(msg)))
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
