package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestFlowControlReservesForHigherBand: while a higher band was served lately, a lower band's
// request waits for a replica whose queued prefill has drained under ReservePrefill, though
// the replica has room by count, and is placed when it drains without any request ending (the
// dispatcher wakes at the predicted drain); a request of the higher band goes straight
// through meanwhile.
func TestFlowControlReservesForHigherBand(t *testing.T) {
	a := newEngine(t, 8)
	s, base := startFC(t, 1, func(c *FlowControl) { c.PrefillSaturation = -1 }, a)
	ctx := context.Background()
	hi := map[string]string{"x-test-priority": "5", "x-test-flow": "chat"}
	lo := map[string]string{"x-test-priority": "0", "x-test-flow": "batch"}

	fill := sendChat(ctx, base, "req-fill", lo)
	a.waitArrival(t)
	// About 10k prompt tokens: a second of prefill at the default rate (nothing learned).
	long := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"question req-long ` + strings.Repeat("lorem ipsum dolor sit amet ", 1500) + `"}]}`
	high := sendBody(ctx, base, "req-long", long, hi)
	waitHeld(t, s, 1) // queued: its band is noted
	s.pool.Snapshot()[0].SetMaxConcurrency(8)
	a.finish() // fill ends; the long prompt is placed, its prefill queued at the replica
	if id := a.waitArrival(t); id != "req-long" {
		t.Fatalf("dispatched %s, want req-long", id)
	}
	if r := recvResult(t, fill, "req-fill"); r.status != http.StatusOK {
		t.Fatalf("req-fill: status %d", r.status)
	}

	high2 := sendChat(ctx, base, "req-high2", hi)
	if id := a.waitArrival(t); id != "req-high2" {
		t.Fatalf("arrived %s, want req-high2 straight through", id)
	}
	low := sendChat(ctx, base, "req-low", lo)
	waitHeld(t, s, 1)
	start := time.Now()
	if id := a.waitArrival(t); id != "req-low" {
		t.Fatalf("arrived %s, want req-low once the prefill drained", id)
	}
	if w := time.Since(start); w > 5*time.Second {
		t.Errorf("req-low placed %v after it was held, about a second of prefill ahead of it: the dispatcher did not place it at the drain", w)
	}
	for range 3 {
		a.finish()
	}
	for _, ch := range []<-chan fcResult{high, high2, low} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d", r.id, r.status)
		}
	}
}

// TestFlowControlReserveOff: with ReservePrefill negative, a lower band's request goes
// straight through beside a higher band's queued prefill.
func TestFlowControlReserveOff(t *testing.T) {
	a := newEngine(t, 8)
	s, base := startFC(t, 1, func(c *FlowControl) { c.PrefillSaturation, c.ReservePrefill = -1, -1 }, a)
	ctx := context.Background()
	hi := map[string]string{"x-test-priority": "5", "x-test-flow": "chat"}
	lo := map[string]string{"x-test-priority": "0", "x-test-flow": "batch"}
	fill := sendChat(ctx, base, "req-fill", lo)
	a.waitArrival(t)
	long := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"question req-long ` + strings.Repeat("lorem ipsum dolor sit amet ", 1500) + `"}]}`
	high := sendBody(ctx, base, "req-long", long, hi)
	waitHeld(t, s, 1)
	s.pool.Snapshot()[0].SetMaxConcurrency(8)
	a.finish()
	a.waitArrival(t)
	low := sendChat(ctx, base, "req-low", lo)
	if id := a.waitArrival(t); id != "req-low" {
		t.Fatalf("arrived %s, want req-low", id)
	}
	if n := s.fc.m.queued.Get(); n != 1 {
		t.Errorf("%d requests queued, want 1 (the long prompt only)", n)
	}
	for range 2 {
		a.finish()
	}
	for _, ch := range []<-chan fcResult{fill, high, low} {
		if r := recvResult(t, ch, "a response"); r.status != http.StatusOK {
			t.Errorf("%s: status %d", r.id, r.status)
		}
	}
}
