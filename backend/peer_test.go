package backend

import "testing"

// TestNotifyLoad: every change of the own load (Begin, the first byte or a refusal, a
// Release) signals NotifyLoad's channel once, what changes nothing does not, a full channel
// does not block the request, and nil stops it. The steps run in order on one lease.
func TestNotifyLoad(t *testing.T) {
	b, err := New("http://127.0.0.1:1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := make(chan struct{}, 1)
	b.NotifyLoad(c)
	var l Lease
	for _, tc := range []struct {
		name string
		step func()
		want bool
	}{
		{"begin", func() { l.Begin(b, 100, 200, true) }, true},
		{"first byte", l.FirstByte, true},
		{"first byte again", l.FirstByte, false},
		{"release", l.Release, true},
		{"release again", l.Release, false},
		{"begin, not streamed", func() { l.Begin(b, 100, 200, false) }, true},
		{"refused", l.Refused, true},
		{"its release", l.Release, true},
		{"begin, then cancelled", func() { l.Begin(b, 100, 200, true) }, true},
		{"release before the first byte", l.Release, true},
		{"two begins, the channel full", func() {
			var l2 Lease
			l.Begin(b, 1, 1, true)
			l2.Begin(b, 1, 1, true) // must not block
			l2.Release()
		}, true},
		{"stopped", func() { b.NotifyLoad(nil); l.Release() }, false},
	} {
		tc.step()
		got := false
		select {
		case <-c:
			got = true
		default:
		}
		if got != tc.want {
			t.Errorf("%s: signalled %v, want %v", tc.name, got, tc.want)
		}
	}
	if b.InFlight() != 0 || b.PrefillTokens() != 0 {
		t.Fatalf("in flight %d, prefill %d after every lease ended; want 0, 0", b.InFlight(), b.PrefillTokens())
	}
}
