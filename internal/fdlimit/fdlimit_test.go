//go:build unix

package fdlimit

import (
	"syscall"
	"testing"
)

// Raise takes the soft limit to the hard one. The test lowers its own soft limit first (the
// hard limit stays, so the test process gets it back) and restores it at the end.
func TestRaiseTakesSoftToHard(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Skipf("getrlimit: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	if orig.Max < 128 {
		t.Skipf("hard limit %d too low to lower", orig.Max)
	}
	low := orig
	low.Cur = 64
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatalf("setrlimit: %v", err)
	}
	before, after, err := Raise()
	if err != nil {
		t.Fatalf("Raise: %v", err)
	}
	if before.Soft != 64 || before.Hard != uint64(orig.Max) {
		t.Errorf("before %+v, want soft 64, hard %d", before, orig.Max)
	}
	if after.Soft != uint64(orig.Max) || after.Hard != uint64(orig.Max) {
		t.Errorf("after %+v, want soft = hard = %d", after, orig.Max)
	}
	cur, err := Current()
	if err != nil || cur != after {
		t.Errorf("Current %+v %v, want %+v", cur, err, after)
	}
	// Already at the hard limit: nothing to do, nothing changes.
	b2, a2, err := Raise()
	if err != nil || b2 != after || a2 != after {
		t.Errorf("second Raise: %+v → %+v (%v), want %+v unchanged", b2, a2, err, after)
	}
}
