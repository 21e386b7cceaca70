package backend

import (
	"fmt"
	"slices"
	"testing"
)

// Panic mode (fewer than half healthy: route to all) covers only backends that passed an
// active check once. A replica that never passed (scale-up, still loading its weights) is
// outside both the panic set and its count, as Envoy's ignore_new_hosts_until_first_hc.
func TestHealthyPanicIgnoresNeverPassed(t *testing.T) {
	const (
		up    = "up"    // passed, healthy
		down  = "down"  // passed once, now unhealthy
		fresh = "fresh" // never passed
	)
	cases := []struct {
		name      string
		states    []string
		want      []int // indexes of the returned backends
		wantPanic bool
	}{
		{"all up", []string{up, up, up}, []int{0, 1, 2}, false},
		{"scale-up: 1 up, 2 never passed", []string{up, fresh, fresh}, []int{0}, false},
		{"scale-up: 1 up, 5 never passed", []string{fresh, fresh, up, fresh, fresh, fresh}, []int{2}, false},
		{"all never passed: nothing to route to", []string{fresh, fresh}, nil, false},
		{"panic: 1 up, 2 passed then failed", []string{up, down, down}, []int{0, 1, 2}, true},
		{"panic over the passed ones only", []string{up, down, down, fresh}, []int{0, 1, 2}, true},
		{"half up is not panic", []string{up, down, fresh, fresh}, []int{0}, false},
		{"all down: panic", []string{down, down, fresh}, []int{0, 1}, true},
		{"no backends", nil, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bs := make([]*Backend, len(c.states))
			for i, st := range c.states {
				b, err := New(fmt.Sprintf("http://b%d:8000", i), 0, 1)
				if err != nil {
					t.Fatal(err)
				}
				switch st {
				case down:
					b.SetHealthy(false)
				case fresh:
					b.SetHealthy(false)
					b.SetNeverPassed(true)
				}
				bs[i] = b
			}
			var want []*Backend
			for _, i := range c.want {
				want = append(want, bs[i])
			}
			got, panicMode := Healthy(make([]*Backend, 0, 8), bs)
			if !slices.Equal(got, want) || panicMode != c.wantPanic {
				t.Errorf("Healthy(%v) = %s, panic %v; want %s, panic %v", c.states, names(got), panicMode, names(want), c.wantPanic)
			}
		})
	}
}

func names(bs []*Backend) []string {
	out := make([]string, 0, len(bs))
	for _, b := range bs {
		out = append(out, b.Name)
	}
	return out
}
