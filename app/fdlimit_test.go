//go:build unix

package app

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"

	"github.com/prefixlb/prefixlb/configs"
	"github.com/prefixlb/prefixlb/internal/testutil"
)

// Run raises the soft open-file limit to the hard limit at start and says so in one line
// with the data path's share of it. The test lowers its own soft limit first (the hard limit
// stays, so nothing is lost) and restores it.
func TestRunRaisesFDLimit(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil || orig.Max < 1024 {
		t.Skipf("RLIMIT_NOFILE %+v %v: too low to lower", orig, err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	low := orig
	low.Cur = 512
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	up, _ := testutil.StatusBackend(t, http.StatusOK, `{}`)
	cfg, err := configs.Parse([]byte("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nhealth:\n  scrape_disabled: true\n" +
		"backends:\n  - url: " + up.URL + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	log, rec := testutil.RecordingLogger()
	startRun(t, cfg, log, RunOptions{})
	var now syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now)
	if now.Cur != orig.Max {
		t.Errorf("soft limit %d after Run started, want the hard limit %d", now.Cur, orig.Max)
	}
	lines := rec.WithMessage(logFDLimit)
	if len(lines) != 1 {
		t.Fatalf("%d %q lines, want 1", len(lines), logFDLimit)
	}
	f := lines[0].Fields
	if fmt.Sprint(f["soft"]) != fmt.Sprint(orig.Max) || fmt.Sprint(f["soft_before"]) != "512" || f["raised"] != true ||
		fmt.Sprint(f["data_path_max"]) == "0" || fmt.Sprint(f["reserve"]) == "0" {
		t.Errorf("line %v, want soft = hard %d, soft_before 512, raised, and the data path's share", f, orig.Max)
	}
}
