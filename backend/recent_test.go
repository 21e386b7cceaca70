package backend

import (
	"math"
	"testing"
)

func TestRecentCount(t *testing.T) {
	tests := []struct {
		name string
		adds []uint64 // ticks of Add
		now  uint64
		want float64
	}{
		{"zero value", nil, 10, 0},
		{"one event now", []uint64{5}, 5, 1},
		{"one half-life ago", []uint64{0}, 128, 0.5},
		{"two half-lives ago", []uint64{0}, 256, 0.25},
		{"two events apart", []uint64{0, 128}, 128, 1.5},
		{"read before the last add", []uint64{0, 128}, 64, 1.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r RecentCount
			for _, at := range tt.adds {
				r.Add(at, 128)
			}
			if got := r.Value(tt.now, 128); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Value(%d) = %v, want %v", tt.now, got, tt.want)
			}
		})
	}
}
