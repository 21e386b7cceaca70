package pace

import (
	"testing"
	"time"
)

// TestUntil: Until returns true no earlier than the instant it was given, with the
// timerfd and without, for waits shorter and longer than preciseBelow, and false once
// quit is closed (a Close during a long step ends the engine without waiting the step out).
func TestUntil(t *testing.T) {
	for _, tc := range []struct {
		name    string
		precise bool
		wait    time.Duration
	}{
		{"past, precise", true, -time.Millisecond},
		{"short, precise", true, 300 * time.Microsecond},
		{"long, precise", true, preciseBelow + 3*time.Millisecond},
		{"short, Go timer", false, 300 * time.Microsecond},
		{"long, Go timer", false, preciseBelow + 3*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			defer s.Close()
			switch {
			case !tc.precise:
				s.p.close()
				s.p = nil
			case s.p == nil:
				t.Skip("no timerfd on this system: Go timers alone")
			}
			for range 20 {
				at := time.Now().Add(tc.wait)
				if !s.Until(at, make(chan struct{})) {
					t.Fatal("Until returned false without quit")
				}
				if now := time.Now(); now.Before(at) {
					t.Fatalf("returned %v before the instant", at.Sub(now))
				}
			}
		})
	}
	t.Run("quit", func(t *testing.T) {
		s := New()
		defer s.Close()
		quit := make(chan struct{})
		close(quit)
		if s.Until(time.Now().Add(time.Hour), quit) {
			t.Fatal("Until returned true with quit closed")
		}
		if s.Until(time.Now().Add(-time.Second), quit) {
			t.Fatal("a step due in the past returned true with quit closed")
		}
	})
}
