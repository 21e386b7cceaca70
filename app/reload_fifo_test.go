package app

import (
	"context"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prefixlb/prefixlb/internal/testutil"
	"github.com/prefixlb/prefixlb/proxy"
	"go.uber.org/zap"
)

// A config path that blocks when read (an operator's named pipe, here replacing the file
// after start) never blocks the loop that watches the file and takes the signals: the file
// poll does not read it, and the process still shuts down. Reading it blocked that loop
// for good, so SIGTERM went unheard.
func TestShutdownWhileConfigPathIsAPipe(t *testing.T) {
	be, _ := testutil.StatusBackend(t, 200, "ok")
	f := newReloadFile(t)
	f.write(reloadConf(be.URL))
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan *proxy.Server, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- Run(ctx, cfg, zap.NewNop(), RunOptions{Path: f.path, PollInterval: 10 * time.Millisecond,
			Load: f.load, OnReady: func(s *proxy.Server, _, _ net.Addr) { ready <- s }})
	}()
	testutil.RecvWithin(t, ready, testutil.Timeout, "Run listens")

	if err := os.Remove(f.path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(f.path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	// Unblocks whatever still reads the pipe once the test is over (a writer that opens and
	// closes it gives its readers end of file).
	t.Cleanup(func() {
		if w, err := os.OpenFile(f.path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = w.Close()
		}
	})
	time.Sleep(100 * time.Millisecond) // the point: Run polls the pipe ten times meanwhile and must not block on it
	cancel()
	if err := testutil.RecvWithin(t, done, testutil.Timeout, "Run returns with its config path a named pipe"); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// A config file over maxConfigBytes (a log or a device named by mistake) is refused with an
// error saying so, not read whole: at start, and on reload while the old config serves.
func TestServeRefusesHugeConfig(t *testing.T) {
	be, _ := testutil.StatusBackend(t, 200, "ok")
	f := newReloadFile(t)
	pad := strings.Repeat("# padding\n", maxConfigBytes/10+1)
	f.write(reloadConf(be.URL) + pad)
	err := serveErr(t, testutil.Timeout, "--config", f.path)
	if err == nil || !strings.Contains(err.Error(), "config file over 16 MiB") {
		t.Errorf("serve of a %d-byte config: %v; want it refused as over 16 MiB", len(pad), err)
	}
}
