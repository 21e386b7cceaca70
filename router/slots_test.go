package router

import (
	"math"
	"testing"
)

func TestRecentSum(t *testing.T) {
	type add struct {
		at uint64
		w  float64
	}
	tests := []struct {
		name string
		adds []add
		now  uint64
		want float64
	}{
		{"zero value", nil, 10, 0},
		{"one event now", []add{{5, 1}}, 5, 1},
		{"one half-life ago", []add{{0, 1}}, 128, 0.5},
		{"two half-lives ago", []add{{0, 1}}, 256, 0.25},
		{"two events apart", []add{{0, 1}, {128, 1}}, 128, 1.5},
		{"read before the last add", []add{{0, 1}, {128, 1}}, 64, 1.5},
		{"weighted", []add{{0, 4000}, {128, 10}}, 128, 2010},
		{"a negative weight counts 0", []add{{0, 2}, {128, -5}}, 128, 1},
		{"an add behind the clock is not decayed again", []add{{128, 1}, {0, 1}}, 128, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r recentSum
			for _, a := range tt.adds {
				r.Add(a.at, 128, a.w)
			}
			if got := r.Value(tt.now, 128); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Value(%d) = %v, want %v", tt.now, got, tt.want)
			}
		})
	}
}
